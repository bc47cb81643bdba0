//! The broker itself: topics, one queue per consumer group ordered by due time then arrival, the DLQs,
//! and the fault switches the tests turn; what the transport, its subscriptions and DLQ sessions share.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rustc_hash::FxHashMap;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::adapter::{StoredDeadLetter, default_group};
use crate::error::Kind;
use crate::event::{Event, RawMessage};

#[derive(Default)]
pub(super) struct Broker {
    pub(super) state: Mutex<State>,
    pub(super) arrivals: Notify,
    /// Whether any topic's receives are made to fail ([`State::failing_receives`] not empty): a
    /// receive looks at the map, under the broker's lock, only then.
    pub(super) any_failing: AtomicBool,
}

#[derive(Default)]
pub(super) struct State {
    /// By name, hashed with Fx (the names are the process's own: nothing for a hash-flooding attacker
    /// to choose).
    pub(super) topics: FxHashMap<String, Topic>,
    /// Dead letters by source topic, each with the group that dead-lettered it.
    pub(super) dead: HashMap<String, Vec<StoredDeadLetter>>,
    pub(super) unwritable_dlq: HashSet<String>,
    /// Topics whose receives fail, with the kind of error they fail with.
    pub(super) failing_receives: HashMap<String, Kind>,
    pub(super) next_seq: u64,
}

impl State {
    /// Adds `event` to the DLQ of `source_topic`, dead-lettered by `group`.
    pub(super) fn add_dead_letter(
        &mut self,
        source_topic: &str,
        group: Option<String>,
        event: &Event,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let entry = StoredDeadLetter::new(seq.to_string(), event.to_raw()).with_group(group);
        self.dead
            .entry(source_topic.to_string())
            .or_default()
            .push(entry);
    }
}

/// A topic: one queue per consumer group, and the offsets its messages are numbered with.
#[derive(Default)]
pub(super) struct Topic {
    /// Each group's queue, locked on its own: a subscription and its receipts hold their queue, so a
    /// delivery and its settle take that lock alone — not the broker's, and no lookup by name.
    pub(super) groups: FxHashMap<String, Arc<QueueCell>>,
    pub(super) next_offset: i64,
}

/// A group's queue, with its own lock (taken after the broker's where both are).
pub(super) type QueueCell = Mutex<Queue>;

impl Topic {
    /// The queue of `group`, declared now if it was not.
    pub(super) fn group(&mut self, group: &str) -> &Arc<QueueCell> {
        self.groups.entry(group.to_string()).or_default()
    }
}

/// Locks `queue`.
pub(super) fn lock_queue(queue: &QueueCell) -> MutexGuard<'_, Queue> {
    queue.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
pub(super) struct Queue {
    /// Set when its topic is deleted: a subscription that holds it looks its group up again.
    pub(super) deleted: bool,
    pub(super) waiting: Waiting,
    /// What each subscription lane has handed out and not settled yet: counted by the lane apart from
    /// this lock, so that a settle takes no lock a lane on another core takes.
    pub(super) in_flight: Vec<Arc<InFlight>>,
    /// Retries put back into this queue with a delay, in all (the queue's retry route).
    pub(super) retries_scheduled: usize,
}

impl Queue {
    /// Messages handed out by every lane and not settled yet.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.iter().map(|lane| lane.get()).sum()
    }

    /// A count for a new lane of a subscription, kept with the queue's others; the counts of lanes gone
    /// with nothing in flight are dropped.
    pub(super) fn new_lane(&mut self) -> Arc<InFlight> {
        self.in_flight
            .retain(|lane| Arc::strong_count(lane) > 1 || lane.get() > 0);
        let lane = Arc::new(InFlight::default());
        self.in_flight.push(lane.clone());
        lane
    }
}

/// Messages one subscription lane handed out and has not settled, on cache lines of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct InFlight(AtomicUsize);

