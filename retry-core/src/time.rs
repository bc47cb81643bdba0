//! Wall-clock timestamps in whole milliseconds since the Unix epoch.
//!
//! Metadata crosses processes and brokers, so due times and first-seen times are wall-clock values; whole
//! milliseconds are what every broker's headers can carry exactly and what the lateness metric needs.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time, in milliseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }

    /// A timestamp from milliseconds since the epoch.
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// Converts a `SystemTime` (times before the epoch become the epoch).
    pub fn from_system_time(t: SystemTime) -> Self {
        let ms = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
        Self(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    /// Converts to a `SystemTime`.
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.0)
    }

    /// This time plus `d`, saturating.
    pub fn plus(self, d: Duration) -> Self {
        Self(self.0.saturating_add(duration_ms(d)))
    }

    /// How long after `earlier` this is (zero if it is not after).
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A duration in whole milliseconds, saturating at `u64::MAX`.
pub fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Formats a duration in the policy DSL's notation, with the largest unit that divides it exactly
/// (`90s`, `2m`, `1500ms`).
pub fn format_duration(d: Duration) -> String {
    crate::policy::duration::DurationLit::of(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_millis(1_000);
        assert_eq!(t.plus(Duration::from_millis(500)).as_millis(), 1_500);
        assert_eq!(
            t.since(Timestamp::from_millis(400)),
            Duration::from_millis(600)
        );
        assert_eq!(t.since(Timestamp::from_millis(4_000)), Duration::ZERO);
        assert_eq!(
            Timestamp::from_millis(u64::MAX)
                .plus(Duration::MAX)
                .as_millis(),
            u64::MAX
        );
    }

    #[test]
    fn system_time_round_trip() {
        let t = Timestamp::from_millis(1_700_000_000_123);
        assert_eq!(Timestamp::from_system_time(t.to_system_time()), t);
    }
}
