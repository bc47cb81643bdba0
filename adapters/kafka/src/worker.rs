//! The thread that owns a consumer group member of a source topic and its group's retry topic.
//!
//! librdkafka wants one thread to poll a consumer, and the group membership holds only while it polls
//! (`max.poll.interval.ms`), so the thread polls all the time — also while consumption is paused. It
//! hands records to the subscription through bounded channels ([`crate::handoff`]), keeping the rest
//! in a bounded backlog;
//! while the backlog is full it stops reading (librdkafka's own prefetch is bounded too). When the
//! runtime holds consumption for a blocking error, or the backlog stays full for long, it pauses every
//! assigned partition and polls on (librdkafka drops what it fetched ahead and fetches again from the
//! position after the last record read on resume).
//!
//! The group's retry topic comes first: its partitions are split off into queues of their own, which
//! librdkafka fetches apart from the source's prefetch, and the thread reads them and hands their records
//! out before the source's, through a channel the subscription takes from first, so a due retry waits
//! neither behind a backlog of the source nor behind the source batches already handed out — only for
//! the rest of the batch being taken.
//!
//! The source's partitions are forwarded to a queue of the thread's own, read in batches and waited
//! on (see [`crate::feed`]); the consumer's queue, polled without waiting, brings the rebalances and
//! errors, and wakes that wait when something comes to it, as do the retry topic's queues. After each
//! assignment the thread forwards the partitions again and reads whatever came to the consumer's queue
//! meanwhile before anything of the source's queue, so that a partition's records keep their order.
//!
//! Receipts report settled offsets into the shared state (no wake-up per settle); the thread commits each partition's
//! contiguous settled prefix (see [`crate::offsets`]). With transactional hops a retry or DLQ copy is
//! handed to the thread with its settle, and a commit that passes a record with a copy is one
//! transaction carrying both (see [`crate::txn`]); the receipt returns once it is committed. A copy
//! whose offset a commit cannot reach within [`STRANDED_AFTER`] is committed without it. Losing partitions in a rebalance, it first waits
//! (up to `revoke_grace`) for the work in flight on them, commits it, and forgets them, so a settle that
//! comes later never commits for a partition this member no longer owns.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering, fence};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use event_retry_core::error::Error;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::BorrowedMessage;
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use tracing::{debug, warn};

use crate::codec::{Chunks, Copied};
use crate::error::consume_error;
use crate::feed::{ConsumerQueue, Item, SourceQueue, Waker};
use crate::handoff::{self, Senders};
use crate::link::Link;
use crate::offsets::{Generation, Offsets, Tp};
use crate::stranding::BrokerWatch;
use crate::txn::{Copy, Transactional};

/// How often the settled offsets are committed.
const COMMIT_INTERVAL: Duration = Duration::from_millis(50);
/// How long a poll waits for records when none wait to be handed out.
const IDLE_POLL: Duration = Duration::from_millis(50);
/// The same while copies wait for their transaction (transactional hops): a copy handed over wakes the
/// wait, and one that must wait — for the previous transaction's spacing, for an earlier record's settle
/// or after a failure — is looked at again this soon.
const IDLE_POLL_TRANSACTIONAL: Duration = Duration::from_millis(5);

/// Transactions that may fail in a row before their copies are answered with the error.
const TRANSACTION_TRIES: u32 = 3;

/// How long commits carrying copies wait after a transaction failed before the next try.
const TRANSACTION_BACKOFF: Duration = Duration::from_secs(1);

/// How long a copy waits for a commit that passes its record before it goes in a transaction without
/// that offset. An earlier record of the partition can stay unsettled until this copy's settle returns
/// — the runtime holding consumption for an unwritable DLQ hands out the records it gave back only
/// once the DLQ copy is accepted — so waiting for the offset without bound can wait forever. Such a
/// copy is committed alone; a crash before its offset follows copies the record again (never loses it).
const STRANDED_AFTER: Duration = Duration::from_secs(1);

/// The most records handed to the subscription at once.
const HANDOUT_BATCH: usize = 256;
/// The most bytes of records (payload, key and headers) handed to the subscription at once, beyond the
/// record that passes it: with [`handoff::SOURCE_BATCHES`] it bounds the memory in the source's channel
/// (about 8 MiB where records are smaller than this).
const HANDOUT_BYTES: usize = 256 * 1024;
/// The backlog of records read but not yet taken by the runtime at which the thread stops reading.
const PENDING_HIGH: usize = 2_000;
/// The backlog below which a stalled consumer's partitions resume.
const PENDING_LOW: usize = 500;
/// How long the backlog may stay full before the partitions are paused, so the thread can poll again
/// (well within `max.poll.interval.ms`, 5 minutes by default).
const STALL_AFTER: Duration = Duration::from_secs(3);

/// How often the partitions that should be fetching are resumed again (the source's consumer, and the
/// ladder's: [`crate::ladder`]). librdkafka can drop an application's resume as outdated — when an
/// operation of its own on the partition (a library pause or a fetch start, around a rebalance) takes
/// a newer version in between — and still answer success; the partition then stays paused, and every
/// record after it waits for ever, nothing noticing. A resume of a partition librdkafka does not hold
/// paused returns at once without touching it, so asking again costs a call and nothing else.
pub(crate) const RESUME_AGAIN_EVERY: Duration = Duration::from_secs(5);

