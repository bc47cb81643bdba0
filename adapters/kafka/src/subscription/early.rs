//! Retries that came before their due time, held until it.
//!
//! The ladder hands a retry over a little before it is due ([`crate::ladder::HANDOVER_LEAD`]), so that the
//! way through the retry topic does not make it late; a record of the retry topic that arrives before
//! its `x-retry-due-at` is held here, in due order, and handed to the runtime at that time (at most
//! [`EARLY_HOLD_MAX`] after it arrived: a due time further away says the clocks disagree, and the record
//! goes on rather than wait for a clock). Kept apart from the subscription's hand-out because it is a
//! timer of its own, with its own precision.

use std::time::Duration;

use event_retry_core::adapter::Delivery;
use event_retry_core::event::RawMessage;
use event_retry_core::metadata::names;
use event_retry_core::time::Timestamp;

use crate::consumer::offsets::Tp;

/// The longest a record of the retry topic that came before its due time is held.
const EARLY_HOLD_MAX: Duration = Duration::from_secs(1);

/// A retry held until its due time.
pub(super) struct Early {
    /// When it is handed out.
    pub(super) at: Timestamp,
    /// Arrival order, among those held.
    pub(super) seq: u64,
    pub(super) tp: Tp,
    pub(super) offset: i64,
    pub(super) epoch: u64,
    /// The assignment's change count when the record was read.
    pub(super) generation: u64,
    pub(super) delivery: Delivery,
}

impl PartialEq for Early {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Early {}

impl PartialOrd for Early {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Early {
    /// Reversed: the heap's top is the earliest.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// How close to its due time a held retry's wait leaves Tokio's timer (see [`precise_sleep`]).
pub(super) const PRECISE_WITHIN: Duration = Duration::from_millis(3);

/// The last stretch of a held retry's wait, `d` (at most [`PRECISE_WITHIN`]), slept by a blocking
/// thread: a held retry waits with Tokio's timer until [`PRECISE_WITHIN`] before its due time, then
/// this way.
///
/// Why: Tokio's timer wakes on whole milliseconds, rounded up, and its driver sleeps in whole
/// milliseconds too, so a retry held to its due time that way started a millisecond or two after it
/// (seen beside Spring Kafka's retry topics, `scripts/peer-bench fixed`). A thread's sleep
/// ends within tens of microseconds of its time. One such sleep per subscription at a time (the
/// earliest held retry's; the retries due with it go at once), kept across a batch's arrival.
pub(super) fn precise_sleep(d: Duration) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || std::thread::sleep(d))
}

/// What `x-retry-due-at` may lie below the true due time, in ms (see [`hold_until`]).
const DUE_AT_ROUNDING_MS: u64 = 1;

/// When a record of the retry topic whose event says when it is due (`x-retry-due-at`), received at
/// `now`, is to be handed out: `None` when it is due already (or says nothing), else its due time, at
/// most [`EARLY_HOLD_MAX`] away.
pub(super) fn hold_until(message: &RawMessage, now: Timestamp) -> Option<Timestamp> {
    let due = message
        .headers
        .get(names::DUE_AT)
        .and_then(|value| std::str::from_utf8(value).ok()?.parse::<u64>().ok())
        // Whole milliseconds: the time the delay counts from was cut to the millisecond below (the
        // delay rounded up), so the true due time can be up to 1 ms later.
        .map(|ms| Timestamp::from_millis(ms.saturating_add(DUE_AT_ROUNDING_MS)))?;
    (due > now).then(|| due.min(now.plus(EARLY_HOLD_MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due_at(value: &str) -> RawMessage {
        let mut headers = event_retry_core::headers::Headers::default();
        headers.push(names::DUE_AT, value.to_string());
        RawMessage {
            payload: bytes::Bytes::new(),
            key: None,
            headers,
        }
    }

    #[test]
    fn a_retry_is_held_until_its_due_time_and_at_most_a_second() {
        let now = Timestamp::from_millis(1_000_000);
        assert_eq!(
            hold_until(&due_at("1000060"), now),
            Some(Timestamp::from_millis(1_000_061)),
            "the due time, and the 1 ms its rounding may have taken off"
        );
        assert_eq!(hold_until(&due_at("999999"), now), None, "due now");
        assert_eq!(hold_until(&due_at("999000"), now), None, "overdue");
        assert_eq!(
            hold_until(&due_at("1060000"), now),
            Some(Timestamp::from_millis(1_001_000)),
            "a clock a minute ahead holds it a second"
        );
        assert_eq!(hold_until(&due_at("soon"), now), None, "unreadable");
        let mut none = due_at("0");
        none.headers = event_retry_core::headers::Headers::default();
        assert_eq!(hold_until(&none, now), None, "no due time");
    }
}