impl InFlight {
    /// The count now.
    pub(super) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// One more handed out (under the queue's lock, as the message leaves the waiting ones, so that a
    /// count under the lock sees it in one place or the other).
    pub(super) fn taken(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// One settled or given back (after a message given back is waiting again, so that it is never
    /// counted nowhere).
    pub(super) fn landed(&self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A group's waiting messages, handed out by due time, then by arrival. Most are due when they arrive
/// (a publish, a replay, a retry without delay): those wait in arrival order, and taking one costs no
/// heap operation. The others (delayed retries) wait on a heap of timers.
#[derive(Default)]
pub(super) struct Waiting {
    /// Messages that were due when they arrived: `(due, seq, message)` in arrival order.
    pub(super) ready: VecDeque<(Instant, u64, Stored)>,
    /// When each later message is due, with its sequence number.
    pub(super) timers: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The later messages by sequence number.
    pub(super) later: HashMap<u64, Stored>,
}

impl Waiting {
    /// Adds a message due at `due`, arriving at `now` as the `seq`-th.
    pub(super) fn push(&mut self, due: Instant, seq: u64, stored: Stored, now: Instant) {
        if due <= now {
            // In order by (due, seq): at the back, unless its due time is before the last one's (a
            // due time taken a moment before another caller's message arrived).
            let at = self
                .ready
                .partition_point(|(d, s, _)| (*d, *s) <= (due, seq));
            self.ready.insert(at, (due, seq, stored));
        } else {
            self.timers.push(Reverse((due, seq)));
            self.later.insert(seq, stored);
        }
    }

    /// How many messages wait, due or not.
    pub(super) fn len(&self) -> usize {
        self.ready.len() + self.later.len()
    }

    /// Takes the message due first if it is due at `now` (read only when no message due on arrival
    /// waits: the common case reads no clock); otherwise tells when the next one will be (`None`:
    /// nothing waits).
    pub(super) fn pop_due(
        &mut self,
        now: impl FnOnce() -> Instant,
    ) -> Result<Stored, Option<Instant>> {
        let head = self.ready.front().map(|(due, seq, _)| (*due, *seq));
        let timer = self.timers.peek().map(|Reverse(t)| *t);
        match (head, timer) {
            // A ready message was due when it arrived, so it is due now; a timer before it is too.
            (Some(h), Some(t)) if t < h => self.pop_timer(t.1),
            (Some(_), _) => self.ready.pop_front().map(|(_, _, m)| m).ok_or(None),
            (None, Some((due, seq))) if due <= now() => self.pop_timer(seq),
            (None, Some((due, _))) => Err(Some(due)),
            (None, None) => Err(None),
        }
    }

    pub(super) fn pop_timer(&mut self, seq: u64) -> Result<Stored, Option<Instant>> {
        self.timers.pop();
        self.later.remove(&seq).ok_or(None)
    }
}

#[derive(Clone)]
pub(super) struct Stored {
    pub(super) raw: RawMessage,
    pub(super) offset: i64,
}

impl Broker {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The topic, declared now (with its default group) if it was not.
    pub(super) fn topic<'s>(state: &'s mut State, topic: &str) -> &'s mut Topic {
        state.topics.entry(topic.to_string()).or_insert_with(|| {
            let mut t = Topic::default();
            t.group(&default_group(topic));
            t
        })
    }

    /// Puts `raw` in the queue of `group`, or — for a new event, `group` being `None` — in the queue of
    /// every group of the topic; returns its offset.
    pub(super) fn enqueue(
        &self,
        topic: &str,
        group: Option<&str>,
        raw: RawMessage,
        due: Instant,
        offset: Option<i64>,
    ) -> i64 {
        let mut state = self.lock();
        let first_seq = state.next_seq;
        let t = Self::topic(&mut state, topic);
        let offset = offset.unwrap_or_else(|| {
            let o = t.next_offset;
            t.next_offset += 1;
            o
        });
        let mut seq = first_seq;
        let stored = Stored { raw, offset };
        let now = Instant::now();
        match group {
            Some(group) => {
                lock_queue(t.group(group))
                    .waiting
                    .push(due, seq, stored, now);
                seq += 1;
            }
            None => {
                for queue in t.groups.values() {
                    lock_queue(queue)
                        .waiting
                        .push(due, seq, stored.clone(), now);
                    seq += 1;
                }
            }
        }
        state.next_seq = seq;
        drop(state);
        self.arrivals.notify_waiters();
        offset
    }

    /// Counts one retry scheduled into `group`'s queue of `topic`.
    pub(super) fn count_retry(&self, topic: &str, group: &str) {
        let mut state = self.lock();
        lock_queue(Self::topic(&mut state, topic).group(group)).retries_scheduled += 1;
    }

    /// The queue of `group` of `topic`, both declared now if they were not.
    pub(super) fn queue(&self, topic: &str, group: &str) -> Arc<QueueCell> {
        Self::topic(&mut self.lock(), topic).group(group).clone()
    }

    /// Deletes `topic`: its queues are marked deleted for the subscriptions that hold them.
    pub(super) fn delete(&self, topic: &str) {
        let mut state = self.lock();
        if let Some(t) = state.topics.remove(topic) {
            for queue in t.groups.values() {
                lock_queue(queue).deleted = true;
            }
        }
        state.dead.remove(topic);
        state.unwritable_dlq.remove(topic);
    }

    /// Makes every receive from `topic` fail with an error of `kind` (`Some`), or work again.
    pub(super) fn fail_receives(&self, topic: &str, kind: Option<Kind>) {
        let mut state = self.lock();
        match kind {
            Some(kind) => state.failing_receives.insert(topic.to_string(), kind),
            None => state.failing_receives.remove(topic),
        };
        self.any_failing
            .store(!state.failing_receives.is_empty(), Ordering::Release);
    }

    /// The kind of error receives from `topic` fail with, if they are made to fail.
    pub(super) fn refusal(&self, topic: &str) -> Option<Kind> {
        if !self.any_failing.load(Ordering::Acquire) {
            return None;
        }
        self.lock().failing_receives.get(topic).copied()
    }
}
