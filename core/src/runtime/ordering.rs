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

use crate::adapter::Delivery;
use crate::time::Timestamp;

/// Deliveries waiting for their key to be free.
#[derive(Default)]
pub(crate) struct KeyQueues {
    busy: Mutex<HashMap<Bytes, VecDeque<(Delivery, OwnedSemaphorePermit)>>>,
}

impl KeyQueues {
    /// Claims `key` for the caller (giving the delivery back), or queues the delivery behind the key's
    /// current holder. A queued delivery holds a queue slot from `queue_slot` if one is free (its work
    /// permit is then given back, so other keys go on), else it keeps the work permit (back-pressure).
    pub(crate) fn claim_or_queue(
        &self,
        key: &Bytes,
        delivery: Delivery,
        work: OwnedSemaphorePermit,
        queue_slot: impl FnOnce() -> Option<OwnedSemaphorePermit>,
    ) -> Option<(Delivery, OwnedSemaphorePermit)> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        match busy.get_mut(key) {
            Some(queue) => {
                let permit = queue_slot().unwrap_or(work);
                queue.push_back((delivery, permit));
                None
            }
            None => {
                busy.insert(key.clone(), VecDeque::new());
                Some((delivery, work))
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

/// The claim a task holds on a key: it hands out the deliveries queued behind the key and frees the key
/// when none is left. If the task ends early (it panicked or was aborted) the drop frees the key, and the
/// deliveries still queued are dropped, which releases them to the broker. Once the key was freed in the
/// normal way the drop does nothing, so it never removes a later task's fresh claim.
pub(crate) struct KeyGuard {
    keys: std::sync::Arc<KeyQueues>,
    key: Bytes,
    held: bool,
}

impl KeyGuard {
    pub(crate) fn new(keys: std::sync::Arc<KeyQueues>, key: Bytes) -> Self {
        Self {
            keys,
            key,
            held: true,
        }
    }

    /// The next delivery queued behind the key, or `None` after freeing the key.
    pub(crate) fn next(&mut self) -> Option<(Delivery, OwnedSemaphorePermit)> {
        let next = self.keys.next_or_release(&self.key);
        self.held = next.is_some();
        next
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        if self.held {
            let mut busy = self.keys.busy.lock().unwrap_or_else(|p| p.into_inner());
            busy.remove(&self.key);
        }
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
}

/// One key's retry state: the event waiting in retry, and the events parked behind it, in order.
#[derive(Debug)]
struct KeyState {
    head: Option<Head>,
    /// The head that was dead-lettered while events were parked behind it (they follow it).
    dead_head: Option<String>,
    parked: VecDeque<String>,
    /// When the key last made progress; a key stuck longer than the stale limit is unblocked.
    touched: Timestamp,
}

/// Per-key parking: the head of each key waiting in retry, and the events parked behind it in arrival
/// order. Parked events run strictly in that order once the head resolves.
#[derive(Debug)]
pub(crate) struct Parking {
    keys: Mutex<HashMap<Bytes, KeyState>>,
    follow_to_dlq: bool,
    min_park: Duration,
    stale_after: Duration,
}

impl Parking {
    pub(crate) fn new(follow_to_dlq: bool, min_park: Duration, stale_after: Duration) -> Self {
        Self {
            keys: Mutex::new(HashMap::new()),
            follow_to_dlq,
            min_park,
            stale_after,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Bytes, KeyState>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides for event `id` of `key` at `now`.
    pub(crate) fn verdict(&self, key: &Bytes, id: &str, now: Timestamp) -> Verdict {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            return Verdict::Run;
        };
        // A head or a parked event that never comes back (consumed elsewhere, lost to a restart) must not
        // block its key for ever: give up on a head long past its due time, or a queue that stopped moving.
        let last_progress = state
            .head
            .as_ref()
            .map_or(state.touched, |h| h.due.max(state.touched));
        if now.since(last_progress) > self.stale_after {
            tracing::warn!(head = ?state.head.as_ref().map(|h| &h.id), parked = state.parked.len(), "per-key ordering: giving up on a stale key");
            keys.remove(key);
            return Verdict::Run;
        }
        if let Some(head) = &state.head {
            if head.id == id {
                return Verdict::Run;
            }
            if !state.parked.iter().any(|p| p == id) {
                state.parked.push_back(id.to_string());
            }
            return Verdict::Park {
                head: head.id.clone(),
                delay: head.due.since(now).max(self.min_park),
            };
        }
        match state.parked.front() {
            None => {
                keys.remove(key);
                Verdict::Run
            }
            Some(front) if front == id => {
                state.parked.pop_front();
                state.touched = now;
                let verdict = match &state.dead_head {
                    Some(dead) => Verdict::FollowToDlq { head: dead.clone() },
                    None => Verdict::Run,
                };
                if state.parked.is_empty() && state.head.is_none() {
                    keys.remove(key);
                }
                verdict
            }
            Some(front) => {
                let front = front.clone();
                if !state.parked.iter().any(|p| p == id) {
                    state.parked.push_back(id.to_string());
                }
                Verdict::Park {
                    head: front,
                    delay: self.min_park,
                }
            }
        }
    }

    /// Event `id` of `key` was scheduled for retry at `due`: it is (or stays) the key's head.
    pub(crate) fn head_retrying(&self, key: &Bytes, id: &str, due: Timestamp, now: Timestamp) {
        let mut keys = self.lock();
        let state = keys.entry(key.clone()).or_insert_with(|| KeyState {
            head: None,
            dead_head: None,
            parked: VecDeque::new(),
            touched: now,
        });
        state.parked.retain(|p| p != id);
        state.head = Some(Head {
            id: id.to_string(),
            due,
        });
        state.dead_head = None;
        state.touched = now;
    }

    /// Event `id` of `key` reached a final outcome the broker accepted; `dead` when it went to the DLQ.
    pub(crate) fn resolved(&self, key: &Bytes, id: &str, dead: bool, now: Timestamp) {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            return;
        };
        if state.head.as_ref().is_some_and(|h| h.id == id) {
            state.head = None;
            state.dead_head = (dead && self.follow_to_dlq).then(|| id.to_string());
            state.touched = now;
        }
        if state.head.is_none() && state.parked.is_empty() {
            keys.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    struct NoReceipt;

    #[async_trait::async_trait]
    impl crate::adapter::Receipt for NoReceipt {
        async fn ack(&mut self) -> Result<(), crate::error::Error> {
            Ok(())
        }
        async fn retry(
            &mut self,
            _: &crate::event::Event,
            _: Duration,
        ) -> Result<(), crate::error::Error> {
            Ok(())
        }
        async fn dead_letter(
            &mut self,
            _: &crate::event::Event,
        ) -> Result<(), crate::error::Error> {
            Ok(())
        }
        async fn release(&mut self, _: Duration) -> Result<(), crate::error::Error> {
            Ok(())
        }
    }

    fn delivery() -> Delivery {
        Delivery {
            message: Default::default(),
            info: Default::default(),
            receipt: Box::new(NoReceipt),
        }
    }

    #[test]
    fn a_freed_guard_never_removes_a_later_claim() {
        let permits = Arc::new(Semaphore::new(8));
        let permit = || permits.clone().try_acquire_owned().ok();
        let keys = Arc::new(KeyQueues::default());
        let k = key();
        let first = permit().and_then(|p| keys.claim_or_queue(&k, delivery(), p, || None));
        assert!(first.is_some(), "the first delivery claims the key");
        let mut old_guard = KeyGuard::new(keys.clone(), k.clone());
        assert!(
            old_guard.next().is_none(),
            "nothing queued: the key is freed"
        );
        let second = permit().and_then(|p| keys.claim_or_queue(&k, delivery(), p, || None));
        assert!(second.is_some(), "a new task claims the freed key");
        drop(old_guard);
        let third = permit().and_then(|p| keys.claim_or_queue(&k, delivery(), p, || None));
        assert!(
            third.is_none(),
            "the new claim survived the old guard: the third delivery queues"
        );
        let mut new_guard = KeyGuard::new(keys.clone(), k.clone());
        assert!(new_guard.next().is_some());
        drop(new_guard);
        let after_panic = permit().and_then(|p| keys.claim_or_queue(&k, delivery(), p, || None));
        assert!(
            after_panic.is_some(),
            "a guard dropped while holding the key frees it"
        );
    }

    const NOW: Timestamp = Timestamp::from_millis(1_000);
    const STALE: Duration = Duration::from_secs(60);

    fn key() -> Bytes {
        Bytes::from_static(b"k")
    }

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn later_events_park_behind_a_retrying_head_and_run_in_order() {
        let p = Parking::new(true, Duration::from_millis(10), STALE);
        assert_eq!(p.verdict(&key(), "e1", NOW), Verdict::Run);
        p.head_retrying(&key(), "e1", at(1_500), NOW);
        assert_eq!(
            p.verdict(&key(), "e2", NOW),
            Verdict::Park {
                head: "e1".into(),
                delay: Duration::from_millis(500)
            }
        );
        assert!(matches!(p.verdict(&key(), "e3", NOW), Verdict::Park { .. }));
        assert_eq!(p.verdict(&key(), "e1", at(1_500)), Verdict::Run);
        p.resolved(&key(), "e1", false, at(1_500));
        // e3 comes back before e2: it must wait; a brand-new e4 queues behind both.
        assert!(matches!(
            p.verdict(&key(), "e3", at(1_501)),
            Verdict::Park { .. }
        ));
        assert!(matches!(
            p.verdict(&key(), "e4", at(1_501)),
            Verdict::Park { .. }
        ));
        assert_eq!(p.verdict(&key(), "e2", at(1_502)), Verdict::Run);
        assert_eq!(p.verdict(&key(), "e3", at(1_503)), Verdict::Run);
        assert_eq!(p.verdict(&key(), "e4", at(1_504)), Verdict::Run);
        assert_eq!(
            p.verdict(&key(), "e5", at(1_505)),
            Verdict::Run,
            "the key is free again"
        );
    }

    #[test]
    fn a_parked_event_that_fails_becomes_the_head() {
        let p = Parking::new(true, Duration::from_millis(10), STALE);
        p.head_retrying(&key(), "e1", NOW, NOW);
        assert!(matches!(p.verdict(&key(), "e2", NOW), Verdict::Park { .. }));
        assert!(matches!(p.verdict(&key(), "e3", NOW), Verdict::Park { .. }));
        p.resolved(&key(), "e1", false, NOW);
        assert_eq!(p.verdict(&key(), "e2", NOW), Verdict::Run);
        p.head_retrying(&key(), "e2", at(2_000), NOW);
        assert_eq!(
            p.verdict(&key(), "e3", NOW),
            Verdict::Park {
                head: "e2".into(),
                delay: Duration::from_millis(1_000)
            }
        );
    }

    #[test]
    fn parked_events_follow_a_dead_head_then_the_key_clears() {
        let p = Parking::new(true, Duration::from_millis(10), STALE);
        p.head_retrying(&key(), "e1", NOW, NOW);
        assert!(matches!(p.verdict(&key(), "e2", NOW), Verdict::Park { .. }));
        p.resolved(&key(), "e1", true, NOW);
        assert_eq!(
            p.verdict(&key(), "e2", NOW),
            Verdict::FollowToDlq { head: "e1".into() }
        );
        assert_eq!(p.verdict(&key(), "e3", NOW), Verdict::Run);
    }

    #[test]
    fn without_follow_a_dead_head_frees_its_followers() {
        let p = Parking::new(false, Duration::from_millis(10), STALE);
        p.head_retrying(&key(), "e1", NOW, NOW);
        assert!(matches!(p.verdict(&key(), "e2", NOW), Verdict::Park { .. }));
        p.resolved(&key(), "e1", true, NOW);
        assert_eq!(p.verdict(&key(), "e2", NOW), Verdict::Run);
    }

    #[test]
    fn park_delay_has_a_floor_and_stale_keys_are_unblocked() {
        let p = Parking::new(true, Duration::from_millis(50), STALE);
        p.head_retrying(&key(), "e1", NOW, NOW);
        assert_eq!(
            p.verdict(&key(), "e2", at(5_000)),
            Verdict::Park {
                head: "e1".into(),
                delay: Duration::from_millis(50)
            }
        );
        assert_eq!(
            p.verdict(&key(), "e2", at(1_000 + 61_000)),
            Verdict::Run,
            "the head never came back"
        );
    }
}
