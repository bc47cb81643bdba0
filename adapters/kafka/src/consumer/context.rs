//! The consumer's context: the state the consumer thread shares with its rebalance callbacks and with
//! the subscription's receipts, and the commands the subscription sends the thread.
//!
//! librdkafka calls the rebalance callbacks on the thread that polls, inside a poll, while receipts
//! settle from the runtime's threads: what they share lives here, behind one lock (and a second,
//! short one for the settles), apart from the loop that polls ([`super::worker`]), the commits
//! ([`super::commit`]), the pause ([`super::pause`]), the wait for room ([`super::room`]) and the
//! callbacks themselves ([`super::rebalance`]), which each add their part to it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::Offset;
use rdkafka::consumer::BaseConsumer;

use crate::codec::Copied;
use crate::consumer::feed::Waker;
use crate::consumer::handoff::Record;
use crate::consumer::offsets::{Generation, Offsets, Tp};
use crate::consumer::txn::{PendingCopy, SharedTxnProducer};
use crate::stranding::BrokerWatch;

/// What the subscription asks of the thread (receipts report settles straight into the shared state).
pub(crate) enum Command {
    /// The runtime holds consumption (a blocking error).
    Pause,
    /// The runtime consumes again.
    Resume,
    /// Commit what is settled and leave the group.
    Close(tokio::sync::oneshot::Sender<()>),
    /// The runtime took a batch while the thread waited for room to hand out more: nothing to do but
    /// end that wait (see [`Context::room_made`]).
    Room,
}

/// What the consumer thread waits on while the hand-off channels are full (kept in
/// [`Context::room_wait`]).
pub(super) mod room_wait {
    /// Not waiting for room.
    pub(in crate::consumer) const NONE: u8 = 0;
    /// Waiting on the command channel (its backlog is full: it may not read).
    pub(in crate::consumer) const COMMANDS: u8 = 1;
    /// Waiting on the source queue (it may read on while records wait to be handed out).
    pub(in crate::consumer) const SOURCE: u8 = 2;
}

/// A record read and copied, its librdkafka message already destroyed (outside the state's lock).
pub(crate) struct Read {
    /// The topic's name, one allocation per run of records of the same topic.
    pub(super) topic: Arc<str>,
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) copied: Copied,
}

/// A settle a receipt reported: offset, partition and the epoch it was read in.
type Settle = (Tp, i64, u64);

/// What the thread and the rebalance callbacks share.
pub(crate) struct State {
    pub(crate) offsets: Offsets,
    /// Source records received but not yet taken by the source's hand-off channel.
    pub(super) pending: VecDeque<Record>,
    /// Records of the retry topic received but not yet taken by their own hand-off channel (which the
    /// subscription takes from first), so a due retry does not wait behind a backlog of the source.
    pub(super) priority: VecDeque<Record>,
    /// Set by a rebalance: the retry topic's partition queues are to be split off again.
    pub(super) reassigned: bool,
    pub(super) held_by_runtime: bool,
    /// Whether the partitions are paused now.
    pub(super) paused: bool,
    /// Since when the backlog has been full.
    pub(super) full_since: Option<Instant>,
    /// The backlog stayed full too long: the partitions are paused until it drains.
    pub(super) stalled: bool,
    /// Set once the consumer is leaving: a revoke then does not wait for work in flight.
    pub(super) closing: bool,
    /// Who waits for the close to finish.
    pub(super) close_waiter: Option<tokio::sync::oneshot::Sender<()>>,
    /// Copies of settled records waiting for the transaction that commits past them.
    pub(super) copies: Vec<PendingCopy>,
    /// After a failed transaction, when commits carrying copies are tried again.
    pub(super) transaction_retry_at: Option<Instant>,
    /// Transactions failed in a row.
    pub(super) transaction_failures: u32,
    /// Settles taken from [`Context::settles`], being applied (kept to reuse its allocation).
    pub(super) applying: Vec<Settle>,
}

/// The consumer's context: the shared state, and the commands (served inside a revoke too).
pub(crate) struct Context {
    pub(crate) state: Mutex<State>,
    /// Settles reported by receipts, applied to the offsets by the next [`Context::lock`]. A receipt holds
    /// this lock only for a push, so the runtime's threads do not wait for the consumer thread's longer
    /// work under `state` (measured on the Kafka bench: they did, put to sleep on its futex).
    pub(super) settles: Mutex<Vec<Settle>>,
    /// The assignment's change count, read without a lock.
    pub(crate) changes: Generation,
    pub(super) commands: Mutex<Receiver<Command>>,
    pub(super) revoke_grace: Duration,
    /// Set at the first assignment (the member joined its group).
    pub(crate) joined: Arc<AtomicBool>,
    /// Set with transactional hops.
    pub(super) txn: Option<SharedTxnProducer>,
    /// Whether the consumer was left with no broker (see [`crate::stranding`]).
    pub(super) brokers: BrokerWatch,
    /// Where a newly assigned partition with no committed offset starts (see [`crate::consumer::start`]).
    pub(super) reset: Option<Offset>,
    /// Wakes the consumer thread's wait when a copy is handed over for a transaction (set once the
    /// thread has its queues).
    pub(super) waker: OnceLock<Waker>,
    /// Whether and where the consumer thread waits for the runtime to take a batch (`room_wait`), so
    /// that the runtime's take ends the wait ([`Context::room_made`]) instead of its timeout: at a
    /// million records a second the runtime takes a batch every quarter of a millisecond.
    pub(super) room_wait: AtomicU8,
}