/// Resumes `partitions` — except, with the `failpoints` feature, while the failpoint named `failpoint`
/// is set to `return`: then the resume is left out and success answered, as librdkafka does with a
/// resume it drops as outdated (what the broker tests of [`RESUME_AGAIN_EVERY`] make happen).
pub(crate) fn resume<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &TopicPartitionList,
    failpoint: &str,
) -> KafkaResult<()> {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(failpoint, |_| Ok(()));
    let _ = failpoint;
    consumer.resume(partitions)
}

/// What the subscription asks of the thread (receipts report settles straight into the shared state).
pub(crate) enum Command {
    /// The runtime holds consumption (a blocking error).
    Pause,
    /// The runtime consumes again.
    Resume,
    /// Commit what is settled and leave the group.
    Close(tokio::sync::oneshot::Sender<()>),
    /// The runtime took a batch while the thread waited for room to hand out more: nothing to do but
    /// end that wait (see [`Worker::room_made`]).
    Room,
}

/// What the consumer thread waits on while the hand-off channels are full (kept in
/// [`Worker::room_wait`]).
mod room_wait {
    /// Not waiting for room.
    pub(super) const NONE: u8 = 0;
    /// Waiting on the command channel (its backlog is full: it may not read).
    pub(super) const COMMANDS: u8 = 1;
    /// Waiting on the source queue (it may read on while records wait to be handed out).
    pub(super) const SOURCE: u8 = 2;
}

/// How long the consumer thread waits for the runtime to take a batch before it looks again; a batch
/// taken once at most half the source channel is queued ends the wait sooner ([`Worker::room_made`]).
/// A wake the handshake misses (see [`Worker::expect_room`]) costs at most this.
const ROOM_WAIT: Duration = Duration::from_millis(1);

/// How many source batches may still wait in their channel when the runtime's take wakes the thread:
/// it then hands out several at once, not one per wake.
const ROOM_WAKE_AT: usize = handoff::SOURCE_BATCHES / 2;

/// A record handed to the subscription.
pub(crate) struct Record {
    pub(crate) tp: Tp,
    pub(crate) offset: i64,
    pub(crate) epoch: u64,
    /// The assignment's change count when the record was kept: while it stays so, `epoch` is current.
    pub(crate) generation: u64,
    /// The record as read, decoded by the subscription (on the thread that handles it).
    pub(crate) copied: Copied,
}

/// A record read and copied, its librdkafka message already destroyed (outside the state's lock).
pub(crate) struct Read {
    /// The topic's name, one allocation per run of records of the same topic.
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    copied: Copied,
}

/// A settle a receipt reported: offset, partition and the epoch it was read in.
type Settle = (Tp, i64, u64);

/// What the thread and the rebalance callbacks share.
pub(crate) struct State {
    pub(crate) offsets: Offsets,
    /// Source records received but not yet taken by the source's hand-off channel.
    pending: VecDeque<Record>,
    /// Records of the retry topic received but not yet taken by their own hand-off channel (which the
    /// subscription takes from first), so a due retry does not wait behind a backlog of the source.
    priority: VecDeque<Record>,
    /// Set by a rebalance: the retry topic's partition queues are to be split off again.
    reassigned: bool,
    held_by_runtime: bool,
    /// Whether the partitions are paused now.
    paused: bool,
    /// Since when the backlog has been full.
    full_since: Option<Instant>,
    /// The backlog stayed full too long: the partitions are paused until it drains.
    stalled: bool,
    /// Set once the consumer is leaving: a revoke then does not wait for work in flight.
    closing: bool,
    /// Who waits for the close to finish.
    close_waiter: Option<tokio::sync::oneshot::Sender<()>>,
    /// Copies of settled records waiting for the transaction that commits past them.
    copies: Vec<PendingCopy>,
    /// After a failed transaction, when commits carrying copies are tried again.
    transaction_retry_at: Option<Instant>,
    /// Transactions failed in a row.
    transaction_failures: u32,
    /// Settles taken from [`Worker::settles`], being applied (kept to reuse its allocation).
    applying: Vec<Settle>,
}

/// A copy waiting for its transaction, and the receipt waiting for the outcome.
struct PendingCopy {
    tp: Tp,
    offset: i64,
    epoch: u64,
    /// When the receipt handed it over.
    since: Instant,
    copy: Copy,
    done: tokio::sync::oneshot::Sender<Result<(), Error>>,
}

/// The transactional producer of a consumer with transactional hops, and the link its records use.
pub(crate) struct Hops {
    link: Arc<Link>,
    producer: Mutex<Transactional>,
}

impl Hops {
    /// The transactional hops of the consumer named `owner`.
    pub(crate) fn new(link: Arc<Link>, owner: &str) -> Self {
        let producer = Mutex::new(Transactional::new(link.transactional.clone(), owner));
        Self { link, producer }
    }
}

