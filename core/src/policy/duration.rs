//! Duration literals of the policy DSL: `500`, `500ms`, `5s`, `1m`, `2h`, `1d`.
//!
//! Every duration in a policy is a whole number of milliseconds that fits in a
//! `u64`. Keeping to that grid is what lets [`DurationLit`] print any policy
//! duration exactly, so that the canonical text of a policy parses back to the
//! same policy.

use std::fmt;
use std::time::Duration;

pub(crate) use crate::time::unit_millis;

/// The duration as whole milliseconds, or `None` when it has a sub-millisecond
/// part or does not fit in a `u64` of milliseconds.
pub(crate) fn whole_millis(duration: Duration) -> Option<u64> {
    if !duration.subsec_nanos().is_multiple_of(1_000_000) {
        return None;
    }
    u64::try_from(duration.as_millis()).ok()
}

/// Milliseconds of a duration already known to be on the millisecond grid,
/// saturating rather than failing for anything larger.
pub(crate) fn millis(duration: Duration) -> u64 {
    crate::time::duration_ms(duration)
}

/// Displays a millisecond count in the largest unit that divides it exactly
/// (`90000` → `90s`, `3600000` → `1h`, `0` → `0ms`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DurationLit(pub(crate) u64);

impl DurationLit {
    /// Wraps a duration that is on the millisecond grid.
    pub(crate) fn of(duration: Duration) -> Self {
        Self(millis(duration))
    }
}

impl fmt::Display for DurationLit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::time::write_millis(f, self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_in_the_largest_exact_unit() {
        let cases = [
            (0, "0ms"),
            (1, "1ms"),
            (1_500, "1500ms"),
            (5_000, "5s"),
            (90_000, "90s"),
            (120_000, "2m"),
            (3_600_000, "1h"),
            (5_400_000, "90m"),
            (86_400_000, "1d"),
            (172_800_000, "2d"),
        ];
        for (ms, text) in cases {
            assert_eq!(DurationLit(ms).to_string(), text);
        }
    }

    #[test]
    fn units_and_grid() {
        assert_eq!(unit_millis(""), Some(1));
        assert_eq!(unit_millis("ms"), Some(1));
        assert_eq!(unit_millis("d"), Some(86_400_000));
        assert_eq!(unit_millis("sec"), None);
        assert_eq!(whole_millis(Duration::from_millis(7)), Some(7));
        assert_eq!(whole_millis(Duration::from_micros(7_001)), None);
        assert_eq!(whole_millis(Duration::MAX), None);
    }
}
