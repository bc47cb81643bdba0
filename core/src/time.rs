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

    /// This time plus `d` rounded up to whole milliseconds, saturating: a due time `now.plus(delay)`
    /// is never before `now` and the whole delay.
    pub fn plus(self, d: Duration) -> Self {
        let ms = u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(ms))
    }

    /// This time minus `d`, saturating at the epoch.
    pub fn minus(self, d: Duration) -> Self {
        Self(self.0.saturating_sub(duration_ms(d)))
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

/// The duration units of the policy DSL and of settings, largest first, with their length in
/// milliseconds. Formatting walks the table in order and picks the first unit that divides the value
/// exactly; `ms` (1) always does.
pub(crate) const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// The length in milliseconds of a unit suffix; the empty suffix means milliseconds.
pub(crate) fn unit_millis(unit: &str) -> Option<u64> {
    if unit.is_empty() {
        return Some(1);
    }
    UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|&(_, millis)| millis)
}

/// Writes a millisecond count in the largest unit that divides it exactly (`90000` → `90s`,
/// `3600000` → `1h`, `0` → `0ms`).
pub(crate) fn write_millis(f: &mut fmt::Formatter<'_>, ms: u64) -> fmt::Result {
    let (name, size) = UNITS
        .iter()
        .copied()
        .find(|&(_, size)| ms != 0 && ms.is_multiple_of(size))
        .unwrap_or(("ms", 1));
    write!(f, "{}{}", ms / size, name)
}

/// Formats a duration in the policy DSL's notation, with the largest unit that divides it exactly
/// (`90s`, `2m`, `1500ms`).
pub fn format_duration(d: Duration) -> String {
    struct Millis(u64);
    impl fmt::Display for Millis {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write_millis(f, self.0)
        }
    }
    Millis(duration_ms(d)).to_string()
}

/// Parses one duration the way settings write it: a whole number with an optional unit (`250ms`, `5s`,
/// `2m`, `1h`, `1d`; a bare number is milliseconds); `None` for anything else.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if digits == 0 {
        return None;
    }
    let value: u64 = text[..digits].parse().ok()?;
    let unit = unit_millis(text[digits..].trim())?;
    value.checked_mul(unit).map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_millis(1_000);
        assert_eq!(t.plus(Duration::from_millis(500)).as_millis(), 1_500);
        assert_eq!(t.plus(Duration::from_micros(500_001)).as_millis(), 1_501);
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
    fn durations_format_and_parse() {
        assert_eq!(format_duration(Duration::from_millis(90_000)), "90s");
        assert_eq!(format_duration(Duration::from_millis(1_500)), "1500ms");
        assert_eq!(format_duration(Duration::ZERO), "0ms");
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration(" 2 m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("40"), Some(Duration::from_millis(40)));
        assert_eq!(parse_duration("1d"), Some(Duration::from_secs(86_400)));
        for bad in ["", "ms", "1.5s", "5 sec", "-1s", "99999999999999999999d"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn system_time_round_trip() {
        let t = Timestamp::from_millis(1_700_000_000_123);
        assert_eq!(Timestamp::from_system_time(t.to_system_time()), t);
    }
}