/// The consumer's context: the shared state, and the commands (served inside a revoke too).
pub(crate) struct Worker {
    pub(crate) state: Mutex<State>,
    /// Settles reported by receipts, applied to the offsets by the next [`Worker::lock`]. A receipt holds
    /// this lock only for a push, so the runtime's threads do not wait for the consumer thread's longer
    /// work under `state` (measured on the Kafka bench: they did, put to sleep on its futex).
    settles: Mutex<Vec<Settle>>,
    /// The assignment's change count, read without a lock.
    pub(crate) changes: Generation,
    commands: Mutex<Receiver<Command>>,
    revoke_grace: Duration,
    /// Set at the first assignment (the member joined its group).
    pub(crate) joined: Arc<AtomicBool>,
    /// Set with transactional hops.
    hops: Option<Hops>,
    /// Whether the consumer was left with no broker (see [`crate::stranding`]).
    brokers: BrokerWatch,
    /// Where a newly assigned partition with no committed offset starts (see [`crate::start`]).
    reset: Option<Offset>,
    /// Wakes the consumer thread's wait when a copy is handed over for a transaction (set once the
    /// thread has its queues).
    waker: OnceLock<Waker>,
    /// Whether and where the consumer thread waits for the runtime to take a batch (`room_wait`), so
    /// that the runtime's take ends the wait ([`Worker::room_made`]) instead of its timeout: at a
    /// million records a second the runtime takes a batch every quarter of a millisecond.
    room_wait: AtomicU8,
}