impl Context {
    pub(crate) fn new(
        commands: Receiver<Command>,
        revoke_grace: Duration,
        txn: Option<SharedTxnProducer>,
        brokers: BrokerWatch,
        reset: Option<Offset>,
    ) -> Self {
        let offsets = Offsets::default();
        Self {
            changes: offsets.changes(),
            settles: Mutex::new(Vec::new()),
            state: Mutex::new(State {
                offsets,
                pending: VecDeque::new(),
                priority: VecDeque::new(),
                reassigned: false,
                held_by_runtime: false,
                paused: false,
                full_since: None,
                stalled: false,
                closing: false,
                close_waiter: None,
                copies: Vec::new(),
                transaction_retry_at: None,
                transaction_failures: 0,
                applying: Vec::new(),
            }),
            commands: Mutex::new(commands),
            revoke_grace,
            joined: Arc::new(AtomicBool::new(false)),
            txn,
            brokers,
            reset,
            waker: OnceLock::new(),
            room_wait: AtomicU8::new(room_wait::NONE),
        }
    }

    /// Whether copies go through transactions with the offsets (`transactional_hops`).
    pub(crate) fn transactional(&self) -> bool {
        self.txn.is_some()
    }

    /// The shared state, with every settle reported so far applied to its offsets.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let State {
            offsets, applying, ..
        } = &mut *state;
        std::mem::swap(
            applying,
            &mut *self.settles.lock().unwrap_or_else(|p| p.into_inner()),
        );
        for (tp, offset, epoch) in applying.drain(..) {
            offsets.settled(&tp, offset, epoch);
        }
        state
    }

    /// A receipt settled `offset` of `tp`, read in `epoch`; it is committed with the next commit if
    /// everything before it is settled too and the partition is still this member's.
    pub(crate) fn settled(&self, tp: &Tp, offset: i64, epoch: u64) {
        self.settles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((tp.clone(), offset, epoch));
    }

    /// Keeps the records just read (and copied) in the backlog, under one lock, except those whose
    /// partition is not assigned (any more): they are not this member's to hand out.
    pub(super) fn keep(&self, read: Vec<Read>, priority: bool) {
        if read.is_empty() {
            return;
        }
        let mut state = self.lock();
        let State {
            offsets,
            pending,
            priority: first,
            ..
        } = &mut *state;
        let queue = if priority { first } else { pending };
        let generation = self.changes.now();
        // Records of a poll come from few partitions: the topic's shared name is looked up once per run.
        let mut topic: Option<(Arc<str>, Option<Arc<str>>)> = None;
        for record in read {
            if !topic
                .as_ref()
                .is_some_and(|(read_as, _)| Arc::ptr_eq(read_as, &record.topic))
            {
                topic = Some((record.topic.clone(), offsets.topic(&record.topic)));
            }
            let Some((_, Some(name))) = &topic else {
                continue;
            };
            let (tp, offset) = ((name.clone(), record.partition), record.offset);
            if let Some(epoch) = offsets.received(&tp, offset) {
                queue.push_back(Record {
                    tp,
                    offset,
                    epoch,
                    generation,
                    copied: record.copied,
                });
            }
        }
    }

    /// Applies the commands waiting (waiting up to `wait` for the first); `true` once asked to close.
    pub(super) fn serve_commands(&self, consumer: &BaseConsumer<Context>, wait: Duration) -> bool {
        let commands = self.commands.lock().unwrap_or_else(|p| p.into_inner());
        let mut first = true;
        loop {
            let command = if first && !wait.is_zero() {
                match commands.recv_timeout(wait) {
                    Ok(c) => c,
                    // Disconnected: every sender is gone (the subscription and its receipts were
                    // dropped); the main loop sees the closed channel.
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                        return self.lock().closing;
                    }
                }
            } else {
                match commands.try_recv() {
                    Ok(c) => c,
                    Err(_) => return self.lock().closing,
                }
            };
            first = false;
            match command {
                Command::Pause => {
                    self.lock().held_by_runtime = true;
                    self.apply_pause(consumer);
                }
                Command::Resume => {
                    self.lock().held_by_runtime = false;
                    self.apply_pause(consumer);
                }
                Command::Room => {}
                Command::Close(done) => {
                    let mut state = self.lock();
                    state.closing = true;
                    state.close_waiter = Some(done);
                }
            }
        }
    }
}
