//! The thread that owns a consumer group member of a source topic and its group's retry topic: its
//! loop.
//!
//! librdkafka wants one thread to poll a consumer, and the group membership holds only while it polls
//! (`max.poll.interval.ms`), so the thread polls all the time — also while consumption is paused
//! ([`super::pause`]). It hands records to the subscription through bounded channels
//! ([`crate::consumer::handoff`]), keeping the rest in a bounded backlog; while the backlog is full it
//! stops reading (librdkafka's own prefetch is bounded too).
//!
//! The group's retry topic comes first: its partitions are split off into queues of their own, which
//! librdkafka fetches apart from the source's prefetch, and the thread reads them and hands their records
//! out before the source's, through a channel the subscription takes from first, so a due retry waits
//! neither behind a backlog of the source nor behind the source batches already handed out — only for
//! the rest of the batch being taken.
//!
//! The source's partitions are forwarded to a queue of the thread's own, read in batches and waited
//! on (see [`crate::consumer::feed`]); the consumer's queue, polled without waiting, brings the rebalances and
//! errors, and wakes that wait when something comes to it, as do the retry topic's queues. After each
//! assignment the thread forwards the partitions again and reads whatever came to the consumer's queue
//! meanwhile before anything of the source's queue, so that a partition's records keep their order.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_retry_core::error::Error;
use rdkafka::Message;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::BorrowedMessage;
use tracing::{debug, warn};

use crate::codec::{Chunks, Copied};
use crate::consumer::context::{Context, Read, State, room_wait};
use crate::consumer::feed::{ConsumerQueue, Item, SourceQueue, Waker};
use crate::consumer::handoff::{self, Record, Senders};
use crate::consumer::pause::PENDING_HIGH;
use crate::consumer::room::ROOM_WAIT;
use crate::error::consume_error;

/// How often the settled offsets are committed.
const COMMIT_INTERVAL: Duration = Duration::from_millis(50);
/// How long a poll waits for records when none wait to be handed out.
const IDLE_POLL: Duration = Duration::from_millis(50);
/// The same while copies wait for their transaction (transactional hops): a copy handed over wakes the
/// wait, and one that must wait — for the previous transaction's spacing, for an earlier record's settle
/// or after a failure — is looked at again this soon.
const IDLE_POLL_TRANSACTIONAL: Duration = Duration::from_millis(5);

/// The most records handed to the subscription at once.
const HANDOUT_BATCH: usize = 256;
/// The most bytes of records (payload, key and headers) handed to the subscription at once, beyond the
/// record that passes it: with [`handoff::SOURCE_BATCHES`] it bounds the memory in the source's channel
/// (about 8 MiB where records are smaller than this).
const HANDOUT_BYTES: usize = 256 * 1024;

impl Context {
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
        if self.txn.is_some() && !self.lock().copies.is_empty() {
            IDLE_POLL_TRANSACTIONAL
        } else {
            IDLE_POLL
        }
    }
}

/// The retry topic's partitions, each split off into a queue of its own: librdkafka then fetches and
/// queues them apart from the source's (whose prefetch, full during a backlog, would otherwise stop their
/// fetches too), and the thread reads them first.
struct PriorityQueues {
    topic: String,
    queues: Vec<PartitionQueue<Context>>,
}

impl PriorityQueues {
    /// Splits off every assigned partition of the retry topic (an assignment undoes earlier splits);
    /// `false` if it could not, to be tried again.
    fn split(&mut self, consumer: &Arc<BaseConsumer<Context>>, waker: &Waker) -> bool {
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
    fn read(&self, context: &Context, chunks: &mut Chunks) {
        if context.lock().priority.len() >= PENDING_HIGH {
            return;
        }
        for queue in &self.queues {
            let (read, error) = read_batch(queue.poll(Duration::ZERO), chunks, || {
                queue.poll(Duration::ZERO)
            });
            context.keep(read, true);
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
fn attach_source(consumer: &BaseConsumer<Context>, source: &SourceQueue, topic: &str) -> bool {
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
    consumer: &BaseConsumer<Context>,
    main: &ConsumerQueue,
    context: &Context,
    chunks: &mut Chunks,
    out: &tokio::sync::mpsc::Sender<handoff::Batch>,
) -> usize {
    let mut total = 0;
    loop {
        let (read, error) = read_batch(consumer.poll(Duration::ZERO), chunks, || {
            consumer.poll(Duration::ZERO)
        });
        total += read.len();
        context.keep(read, false);
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
    consumer: BaseConsumer<Context>,
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
    let context = consumer.context().clone();
    let _ = context.waker.set(waker.clone());
    let mut priority = PriorityQueues {
        topic: retry_topic,
        queues: Vec::new(),
    };
    let mut last_commit = Instant::now();
    let mut resumed_again = Instant::now();
    let mut chunks = Chunks::default();
    loop {
        if context.serve_commands(&consumer, Duration::ZERO) {
            break;
        }
        context.brokers.heal(consumer.client());
        if std::mem::take(&mut context.lock().reassigned) {
            // The broker tests widen the window in which a new partition's records reach the
            // consumer's own queue before it is forwarded (`sleep`), to show the order kept by
            // `drain_main` below.
            #[cfg(feature = "failpoints")]
            failpoint!("kafka-before-forward");
            if !priority.split(&consumer, &waker)
                || !attach_source(&consumer, &source, &source_topic)
            {
                warn!("splitting the topics' partitions off failed; trying again");
                context.lock().reassigned = true;
            }
        }
        // A copy's receipt waits for its transaction: commit soon after one waits.
        if last_commit.elapsed() >= COMMIT_INTERVAL
            || (last_commit.elapsed() >= IDLE_POLL_TRANSACTIONAL && context.copies_waiting())
        {
            context.commit(&consumer, None, CommitMode::Async);
            last_commit = Instant::now();
        }
        priority.read(&context, &mut chunks);
        // Hand out what waits in batches (one wake-up of the runtime per batch), as far as the channel
        // has room: the retry topic's records first.
        {
            let mut state = context.lock();
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
        let read = context.may_read();
        context.apply_pause(&consumer);
        context.resume_again(&consumer, &mut resumed_again);
        if !read {
            // The runtime is behind: wait until it takes a batch (or a command comes), and hand out more.
            if context.expect_room(&out, room_wait::COMMANDS) {
                let closing = context.serve_commands(&consumer, ROOM_WAIT);
                context.room_wait_over();
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
        let main = drain_main(&consumer, &main_queue, &context, &mut chunks, &out.source);
        let waiting = {
            let state = context.lock();
            !state.pending.is_empty() || !state.priority.is_empty()
        };
        // What is read waits for room in the channel: read on, until the runtime takes a batch.
        let room_wait = main == 0 && waiting && context.expect_room(&out, room_wait::SOURCE);
        let wait = if main > 0 || (waiting && !room_wait) {
            Duration::ZERO
        } else if waiting {
            ROOM_WAIT
        } else {
            context.idle_poll()
        };
        let items = source.read(wait, HANDOUT_BATCH, &mut chunks);
        if room_wait {
            context.room_wait_over();
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
        context.keep(read, false);
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
    context.lock().closing = true;
    context.serve_commands(&consumer, Duration::ZERO);
    context.commit_before_letting_go(&consumer, None);
    context.let_go(None);
    // Dropping leaves the group (the revoke commits again, without waiting).
    drop(consumer);
    if let Some(done) = context.lock().close_waiter.take() {
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