impl Worker {
    pub(crate) fn new(
        commands: Receiver<Command>,
        revoke_grace: Duration,
        hops: Option<Hops>,
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
            hops,
            brokers,
            reset,
            waker: OnceLock::new(),
            room_wait: AtomicU8::new(room_wait::NONE),
        }
    }

    /// Marks the consumer thread as about to wait for room (`kind`: where it waits), unless the runtime
    /// took a batch since the thread found the channels full: returns whether to wait. The mark is set,
    /// then a fence, then the channels are looked at; [`Worker::room_made`] frees room, fences, then
    /// reads the mark — so a batch taken in between is either seen here or wakes the wait.
    fn expect_room(&self, out: &Senders, kind: u8) -> bool {
        self.room_wait.store(kind, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let room = {
            let state = self.lock();
            (!state.priority.is_empty() && out.retries.capacity() > 0)
                || (!state.pending.is_empty() && out.source.capacity() > 0)
        };
        if room {
            self.room_wait.store(room_wait::NONE, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Ends a wait marked by [`Worker::expect_room`] (a wake that comes later ends the next wait early:
    /// one extra turn of the loop).
    fn room_wait_over(&self) {
        self.room_wait.store(room_wait::NONE, Ordering::SeqCst);
    }

    /// Called by the subscription each time it takes a batch, `queued` source batches left: once half
    /// the source channel is free, ends the consumer thread's wait for room, if it waits for it, so the
    /// thread hands out more now rather than at its wait's timeout (and several batches per wake, not
    /// one). Costs a comparison per batch, and an atomic swap once half is free.
    pub(crate) fn room_made(&self, commands: &std::sync::mpsc::Sender<Command>, queued: usize) {
        if queued > ROOM_WAKE_AT {
            return;
        }
        // Pairs with the fence in `expect_room` (the channel's own counts are not sequentially
        // consistent).
        fence(Ordering::SeqCst);
        match self.room_wait.swap(room_wait::NONE, Ordering::SeqCst) {
            room_wait::COMMANDS => {
                // A closed channel means the thread has gone: nothing to wake.
                let _ = commands.send(Command::Room);
            }
            room_wait::SOURCE => {
                if let Some(waker) = self.waker.get() {
                    waker.wake();
                }
            }
            _ => {}
        }
    }

    /// Whether copies wait for a transaction that can start now (not backing off after a failure).
    fn copies_waiting(&self) -> bool {
        let state = self.lock();
        !state.copies.is_empty()
            && state
                .transaction_retry_at
                .is_none_or(|at| Instant::now() >= at)
    }

    /// How long a poll waits for records when none wait to be handed out.
    fn idle_poll(&self) -> Duration {
        if self.hops.is_some() && !self.lock().copies.is_empty() {
            IDLE_POLL_TRANSACTIONAL
        } else {
            IDLE_POLL
        }
    }

    /// Whether copies go through transactions with the offsets (`transactional_hops`).
    pub(crate) fn transactional(&self) -> bool {
        self.hops.is_some()
    }

    /// A receipt settled `offset` of `tp`, read in `epoch`, with `copy` to be produced in the transaction
    /// that commits past it; the answer comes once that transaction committed, or failed for good: the
    /// broker refused the copy itself (the record is then unsettled again, for the runtime to release),
    /// or the partition moved to another member (which consumes the record again) or the consumer
    /// closed.
    pub(crate) fn settled_with_copy(
        &self,
        tp: &Tp,
        offset: i64,
        epoch: u64,
        copy: Copy,
    ) -> tokio::sync::oneshot::Receiver<Result<(), Error>> {
        let (done, outcome) = tokio::sync::oneshot::channel();
        let mut state = self.lock();
        if state.offsets.settled(tp, offset, epoch) {
            state.copies.push(PendingCopy {
                tp: tp.clone(),
                offset,
                epoch,
                since: Instant::now(),
                copy,
                done,
            });
            drop(state);
            // The thread's wait ends for the transaction to start now, not at its next look.
            if let Some(waker) = self.waker.get() {
                waker.wake();
            }
        } else {
            let _ = done.send(Err(moved(tp)));
        }
        outcome
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
    fn keep(&self, read: Vec<Read>, priority: bool) {
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
    fn serve_commands(&self, consumer: &BaseConsumer<Worker>, wait: Duration) -> bool {
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

    /// Whether to read more now. A full backlog stops reading without pausing: a pause makes librdkafka
    /// drop everything it fetched ahead and fetch it again, which costs far more than waiting while the
    /// runtime catches up. Only a backlog full for `STALL_AFTER` pauses the partitions, so that polling
    /// (and the group membership) can go on.
    fn may_read(&self) -> bool {
        let mut state = self.lock();
        let backlog = state.pending.len();
        if backlog < PENDING_HIGH {
            state.full_since = None;
            if backlog < PENDING_LOW {
                state.stalled = false;
            }
            return true;
        }
        let since = *state.full_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= STALL_AFTER {
            state.stalled = true;
        }
        state.stalled
    }

    /// Pauses or resumes every assigned partition as the runtime's hold and a stalled backlog say.
    fn apply_pause(&self, consumer: &BaseConsumer<Worker>) {
        let want = {
            let state = self.lock();
            let want = state.held_by_runtime || state.stalled;
            if want == state.paused {
                return;
            }
            want
        };
        let Ok(assignment) = consumer.assignment() else {
            return;
        };
        let result = if want {
            consumer.pause(&assignment)
        } else {
            resume(consumer, &assignment, "kafka-resume-discarded")
        };
        match result {
            Ok(()) => self.lock().paused = want,
            Err(e) => warn!(error = %e, "pausing or resuming the partitions failed"),
        }
    }

    /// Resumes every assigned partition again, at most once per [`RESUME_AGAIN_EVERY`] (`last` says
    /// when it last did), while none is meant to be paused: a resume librdkafka dropped is made good.
    fn resume_again(&self, consumer: &BaseConsumer<Worker>, last: &mut Instant) {
        if last.elapsed() < RESUME_AGAIN_EVERY {
            return;
        }
        *last = Instant::now();
        if self.lock().paused {
            return;
        }
        if let Ok(assignment) = consumer.assignment()
            && assignment.count() > 0
            && let Err(e) = consumer.resume(&assignment)
        {
            warn!(error = %e, "resuming the partitions again failed");
        }
    }

    /// Commits the settled prefixes (of `only`, if given) not committed yet, without waiting.
    fn commit(&self, consumer: &BaseConsumer<Worker>, only: Option<&[Tp]>, mode: CommitMode) {
        let commits = self.lock().offsets.take_commits(only);
        self.send_commits(consumer, commits, mode);
    }

    /// Commits the settled prefixes of partitions being let go (of `only`, if given) and waits for the
    /// broker, also where an asynchronous commit of the same position is still in flight.
    fn commit_before_letting_go(&self, consumer: &BaseConsumer<Worker>, only: Option<&[Tp]>) {
        let commits = self.lock().offsets.final_commits(only);
        self.send_commits(consumer, commits, CommitMode::Sync);
    }

    fn send_commits(
        &self,
        consumer: &BaseConsumer<Worker>,
        mut commits: Vec<(Tp, i64)>,
        mode: CommitMode,
    ) {
        if let Some(hops) = &self.hops {
            let copies = self.copies_due(&commits);
            if !copies.is_empty() {
                // The partitions with copies commit in the transaction; the others go on plainly,
                // whatever becomes of it.
                let (with, without): (Vec<Commit>, Vec<Commit>) = commits
                    .into_iter()
                    .partition(|(tp, _)| copies.iter().any(|c| c.tp == *tp));
                self.commit_in_transaction(hops, consumer, &with, copies);
                commits = without;
            }
        }
        if commits.is_empty() {
            return;
        }
        // A process that dies here has settled (and copied) records and not committed them; a commit of
        // the first record received settles nothing, and is not that crash point.
        #[cfg(feature = "failpoints")]
        if self.lock().offsets.passes_settled(&commits) {
            fail::fail_point!("kafka-before-commit", |_| std::process::abort());
        }
        if let Err(e) = consumer.commit(&offset_list(&commits), mode) {
            debug!(error = %e, "commit failed; it is tried again");
            self.lock().offsets.commit_failed(&commits);
        }
    }

    /// Takes the copies waiting of the records `commits` pass, and those stranded: waiting longer than
    /// [`STRANDED_AFTER`] for a commit that passes their record.
    fn copies_due(&self, commits: &[(Tp, i64)]) -> Vec<PendingCopy> {
        let mut state = self.lock();
        let (due, rest): (Vec<PendingCopy>, Vec<PendingCopy>) = std::mem::take(&mut state.copies)
            .into_iter()
            .partition(|c| {
                c.since.elapsed() >= STRANDED_AFTER
                    || commits
                        .iter()
                        .any(|(tp, point)| *tp == c.tp && c.offset < *point)
            });
        state.copies = rest;
        due
    }

    /// Commits `commits` with `copies` in one transaction and answers each copy's receipt; after a
    /// failure the copies wait for the next commit, and the offsets are tried again with them.
    fn commit_in_transaction(
        &self,
        hops: &Hops,
        consumer: &BaseConsumer<Worker>,
        commits: &[(Tp, i64)],
        copies: Vec<PendingCopy>,
    ) {
        let tpl = offset_list(commits);
        let retry_at = self.lock().transaction_retry_at;
        let outcome = match (retry_at, consumer.group_metadata()) {
            (Some(at), _) if Instant::now() < at => Err(None),
            (_, None) => Err(None),
            (_, Some(group)) => {
                let records: Vec<&Copy> = copies.iter().map(|c| &c.copy).collect();
                let mut producer = hops.producer.lock().unwrap_or_else(|p| p.into_inner());
                producer
                    .commit(&hops.link, &records, &tpl, &group)
                    .map_err(Some)
            }
        };
        let mut state = self.lock();
        match outcome {
            Ok(()) => {
                state.transaction_retry_at = None;
                state.transaction_failures = 0;
                drop(state);
                for c in copies {
                    let _ = c.done.send(Ok(()));
                }
            }
            Err(aborted) => {
                state.offsets.commit_failed(commits);
                let mut refused = Vec::new();
                let mut again = Vec::new();
                match aborted {
                    None => again = copies,
                    Some(aborted) => {
                        warn!(error = %aborted.error, "a transaction of copies and offsets failed");
                        // A copy the broker refused (answered below, without it the transaction can
                        // commit) is not the transaction's failure: the others go again at once and
                        // count no failure, so one refused copy (a DLQ that takes no more) does not
                        // fail the retry copies beside it.
                        let refused_copy =
                            aborted.copies.iter().flatten().any(|e| !e.is_temporary());
                        if !refused_copy {
                            state.transaction_retry_at = Some(Instant::now() + TRANSACTION_BACKOFF);
                            state.transaction_failures += 1;
                        }
                        // Transactions that keep failing (the broker unreachable, transactions
                        // refused) answer their copies with the error, as a send that fails would:
                        // the runtime then holds, releases or tries again, and the failure shows.
                        let give_up = state.transaction_failures >= TRANSACTION_TRIES;
                        if give_up {
                            state.transaction_failures = 0;
                        }
                        for (c, e) in copies.into_iter().zip(aborted.copies) {
                            match e {
                                // The broker refused this copy: it will not take it by trying again.
                                Some(e) if !e.is_temporary() => refused.push((c, e)),
                                _ if give_up => refused.push((
                                    c,
                                    Error::new(aborted.error.kind(), aborted.error.to_string())
                                        .temporary(aborted.error.is_temporary()),
                                )),
                                _ => again.push(c),
                            }
                        }
                    }
                }
                for (c, _) in &refused {
                    state.offsets.unsettle(&c.tp, c.offset, c.epoch);
                }
                again.append(&mut state.copies);
                state.copies = again;
                drop(state);
                for (c, e) in refused {
                    let _ = c.done.send(Err(e));
                }
            }
        }
    }

    /// Lets partitions go (all of them, closing): their copies waiting are answered with an error and
    /// their records unsettled again — so no commit, the one leaving the group makes included, passes a
    /// record whose copy was not produced; whoever owns the partitions next consumes them again — and
    /// revoked partitions are forgotten in the same step, so no copy arrives in between.
    fn let_go(&self, only: Option<&[Tp]>) {
        let dropped: Vec<PendingCopy> = {
            let mut state = self.lock();
            let (dropped, kept): (Vec<PendingCopy>, Vec<PendingCopy>) =
                std::mem::take(&mut state.copies)
                    .into_iter()
                    .partition(|c| only.is_none_or(|tps| tps.contains(&c.tp)));
            state.copies = kept;
            for c in &dropped {
                state.offsets.unsettle(&c.tp, c.offset, c.epoch);
            }
            // Closing, the partitions stay: the revoke that leaving the group brings commits what was
            // settled meanwhile, never past a record unsettled here.
            for tp in only.unwrap_or_default() {
                state.offsets.revoked(tp);
            }
            dropped
        };
        for c in dropped {
            let _ = c.done.send(Err(moved(&c.tp)));
        }
    }
}

/// A partition and the offset to commit there.
type Commit = (Tp, i64);

/// `commits` as librdkafka's list of partition offsets.
fn offset_list(commits: &[(Tp, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in commits {
        if let Err(e) = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset)) {
            warn!(error = %e, "building a commit failed");
        }
    }
    tpl
}

/// The error of a copy whose record this member no longer owns.
fn moved(tp: &Tp) -> Error {
    Error::new(
        event_retry_core::error::Kind::Closed,
        format!(
            "{} partition {} is no longer this member's: its copy was not committed, and the record is consumed again",
            tp.0, tp.1
        ),
    )
}

impl ClientContext for Worker {
    fn stats(&self, statistics: Statistics) {
        self.brokers.observe(&statistics);
    }
}

impl ConsumerContext for Worker {
    /// rdkafka's rebalance, with the start of each new partition that has no committed offset named.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        crate::start::rebalance(self, consumer, err, partitions, self.reset);
    }

    /// An asynchronous commit that failed (e.g. during a rebalance) is tried again with the next one.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(e) = result {
            debug!(error = %e, "commit failed; it is tried again");
            let failed: Vec<(Tp, i64)> = offsets
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some(((Arc::from(e.topic()), e.partition()), o)),
                    _ => None,
                })
                .collect();
            self.lock().offsets.commit_failed(&failed);
        }
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let revoked: Vec<Tp> = tpl
            .elements()
            .iter()
            .map(|e| (Arc::from(e.topic()), e.partition()))
            .collect();
        {
            // Records read but never handed out are not waited for: their new owner reads them again
            // (the commit point goes back to the first of them). Those in the hand-off channels and
            // the subscription's current batch are given back by the subscription once it sees the
            // partitions marked (`KafkaSubscription::sweep`): the wait below is for the work the
            // runtime has, not for up to 32 batches queued ahead of it.
            let mut state = self.lock();
            let State {
                pending,
                priority,
                offsets,
                reassigned,
                ..
            } = &mut *state;
            for queue in [pending, priority] {
                queue.retain(|r| {
                    let keep = !revoked.contains(&r.tp);
                    if !keep {
                        offsets.unread(&r.tp, r.offset);
                    }
                    keep
                });
            }
            for tp in &revoked {
                offsets.revoking(tp);
            }
            *reassigned = true;
        }
        if !consumer.assignment_lost() {
            // Let the work handed out on these partitions finish and commit it, unless the runtime holds
            // consumption (a blocking hold may last long; that record is simply consumed again).
            let deadline = Instant::now() + self.revoke_grace;
            loop {
                let busy = {
                    let state = self.lock();
                    !state.held_by_runtime
                        && !state.closing
                        && revoked.iter().any(|tp| state.offsets.in_flight(tp) > 0)
                };
                if !busy || Instant::now() > deadline {
                    break;
                }
                // A close asked for meanwhile ends the wait and is seen again by the main loop.
                self.serve_commands(consumer, Duration::from_millis(20));
            }
            self.commit_before_letting_go(consumer, Some(&revoked));
        }
        self.let_go(Some(&revoked));
        debug!(partitions = ?revoked, "partitions revoked");
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                self.joined.store(true, Ordering::Release);
                let mut state = self.lock();
                state.reassigned = true;
                for e in tpl.elements() {
                    state
                        .offsets
                        .assigned((Arc::from(e.topic()), e.partition()));
                }
                let paused = state.paused;
                drop(state);
                // librdkafka keeps an application's pause of a partition across its revocation, so a
                // partition coming back may still be paused: set every assigned one as it should be.
                let result = if paused {
                    consumer.pause(tpl)
                } else {
                    consumer.resume(tpl)
                };
                if let Err(e) = result {
                    warn!(error = %e, "pausing or resuming newly assigned partitions failed");
                }
                debug!(partitions = tpl.count(), "partitions assigned");
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }
}

/// The retry topic's partitions, each split off into a queue of its own: librdkafka then fetches and
/// queues them apart from the source's (whose prefetch, full during a backlog, would otherwise stop their
/// fetches too), and the thread reads them first.
struct PriorityQueues {
    topic: String,
    queues: Vec<PartitionQueue<Worker>>,
}

impl PriorityQueues {
    /// Splits off every assigned partition of the retry topic (an assignment undoes earlier splits);
    /// `false` if it could not, to be tried again.
    fn split(&mut self, consumer: &Arc<BaseConsumer<Worker>>, waker: &Waker) -> bool {
        self.queues.clear();
        let Ok(assignment) = consumer.assignment() else {
            return false;
        };
        for e in assignment.elements_for_topic(&self.topic) {
            match consumer.split_partition_queue(&self.topic, e.partition()) {
                Some(mut queue) => {
                    // A record here ends the thread's wait on the source's queue.
                    let waker = waker.clone();
                    queue.set_nonempty_callback(move || waker.wake());
                    self.queues.push(queue);
                }
                None => return false,
            }
        }
        true
    }

    /// Reads what the split queues hold, up to a batch each, without waiting — none while the records
    /// read from them wait in numbers for the runtime.
    fn read(&self, worker: &Worker, chunks: &mut Chunks) {
        if worker.lock().priority.len() >= PENDING_HIGH {
            return;
        }
        for queue in &self.queues {
            let (read, error) = read_batch(queue.poll(Duration::ZERO), chunks, || {
                queue.poll(Duration::ZERO)
            });
            worker.keep(read, true);
            if let Some(e) = error {
                warn!(error = %e, "consumer error on the retry topic");
            }
        }
    }
}

/// How many of `queue`'s first records make the next batch handed out: up to [`HANDOUT_BATCH`] records
/// and up to the one that reaches [`HANDOUT_BYTES`].
fn batch_len(queue: &VecDeque<Record>) -> usize {
    let mut bytes = 0;
    queue
        .iter()
        .take(HANDOUT_BATCH)
        .position(|record| {
            bytes += record.copied.len();
            bytes >= HANDOUT_BYTES
        })
        .map_or(queue.len().min(HANDOUT_BATCH), |last| last + 1)
}

/// Reads records from `first` on, taking the next ones from `next` (which does not wait), up to
/// [`HANDOUT_BATCH`], each copied into `chunks` as it is read and its message destroyed then, before the
/// batch is kept under the state's lock; with the error that ended the read, if one did.
fn read_batch<'c>(
    first: Option<KafkaResult<BorrowedMessage<'c>>>,
    chunks: &mut Chunks,
    mut next: impl FnMut() -> Option<KafkaResult<BorrowedMessage<'c>>>,
) -> (Vec<Read>, Option<KafkaError>) {
    let mut read: Vec<Read> = Vec::new();
    let mut polled = first;
    while let Some(result) = polled {
        match result {
            Ok(message) => {
                let topic = match read.last() {
                    Some(last) if *last.topic == *message.topic() => last.topic.clone(),
                    _ => Arc::from(message.topic()),
                };
                read.push(Read {
                    topic,
                    partition: message.partition(),
                    offset: message.offset(),
                    copied: Copied::from_message(&message, chunks),
                });
            }
            Err(e) => return (read, Some(e)),
        }
        if read.len() == HANDOUT_BATCH {
            break;
        }
        polled = next();
    }
    (read, None)
}

/// Forwards every assigned partition of the source topic to `source`; `false` if one could not be.
fn attach_source(consumer: &BaseConsumer<Worker>, source: &SourceQueue, topic: &str) -> bool {
    let Ok(assignment) = consumer.assignment() else {
        return false;
    };
    assignment
        .elements_for_topic(topic)
        .iter()
        .all(|e| source.attach(consumer, e.partition()))
}

/// Reads what the consumer's own queue (`main`) holds, without waiting, to its end — past the events
/// served on the way — and keeps its records; how many it read.
fn drain_main(
    consumer: &BaseConsumer<Worker>,
    main: &ConsumerQueue,
    worker: &Worker,
    chunks: &mut Chunks,
    out: &tokio::sync::mpsc::Sender<handoff::Batch>,
) -> usize {
    let mut total = 0;
    loop {
        let (read, error) = read_batch(consumer.poll(Duration::ZERO), chunks, || {
            consumer.poll(Duration::ZERO)
        });
        total += read.len();
        worker.keep(read, false);
        if let Some(e) = error {
            report_error(out, e);
        }
        if main.is_empty() {
            return total;
        }
    }
}

/// Hands a consumer error to the runtime (if the channel has room) and logs it.
fn report_error(out: &tokio::sync::mpsc::Sender<handoff::Batch>, e: KafkaError) {
    warn!(error = %e, "consumer error");
    if out.try_send(Err(consume_error(e))).is_err() {
        debug!("the consumer error was not handed out: the channel is full");
    }
}

/// Runs the consumer of `source_topic` until the subscription closes or goes away; records of
/// `retry_topic` are read and handed out before the source's.
pub(crate) fn run(
    consumer: BaseConsumer<Worker>,
    out: Senders,
    source_topic: String,
    retry_topic: String,
) {
    let mut consumer = consumer;
    let (Some(source), Some(main_queue)) = (
        SourceQueue::new(&consumer, &source_topic),
        ConsumerQueue::new(&consumer),
    ) else {
        let _ = out.source.try_send(Err(Error::new(
            event_retry_core::error::Kind::Other,
            "librdkafka gave no handle on the consumer's queues",
        )));
        return;
    };
    let waker = source.waker();
    // Whatever comes to the consumer's own queue — a rebalance, an error, a record of a partition not
    // forwarded yet — ends the wait on the source's.
    consumer.set_nonempty_callback({
        let waker = waker.clone();
        move || waker.wake()
    });
    let consumer = Arc::new(consumer);
    let worker = consumer.context().clone();
    let _ = worker.waker.set(waker.clone());
    let mut priority = PriorityQueues {
        topic: retry_topic,
        queues: Vec::new(),
    };
    let mut last_commit = Instant::now();
    let mut resumed_again = Instant::now();
    let mut chunks = Chunks::default();
    loop {
        if worker.serve_commands(&consumer, Duration::ZERO) {
            break;
        }
        worker.brokers.heal(consumer.client());
        if std::mem::take(&mut worker.lock().reassigned) {
            // The broker tests widen the window in which a new partition's records reach the
            // consumer's own queue before it is forwarded (`sleep`), to show the order kept by
            // `drain_main` below.
            #[cfg(feature = "failpoints")]
            fail::fail_point!("kafka-before-forward");
            if !priority.split(&consumer, &waker)
                || !attach_source(&consumer, &source, &source_topic)
            {
                warn!("splitting the topics' partitions off failed; trying again");
                worker.lock().reassigned = true;
            }
        }
        // A copy's receipt waits for its transaction: commit soon after one waits.
        if last_commit.elapsed() >= COMMIT_INTERVAL
            || (last_commit.elapsed() >= IDLE_POLL_TRANSACTIONAL && worker.copies_waiting())
        {
            worker.commit(&consumer, None, CommitMode::Async);
            last_commit = Instant::now();
        }
        priority.read(&worker, &mut chunks);
        // Hand out what waits in batches (one wake-up of the runtime per batch), as far as the channel
        // has room: the retry topic's records first.
        {
            let mut state = worker.lock();
            let State {
                pending,
                priority: first,
                ..
            } = &mut *state;
            for (queue, channel) in [(first, &out.retries), (pending, &out.source)] {
                while !queue.is_empty() {
                    let Ok(permit) = channel.try_reserve() else {
                        break;
                    };
                    let n = batch_len(queue);
                    permit.send(Ok(queue.drain(..n).collect()));
                }
            }
        }
        if out.is_closed() {
            break;
        }
        let read = worker.may_read();
        worker.apply_pause(&consumer);
        worker.resume_again(&consumer, &mut resumed_again);
        if !read {
            // The runtime is behind: wait until it takes a batch (or a command comes), and hand out more.
            if worker.expect_room(&out, room_wait::COMMANDS) {
                let closing = worker.serve_commands(&consumer, ROOM_WAIT);
                worker.room_wait_over();
                if closing {
                    break;
                }
            }
            continue;
        }
        // The consumer's own queue first, to its end (events, and records of partitions not forwarded
        // yet), without waiting; then the source's, waiting there when nothing else came. A
        // partition's records that reached the consumer's queue before it was forwarded are so kept
        // before any later record of it (the broker test
        // `records_that_reached_the_consumers_queue_before_forwarding_keep_their_order`: it fails
        // with this queue read one batch at a time).
        let main = drain_main(&consumer, &main_queue, &worker, &mut chunks, &out.source);
        let waiting = {
            let state = worker.lock();
            !state.pending.is_empty() || !state.priority.is_empty()
        };
        // What is read waits for room in the channel: read on, until the runtime takes a batch.
        let room_wait = main == 0 && waiting && worker.expect_room(&out, room_wait::SOURCE);
        let wait = if main > 0 || (waiting && !room_wait) {
            Duration::ZERO
        } else if waiting {
            ROOM_WAIT
        } else {
            worker.idle_poll()
        };
        let items = source.read(wait, HANDOUT_BATCH, &mut chunks);
        if room_wait {
            worker.room_wait_over();
        }
        // Sized once: grown push by push, the records (about 100 bytes each) were copied again at
        // every doubling.
        let mut read = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Item::Record(topic, partition, offset, copied) => read.push(Read {
                    topic,
                    partition,
                    offset,
                    copied,
                }),
                Item::Error(e) => report_error(&out.source, e),
            }
        }
        worker.keep(read, false);
    }
    // The split queues hold the consumer: gone before it is dropped (which leaves the group), as is
    // the source's queue (librdkafka's queues go before their client).
    priority.queues.clear();
    // No callback holds the source's queue once its waker is closed: its last reference goes here.
    waker.close();
    drop(waker);
    drop(source);
    drop(main_queue);
    // Whatever was settled is committed before leaving, whether the subscription closed or was dropped.
    worker.lock().closing = true;
    worker.serve_commands(&consumer, Duration::ZERO);
    worker.commit_before_letting_go(&consumer, None);
    worker.let_go(None);
    // Dropping leaves the group (the revoke commits again, without waiting).
    drop(consumer);
    if let Some(done) = worker.lock().close_waiter.take() {
        let _ = done.send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Chunks;

    /// `n` records of `size` payload bytes each (no key, no headers).
    fn records(n: usize, size: usize) -> VecDeque<Record> {
        let mut chunks = Chunks::default();
        let payload = vec![b'x'; size];
        (0..n)
            .map(|offset| Record {
                tp: (Arc::from("t"), 0),
                offset: offset as i64,
                epoch: 0,
                generation: 0,
                copied: Copied::from_parts(
                    &payload,
                    None,
                    std::iter::empty,
                    rdkafka::Timestamp::NotAvailable,
                    &mut chunks,
                ),
            })
            .collect()
    }

    #[test]
    fn a_batch_of_small_records_is_bounded_by_its_count() {
        assert_eq!(batch_len(&records(1000, 100)), HANDOUT_BATCH);
        assert_eq!(batch_len(&records(10, 100)), 10);
        assert_eq!(batch_len(&VecDeque::new()), 0);
    }

    #[test]
    fn a_batch_of_large_records_ends_with_the_one_that_reaches_its_bytes() {
        // 16 KiB each: the 16th reaches 256 KiB.
        assert_eq!(batch_len(&records(100, 16 * 1024)), 16);
        // One record beyond the bound still goes out, alone.
        assert_eq!(batch_len(&records(3, HANDOUT_BYTES + 1)), 1);
    }
}
