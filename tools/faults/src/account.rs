//! Counting a run: where each event ended against where its fate says it must end.
//!
//! An event reached its end only if it ended where its fate sends it: a succeeding or failing-once event
//! with a successful handler call, a non-retryable one in the DLQ. A DLQ entry is not a pass for an event
//! that should have succeeded — a run that dead-letters healthy events has lost them to the operator as
//! surely as one that drops them — so such events are counted apart (`misrouted`) and fail the row.

use std::collections::HashMap;

use crate::record::Tally;
use crate::workload::{self, Fate};

/// What the handler's record and the DLQ say about every event of a run.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Accounting {
    /// Events that ended where their fate sends them.
    pub(crate) handled: usize,
    /// Events that ended nowhere: no successful call and no DLQ entry.
    pub(crate) lost: Vec<String>,
    /// Events in the DLQ whose fate is to succeed (dead-lettered by mistake).
    pub(crate) misrouted: Vec<String>,
    /// Non-retryable events that are not in the DLQ although a handler call refused them.
    pub(crate) refused_not_in_dlq: Vec<String>,
    /// Events produced after the fault (index ≥ `events`) that ended nowhere.
    pub(crate) probes_missing: usize,
    /// Handler calls beyond each event's expected number.
    pub(crate) extra_calls: usize,
    /// DLQ entries beyond one per event.
    pub(crate) extra_dlq: usize,
    /// Distinct events the DLQ holds.
    pub(crate) dlq_distinct: usize,
}

/// Counts the `total` events of a run (the first `events` before the fault, the rest after it) from the
/// handler's record and the payloads the DLQ holds (one per entry).
pub(crate) fn account(
    total: usize,
    events: usize,
    tally: &Tally,
    dlq_payloads: &[String],
) -> Accounting {
    let mut dlq_counts: HashMap<&str, usize> = HashMap::new();
    for p in dlq_payloads {
        *dlq_counts.entry(p.as_str()).or_default() += 1;
    }
    let mut a = Accounting {
        extra_dlq: dlq_payloads.len() - dlq_counts.len(),
        dlq_distinct: dlq_counts.len(),
        ..Accounting::default()
    };
    for i in 0..total {
        let id = workload::event_id(i);
        let fate = Fate::of(i);
        let calls = tally.by_id.get(&id).copied().unwrap_or_default();
        let in_dlq = dlq_counts.contains_key(id.as_str());
        let succeeded = calls.oks > 0;
        let at_its_end = match fate {
            Fate::Succeed | Fate::FailOnce => succeeded,
            Fate::NonRetryable => in_dlq,
        };
        if fate != Fate::NonRetryable && in_dlq {
            a.misrouted.push(id.clone());
        }
        if at_its_end {
            a.handled += 1;
        } else if !succeeded && !in_dlq {
            if i >= events {
                a.probes_missing += 1;
            }
            if fate == Fate::NonRetryable && calls.refusals > 0 {
                a.refused_not_in_dlq.push(id.clone());
            }
            a.lost.push(id);
        }
        a.extra_calls += calls.calls.saturating_sub(fate.expected_calls()) as usize;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Calls;

    fn tally(calls: &[(usize, u32, u32)]) -> Tally {
        let mut t = Tally::default();
        for &(i, n, oks) in calls {
            t.by_id.insert(
                workload::event_id(i),
                Calls {
                    calls: n,
                    oks,
                    refusals: if Fate::of(i) == Fate::NonRetryable {
                        n - oks
                    } else {
                        0
                    },
                    first_at: 0,
                },
            );
        }
        t
    }

    /// Events 0..10 (event 7 non-retryable, event 3 failing once) all where they belong.
    fn healthy() -> (Tally, Vec<String>) {
        let calls: Vec<(usize, u32, u32)> = (0..10)
            .map(|i| match Fate::of(i) {
                Fate::Succeed => (i, 1, 1),
                Fate::FailOnce => (i, 2, 1),
                Fate::NonRetryable => (i, 1, 0),
            })
            .collect();
        (tally(&calls), vec![workload::event_id(7)])
    }

    #[test]
    fn a_clean_run_has_every_event_at_its_end() {
        let (t, dlq) = healthy();
        let a = account(10, 10, &t, &dlq);
        assert_eq!(a.handled, 10);
        assert!(a.lost.is_empty() && a.misrouted.is_empty());
        assert_eq!((a.extra_calls, a.extra_dlq, a.dlq_distinct), (0, 0, 1));
    }

    #[test]
    fn a_healthy_event_dead_lettered_is_misrouted_not_handled() {
        // Event 4 should succeed; it was dead-lettered instead and never succeeded.
        let (mut t, mut dlq) = healthy();
        t.by_id.insert(
            workload::event_id(4),
            Calls {
                calls: 1,
                oks: 0,
                refusals: 0,
                first_at: 0,
            },
        );
        dlq.push(workload::event_id(4));
        let a = account(10, 10, &t, &dlq);
        assert_eq!(a.misrouted, vec![workload::event_id(4)]);
        assert_eq!(a.handled, 9, "a DLQ entry does not count as handled");
        assert!(a.lost.is_empty());
        assert_eq!(a.dlq_distinct, 2);
    }

    #[test]
    fn a_non_retryable_event_missing_from_the_dlq_is_lost() {
        let (t, _) = healthy();
        let a = account(10, 8, &t, &[]);
        assert_eq!(a.lost, vec![workload::event_id(7)]);
        assert_eq!(a.refused_not_in_dlq, vec![workload::event_id(7)]);
        assert_eq!(a.probes_missing, 0, "event 7 came before the fault");
        let a = account(10, 5, &t, &[]);
        assert_eq!(a.probes_missing, 1);
    }

    #[test]
    fn second_dlq_entries_and_calls_are_duplicates() {
        let (mut t, mut dlq) = healthy();
        dlq.push(workload::event_id(7));
        t.by_id.insert(
            workload::event_id(0),
            Calls {
                calls: 3,
                oks: 3,
                refusals: 0,
                first_at: 0,
            },
        );
        let a = account(10, 10, &t, &dlq);
        assert_eq!((a.extra_calls, a.extra_dlq, a.dlq_distinct), (2, 1, 1));
    }
}
