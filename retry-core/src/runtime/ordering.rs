//! Per-key ordering: keys that are handled one event at a time, and keys whose head waits in retry.
//!
//! Two mechanisms keep the order of one key without blocking the others:
//!
//! * In the process, events of one key are handled one after another ([`KeyQueues`]): a delivery for a
//!   key already being handled waits behind it (holding its concurrency permit, so memory stays bounded).
//! * Across retries, while the *head* event of a key waits in the broker's delay mechanism, later events
//!   of that key are *parked*: sent along the same retry route, due no earlier than the head, without
//!   calling the handler ([`Parking`]). When they come back after the head resolved, they run in order;
//!   if the head went to the DLQ, they follow it there (configurable).
//!
//! The parking table lives in the consumer's memory; after a restart parked events simply run when they
//! come back (their metadata still names the head), which keeps them flowing rather than stuck.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;

use crate::time::Timestamp;
use crate::transport::Delivery;

/// Deliveries waiting for their key to be free.
#[derive(Default)]
pub(crate) struct KeyQueues {
    busy: Mutex<HashMap<Bytes, VecDeque<(Delivery, OwnedSemaphorePermit)>>>,
}

impl KeyQueues {
    /// Claims `key` for the caller, or queues the delivery behind the key's current holder.
    pub(crate) fn claim_or_queue(
        &self,
        key: &Bytes,
        delivery: Delivery,
        permit: OwnedSemaphorePermit,
    ) -> Option<(Delivery, OwnedSemaphorePermit)> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        match busy.get_mut(key) {
            Some(queue) => {
                queue.push_back((delivery, permit));
                None
            }
            None => {
                busy.insert(key.clone(), VecDeque::new());
                Some((delivery, permit))
            }
        }
    }

    /// The next delivery queued for `key`, or frees the key when none is.
    pub(crate) fn next_or_release(&self, key: &Bytes) -> Option<(Delivery, OwnedSemaphorePermit)> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let next = busy.get_mut(key).and_then(VecDeque::pop_front);
        if next.is_none() {
            busy.remove(key);
        }
        next
    }
}

/// What the parking table says about an event of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Handle it now.
    Run,
    /// Park it behind `head` for `delay`.
    Park { head: String, delay: Duration },
    /// Its head was dead-lettered: follow it to the DLQ.
    FollowToDlq { head: String },
}

#[derive(Debug)]
struct Head {
    id: String,
    due: Timestamp,
    dead: bool,
    parked: usize,
}

/// The heads of keys waiting in retry, and how many events are parked behind each.
#[derive(Debug)]
pub(crate) struct Parking {
    heads: Mutex<HashMap<Bytes, Head>>,
    follow_to_dlq: bool,
    min_park: Duration,
}

impl Parking {
    pub(crate) fn new(follow_to_dlq: bool, min_park: Duration) -> Self {
        Self {
            heads: Mutex::new(HashMap::new()),
            follow_to_dlq,
            min_park,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Bytes, Head>> {
        self.heads.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides for event `id` of `key`; `was_parked` when its metadata says it is a parked event.
    pub(crate) fn verdict(
        &self,
        key: &Bytes,
        id: &str,
        was_parked: bool,
        now: Timestamp,
    ) -> Verdict {
        let mut heads = self.lock();
        let Some(head) = heads.get_mut(key) else {
            return Verdict::Run;
        };
        if head.id == id {
            return Verdict::Run;
        }
        if head.dead {
            return Verdict::FollowToDlq {
                head: head.id.clone(),
            };
        }
        if !was_parked {
            head.parked += 1;
        }
        Verdict::Park {
            head: head.id.clone(),
            delay: head.due.since(now).max(self.min_park),
        }
    }

    /// Event `id` of `key` was scheduled for retry at `due`: it is (or stays) the key's head.
    pub(crate) fn head_retrying(&self, key: &Bytes, id: &str, due: Timestamp) {
        let mut heads = self.lock();
        let head = heads.entry(key.clone()).or_insert_with(|| Head {
            id: id.to_string(),
            due,
            dead: false,
            parked: 0,
        });
        if head.id == id {
            head.due = due;
        } else if !head.dead {
            // A parked event that ran after its head resolved and now retries itself: it becomes the head,
            // and the events still parked behind the old head re-park behind it.
            head.id = id.to_string();
            head.due = due;
        }
    }

    /// Event `id` of `key` reached a final outcome; `dead` when it went to the DLQ, `was_parked` when it
    /// had been parked.
    pub(crate) fn resolved(&self, key: &Bytes, id: &str, dead: bool, was_parked: bool) {
        let mut heads = self.lock();
        let Some(head) = heads.get_mut(key) else {
            return;
        };
        if was_parked && head.id != id {
            head.parked = head.parked.saturating_sub(1);
        }
        if head.id == id {
            if dead && self.follow_to_dlq && head.parked > 0 {
                head.dead = true;
            } else {
                heads.remove(key);
                return;
            }
        }
        if head.dead && head.parked == 0 {
            heads.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp::from_millis(1_000);

    fn key() -> Bytes {
        Bytes::from_static(b"k")
    }

    #[test]
    fn later_events_park_behind_a_retrying_head_until_it_resolves() {
        let p = Parking::new(true, Duration::from_millis(10));
        assert_eq!(p.verdict(&key(), "e1", false, NOW), Verdict::Run);
        p.head_retrying(&key(), "e1", Timestamp::from_millis(1_500));
        assert_eq!(
            p.verdict(&key(), "e2", false, NOW),
            Verdict::Park {
                head: "e1".into(),
                delay: Duration::from_millis(500)
            }
        );
        assert_eq!(
            p.verdict(&key(), "e1", false, Timestamp::from_millis(1_500)),
            Verdict::Run
        );
        p.resolved(&key(), "e1", false, false);
        assert_eq!(
            p.verdict(&key(), "e2", true, Timestamp::from_millis(1_600)),
            Verdict::Run
        );
    }

    #[test]
    fn parked_events_follow_a_dead_head_then_the_key_clears() {
        let p = Parking::new(true, Duration::from_millis(10));
        p.head_retrying(&key(), "e1", NOW);
        assert!(matches!(
            p.verdict(&key(), "e2", false, NOW),
            Verdict::Park { .. }
        ));
        p.resolved(&key(), "e1", true, false);
        assert_eq!(
            p.verdict(&key(), "e2", true, NOW),
            Verdict::FollowToDlq { head: "e1".into() }
        );
        p.resolved(&key(), "e2", true, true);
        assert_eq!(p.verdict(&key(), "e3", false, NOW), Verdict::Run);
    }

    #[test]
    fn without_follow_a_dead_head_frees_the_key() {
        let p = Parking::new(false, Duration::from_millis(10));
        p.head_retrying(&key(), "e1", NOW);
        assert!(matches!(
            p.verdict(&key(), "e2", false, NOW),
            Verdict::Park { .. }
        ));
        p.resolved(&key(), "e1", true, false);
        assert_eq!(p.verdict(&key(), "e2", true, NOW), Verdict::Run);
    }

    #[test]
    fn park_delay_has_a_floor() {
        let p = Parking::new(true, Duration::from_millis(50));
        p.head_retrying(&key(), "e1", NOW);
        assert_eq!(
            p.verdict(&key(), "e2", false, Timestamp::from_millis(5_000)),
            Verdict::Park {
                head: "e1".into(),
                delay: Duration::from_millis(50)
            }
        );
    }
}
