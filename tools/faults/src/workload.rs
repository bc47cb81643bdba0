//! The workload every fault run uses: events with unique ids whose fate is fixed by their index.
//!
//! Fixing each event's fate by its index (not by chance) is what lets a run be counted afterwards: the
//! harness knows, for every id, how many handler calls it should take and whether it must end in the DLQ,
//! so anything else — an id that ended nowhere, an extra call, a second DLQ entry — is a finding.

use std::time::Duration;

/// What the handler does with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Succeeds at once (89 % of events).
    Succeed,
    /// Fails once with a deferred error (retried through the broker after 1 s), then succeeds (10 %).
    FailOnce,
    /// Fails with a non-retryable error: the DLQ at once (1 %).
    NonRetryable,
}

impl Fate {
    /// The fate of the event at `index`.
    pub(crate) fn of(index: usize) -> Self {
        if index % 100 == 7 {
            Fate::NonRetryable
        } else if index % 10 == 3 {
            Fate::FailOnce
        } else {
            Fate::Succeed
        }
    }

    /// Handler calls the event takes when nothing goes wrong.
    pub(crate) fn expected_calls(self) -> u32 {
        match self {
            Fate::Succeed | Fate::NonRetryable => 1,
            Fate::FailOnce => 2,
        }
    }
}

/// How long a failed event waits before it comes back, unless a run says otherwise.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The retry policy of a run whose failed events come back after `after`: five retries leave room for
/// an event that a crash made fail a second time.
pub(crate) fn policy(after: Duration) -> String {
    format!("{}ms x5", after.as_millis())
}

/// How long the handler works on each event, so that a run of 10,000 events lasts long enough for a
/// fault to land mid-stream.
pub(crate) const DEFAULT_WORK: Duration = Duration::from_millis(10);

/// The id (and payload) of the event at `index`.
pub(crate) fn event_id(index: usize) -> String {
    format!("ev-{index:05}")
}

/// The index of the event whose id (or payload) is `id`.
pub(crate) fn index_of(id: &str) -> Option<usize> {
    id.strip_prefix("ev-")?.parse().ok()
}

/// The key of the event at `index`: 64 keys, so every partition of a keyed broker gets work.
pub(crate) fn key(index: usize) -> String {
    format!("k-{:02}", index % 64)
}

/// How many events of `total` must end in the DLQ.
pub(crate) fn dlq_expected(total: usize) -> usize {
    (0..total)
        .filter(|&i| Fate::of(i) == Fate::NonRetryable)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_spells_the_wait() {
        assert_eq!(policy(RETRY_AFTER), "1000ms x5");
        assert_eq!(policy(Duration::from_secs(20)), "20000ms x5");
    }

    #[test]
    fn fates_split_ten_thousand_as_designed() {
        let count = |f: Fate| (0..10_000).filter(|&i| Fate::of(i) == f).count();
        assert_eq!(count(Fate::NonRetryable), 100);
        assert_eq!(count(Fate::FailOnce), 1_000);
        assert_eq!(count(Fate::Succeed), 8_900);
        assert_eq!(dlq_expected(10_000), 100);
    }

    #[test]
    fn ids_round_trip() {
        assert_eq!(event_id(42), "ev-00042");
        assert_eq!(index_of("ev-00042"), Some(42));
        assert_eq!(index_of("other"), None);
    }
}
