//! When receive errors stop a consumer: permanent errors counted in a row, and the limit they must
//! reach — in number and in time — before the consumer gives up.
//!
//! Separate from the loop because it is a rule of its own, with a setting of its own
//! ([`ConsumerBuilder::give_up_receiving_after`](crate::runtime::ConsumerBuilder::give_up_receiving_after)),
//! that the loop only consults.

use std::time::{Duration, Instant};

use crate::runtime::builder::GiveUp;

/// Counts permanent receive errors in a row ([`Error::is_temporary`](crate::error::Error::is_temporary)
/// false) and tells when they are enough to stop: retrying refused credentials or a deleted queue for
/// ever only hides the fault, while a stopped consumer's handle says what is wrong.
#[derive(Debug)]
pub(super) struct PermanentErrors {
    limit: GiveUp,
    run: Option<(u32, Instant)>,
}

impl PermanentErrors {
    pub(super) fn new(limit: GiveUp) -> Self {
        Self { limit, run: None }
    }

    /// A delivery or a temporary error: the run of permanent errors is over.
    pub(super) fn reset(&mut self) {
        self.run = None;
    }

    /// A permanent error at `now`: `Some((failures, over))` once the run is long enough to stop.
    pub(super) fn failed(&mut self, now: Instant) -> Option<(u32, Duration)> {
        let (failures, first) = self.run.get_or_insert((0, now));
        *failures += 1;
        let over = now.saturating_duration_since(*first);
        (*failures >= self.limit.failures && over >= self.limit.over).then_some((*failures, over))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permanent_errors_stop_only_when_enough_over_long_enough() {
        let mut permanent = PermanentErrors::new(GiveUp {
            failures: 3,
            over: Duration::from_secs(10),
        });
        let t0 = Instant::now();
        assert_eq!(permanent.failed(t0), None);
        assert_eq!(permanent.failed(t0 + Duration::from_secs(1)), None);
        // Three failures, but within 10 s.
        assert_eq!(permanent.failed(t0 + Duration::from_secs(2)), None);
        assert_eq!(
            permanent.failed(t0 + Duration::from_secs(10)),
            Some((4, Duration::from_secs(10)))
        );
        permanent.reset();
        assert_eq!(permanent.failed(t0 + Duration::from_secs(30)), None);
    }
}
