//! A consumer of a source topic and its group's retry topic, and the receipts that settle its records.
//!
//! A receipt settles by reporting its offset to the consumer thread, which commits it once everything
//! before it in the partition is settled too. A retry is a copy produced into the delay ladder (or
//! straight to the retry topic when there is no delay) and a dead letter a copy produced to the DLQ,
//! each acknowledged by every in-sync replica of the idempotent producer before the offset is reported —
//! or, with transactional hops, handed to the consumer thread with the settle and committed with the
//! offset in one transaction.
//! A receipt dropped unsettled leaves its offset uncommitted: the record is consumed again when its
//! partition moves to another member or the group restarts.
//!
//! The ladder hands a retry over a little before it is due ([`crate::ladder::HANDOVER_LEAD`]), so that the
//! way through the retry topic does not make it late; a record of the retry topic that arrives before
//! its `x-retry-due-at` is held here, in due order, and handed to the runtime at that time (at most
//! [`EARLY_HOLD_MAX`] after it arrived: a due time further away says the clocks disagree, and the record
//! goes on rather than wait for a clock).

use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::time::Duration;

use async_trait::async_trait;
use event_retry_core::adapter::{
    Delivery, DeliveryInfo, Receipt, Subscription, SubscriptionSpec, Unsettled,
};
use event_retry_core::error::{Error, Kind, wrap};
use event_retry_core::event::{Event, RawMessage};
use event_retry_core::metadata::{Origin, names};
use event_retry_core::time::Timestamp;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::codec::{self, Copied, Nulls};
use crate::consumer::context::{Command, Context};
use crate::consumer::handoff::{self, Record};
use crate::consumer::offsets::Tp;
use crate::consumer::txn::{SharedTxnProducer, StagedCopy};
use crate::consumer::worker;
use crate::ladder::mover::Ladder;
use crate::link::Link;
use crate::stranding::{BrokerWatch, report_statistics};

/// How long the consumer's fetch waits at the broker for records, in ms. The consumer fetches the source
/// and the group's (mostly empty) retry topic in one request per broker, and librdkafka sends the next
/// request only once the one in flight returns: partitions left out of a request — the source's while
/// its prefetch queue was full, or before their start offsets were known — wait for a request of the
/// empty retry partitions to time out, as does a partition resumed after a pause. Measured with the
/// Kafka bench (1 KB records): 100 ms held the consumer to 220,000 records/s and its first record 200 ms
/// after joining the group; 25 ms, 270,000–320,000 and 130 ms. The cost: an idle consumer sends a fetch
/// every 25 ms (the ladder's consumer one every 20 ms).
const SOURCE_FETCH_WAIT_MS: &str = "25";

/// Sets how long the consumer's fetch waits at the broker to [`SOURCE_FETCH_WAIT_MS`] (librdkafka's
/// default is 500 ms), unless the user's `rdkafka.fetch.wait.max.ms` set it.
fn default_fetch_wait(config: &mut rdkafka::ClientConfig) {
    if config.get("fetch.wait.max.ms").is_none() {
        config.set("fetch.wait.max.ms", SOURCE_FETCH_WAIT_MS);
    }
}

/// The longest a record of the retry topic that came before its due time is held.
const EARLY_HOLD_MAX: Duration = Duration::from_secs(1);

/// How long a new subscription waits for its consumers to join their groups.
const JOIN_WAIT: Duration = Duration::from_secs(10);

/// Subscribes to `spec.topic` and the retry topic of `spec.group`, and starts the topic's ladder
/// consumer.
pub(crate) async fn subscribe(
    link: Arc<Link>,
    spec: SubscriptionSpec,
) -> Result<KafkaSubscription, Error> {
    let retry_topic = link.config.retry_topic(&spec.topic, &spec.group);
    let (commands, command_rx) = std::sync::mpsc::channel();
    let txn = link.config.transactional_hops.then(|| {
        SharedTxnProducer::new(link.clone(), &format!("{}-{}", spec.group, spec.consumer))
    });
    let mut config = link.consumer_config(&spec.group);
    config.set("client.id", &spec.consumer);
    default_fetch_wait(&mut config);
    report_statistics(&mut config);
    let context = Context::new(
        command_rx,
        link.config.revoke_grace,
        txn,
        BrokerWatch::new(&config)?,
        crate::consumer::start::reset_position(&config),
    );
    // The range assignor shares out each topic's partitions on its own, so every member of a group gets
    // its share of the source topic (and, for per-key order, the same partition numbers of the source
    // and retry topics, which have the same count). The cooperative assignor balances only the total
    // count: a member that joined a running one was given the retry topic's partitions and none of the
    // source's (measured: 2 processes, one handled all 100,000 events). Every member of a group must
    // agree on the assignor; the ladder's own group keeps the cooperative one.
    config.set("partition.assignment.strategy", "range");
    let consumer: BaseConsumer<Context> = config
        .create_with_context(context)
        .map_err(crate::error::settings_error("consumer"))?;
    consumer
        .subscribe(&[spec.topic.as_str(), retry_topic.as_str()])
        .map_err(crate::error::error(format!("subscribe to {}", spec.topic)))?;
    let ladder = Ladder::start(link.clone(), &spec.topic)?;
    // Room for batches of records between the thread and the runtime, so neither often waits for the
    // other; a record whose partition was revoked meanwhile is dropped by `next`.
    let (out, inbound) = handoff::channels();
    let context = consumer.context().clone();
    let priority_topic = retry_topic.clone();
    let source_topic = spec.topic.clone();
    std::thread::Builder::new()
        .name(format!("kafka-{}", spec.topic))
        .spawn(move || worker::run(consumer, out, source_topic, priority_topic))
        .map_err(wrap(Kind::Other, "start the consumer thread"))?;
    // Return once both members joined their groups, so the first retries do not wait for the ladder's
    // consumer to start (bounded: a member that gets no partitions may not be told).
    let deadline = tokio::time::Instant::now() + JOIN_WAIT;
    while !(context.joined.load(Ordering::Acquire) && ladder.joined.load(Ordering::Acquire))
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let shared = Arc::new(Shared {
        link: link.clone(),
        context: context.clone(),
        dlq_topic: link.config.dlq_topic(&spec.topic),
        source: Arc::from(spec.topic.as_str()),
        group: spec.group.clone(),
        retry_topic,
    });
    Ok(KafkaSubscription {
        spec,
        shared,
        inbound,
        swept_retries: VecDeque::new(),
        swept: VecDeque::new(),
        swept_at: 0,
        batch: Vec::new().into_iter(),
        early: BinaryHeap::new(),
        held: 0,
        precise: None,
        commands,
        context,
        ladder: Some(ladder),
    })
}

/// One member of a consumer group on a source topic and its retry topic.
pub(crate) struct KafkaSubscription {
    spec: SubscriptionSpec,
    shared: Arc<Shared>,
    /// The batches the consumer thread hands over, the retry topic's first.
    inbound: handoff::Receivers,
    /// Records received and not yet handed to the runtime: the batch as the thread handed it over, taken
    /// from in place (each record moved out once, not copied into a queue of its own first).
    batch: std::vec::IntoIter<Record>,
    /// Retry topic batches taken off their channel by [`KafkaSubscription::sweep`], handed out before
    /// anything else.
    swept_retries: VecDeque<Vec<Record>>,
    /// Source batches taken off their channel by [`KafkaSubscription::sweep`], handed out before the
    /// source batches still in it, but after any retry batch that comes meanwhile; and an error that
    /// `take_next_batch` took off a channel, for `next` to return.
    swept: VecDeque<handoff::Batch>,
    /// The assignment's change count at the last sweep.
    swept_at: u64,
    /// Retries that came before their due time, held until it (earliest first).
    early: BinaryHeap<Early>,
    /// How many retries were held so far: orders those due at the same time by arrival.
    held: u64,
    /// The blocking sleep ending at the earliest held retry's due time, once that is near.
    precise: Option<(Timestamp, tokio::task::JoinHandle<()>)>,
    commands: Sender<Command>,
    context: Arc<Context>,
    ladder: Option<Ladder>,
}

impl KafkaSubscription {
    fn delivery(&self, record: Record) -> Delivery {
        let original = record.copied.clone();
        let decoded = record.copied.decode();
        let (topic, partition) = record.tp.clone();
        let origin = Origin::new(self.shared.source.clone()).at(partition, record.offset);
        let origin = match decoded.timestamp {
            Some(t) => origin.with_timestamp(t),
            None => origin,
        };
        // A source record's place names it (`<topic>/<partition>/<offset>`), made only if its event
        // has no id; a record of the retry topic is named by its own topic.
        let info = if *topic == *self.shared.source {
            DeliveryInfo::at(origin)
        } else {
            DeliveryInfo::new(format!("{topic}/{partition}/{}", record.offset), origin)
        };
        let receipt = Box::new(KafkaReceipt {
            shared: self.shared.clone(),
            partition,
            position: Unsettled::new(Position {
                tp: record.tp,
                offset: record.offset,
                epoch: record.epoch,
            }),
            original,
            nulls: decoded.nulls,
        });
        Delivery::new(decoded.raw, info, receipt)
    }
}

/// A retry held until its due time.
struct Early {
    /// When it is handed out.
    at: Timestamp,
    /// Arrival order, among those held.
    seq: u64,
    tp: Tp,
    offset: i64,
    epoch: u64,
    /// The assignment's change count when the record was read.
    generation: u64,
    delivery: Delivery,
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
const PRECISE_WITHIN: Duration = Duration::from_millis(3);

/// The last stretch of a held retry's wait, `d` (at most [`PRECISE_WITHIN`]), slept by a blocking
/// thread: a held retry waits with Tokio's timer until [`PRECISE_WITHIN`] before its due time, then
/// this way.
///
/// Why: Tokio's timer wakes on whole milliseconds, rounded up, and its driver sleeps in whole
/// milliseconds too, so a retry held to its due time that way started 1–2 ms after it (measured beside
/// Spring Kafka's retry topics, `scripts/peer-bench fixed`: p50 2 ms, as Spring's). A thread's sleep
/// ends within tens of microseconds of its time. One such sleep per subscription at a time (the
/// earliest held retry's; the retries due with it go at once), kept across a batch's arrival.
fn precise_sleep(d: Duration) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || std::thread::sleep(d))
}

/// What `x-retry-due-at` may lie below the true due time, in ms (see [`hold_until`]).
const DUE_AT_ROUNDING_MS: u64 = 1;

/// When a record of the retry topic whose event says when it is due (`x-retry-due-at`), received at
/// `now`, is to be handed out: `None` when it is due already (or says nothing), else its due time, at
/// most [`EARLY_HOLD_MAX`] away.
fn hold_until(message: &RawMessage, now: Timestamp) -> Option<Timestamp> {
    let due = message
        .headers
        .get(names::DUE_AT)
        .and_then(|value| std::str::from_utf8(value).ok()?.parse::<u64>().ok())
        // Whole milliseconds: the time the delay counts from was cut to the millisecond below (the
        // delay rounded up), so the true due time can be up to 1 ms later.
        .map(|ms| Timestamp::from_millis(ms.saturating_add(DUE_AT_ROUNDING_MS)))?;
    (due > now).then(|| due.min(now.plus(EARLY_HOLD_MAX)))
}

impl KafkaSubscription {
    /// Whether `tp` is still this member's in `epoch`, read when the assignment's change count was
    /// `generation` (a record read before a revocation is its new owner's). Without the consumer thread's
    /// lock while the assignment has not changed since.
    fn is_current(&self, tp: &Tp, epoch: u64, generation: u64) -> bool {
        self.context.changes.unchanged_since(generation)
            || self.context.lock().offsets.is_current(tp, epoch)
    }

    /// The earliest held retry, once it is due.
    fn due_early(&mut self) -> Option<Delivery> {
        while self.early.peek().is_some_and(|e| e.at <= Timestamp::now()) {
            let early = self.early.pop()?;
            if self.is_current(&early.tp, early.epoch, early.generation) {
                return Some(early.delivery);
            }
            self.give_back(&early.tp, early.offset, early.epoch);
        }
        None
    }

    /// Makes the next batch to hand out the current one, without waiting; `false` when none is at hand,
    /// or an error comes first (kept at the front of `swept`, for `next` to return). The order: retry
    /// batches swept off their channel, a retry batch in its channel, the swept source batches, a source
    /// batch in its channel. Taking what already waits in the channels means a batch handler's batch is
    /// not cut where the consumer thread's hand-out ends (16 records of 16 KB), and a stream of
    /// deliveries needs no `next` future per hand-out.
    fn take_next_batch(&mut self) -> bool {
        if let Some(records) = self.swept_retries.pop_front() {
            self.batch = records.into_iter();
            return true;
        }
        let taken = match self.inbound.try_recv_retries() {
            Some(taken) => taken,
            None => match self.swept.front() {
                Some(Ok(_)) => {
                    if let Some(Ok(records)) = self.swept.pop_front() {
                        self.batch = records.into_iter();
                    }
                    return true;
                }
                Some(Err(_)) => return false,
                None => match self.inbound.try_recv_source() {
                    Some(taken) => taken,
                    None => return false,
                },
            },
        };
        match taken {
            Ok(records) => {
                self.batch = records.into_iter();
                self.context
                    .room_made(&self.commands, self.inbound.source_queued());
                true
            }
            Err(e) => {
                self.swept.push_front(Err(e));
                false
            }
        }
    }

    /// Gives back a record not current any more ([`crate::consumer::offsets::Offsets::give_back`]).
    #[cold]
    #[inline(never)]
    fn give_back(&self, tp: &Tp, offset: i64, epoch: u64) {
        self.context.lock().offsets.give_back(tp, offset, epoch);
    }

    /// After the assignment changed (`now`, its change count), gives back every record held here and
    /// not current any more — the rest of the current batch, every batch queued in the channels
    /// (taken off them into `swept`) and the held retries — so that a partition being revoked waits
    /// only for the work the runtime already has, not for the records queued ahead of it; and dates
    /// the records kept `now`, which they are current at (checked under the consumer thread's lock).
    #[cold]
    #[inline(never)]
    fn sweep(&mut self, now: u64) {
        let mut taken = Vec::new();
        while let Some(batch) = self.inbound.try_recv_retries() {
            match batch {
                Ok(records) => self.swept_retries.push_back(records),
                Err(e) => taken.push(Err(e)),
            }
        }
        while let Some(batch) = self.inbound.try_recv_source() {
            taken.push(batch);
        }
        let mut state = self.context.lock();
        let offsets = &mut state.offsets;
        let mut keep = |record: &mut Record| {
            if offsets.is_current(&record.tp, record.epoch) {
                record.generation = now;
                true
            } else {
                offsets.give_back(&record.tp, record.offset, record.epoch);
                false
            }
        };
        let mut rest: Vec<Record> = std::mem::take(&mut self.batch).collect();
        rest.retain_mut(&mut keep);
        self.batch = rest.into_iter();
        for records in self.swept.iter_mut().chain(taken.iter_mut()).flatten() {
            records.retain_mut(&mut keep);
        }
        for records in &mut self.swept_retries {
            records.retain_mut(&mut keep);
        }
        self.early.retain(|e| {
            let current = offsets.is_current(&e.tp, e.epoch);
            if !current {
                offsets.give_back(&e.tp, e.offset, e.epoch);
            }
            current
        });
        drop(state);
        self.swept.extend(taken);
        self.swept_at = now;
        // The channels are empty now: let the thread hand out more.
        self.context.room_made(&self.commands, 0);
    }
}

#[async_trait]
impl Subscription for KafkaSubscription {
    /// The next record at hand — a held retry now due, else the next of the batch or of the next one at
    /// hand ([`KafkaSubscription::take_next_batch`]) — skipping those whose
    /// partition was revoked since they were read (they belong to its new owner); a retry that came
    /// before its due time is held instead.
    fn next_ready(&mut self) -> Option<Delivery> {
        let now = self.context.changes.now();
        if now != self.swept_at {
            self.sweep(now);
        }
        if let Some(delivery) = self.due_early() {
            return Some(delivery);
        }
        loop {
            let Some(record) = self.batch.next() else {
                if self.take_next_batch() {
                    continue;
                }
                return None;
            };
            if !self.is_current(&record.tp, record.epoch, record.generation) {
                // Its partition was revoked, or is being revoked since the sweep above.
                self.give_back(&record.tp, record.offset, record.epoch);
                continue;
            }
            let retry = *record.tp.0 == *self.shared.retry_topic;
            let (tp, offset, epoch, generation) = (
                record.tp.clone(),
                record.offset,
                record.epoch,
                record.generation,
            );
            let delivery = self.delivery(record);
            if retry && let Some(at) = hold_until(&delivery.message, Timestamp::now()) {
                self.held += 1;
                self.early.push(Early {
                    at,
                    seq: self.held,
                    tp,
                    offset,
                    epoch,
                    generation,
                    delivery,
                });
                continue;
            }
            return Some(delivery);
        }
    }

    async fn next(&mut self) -> Result<Option<Delivery>, Error> {
        loop {
            if let Some(delivery) = self.next_ready() {
                return Ok(Some(delivery));
            }
            // An error swept off the channel with the batches around it, in its turn, or taken off it
            // by `take_next_batch`.
            if let Some(Err(_)) = self.swept.front()
                && let Some(Err(e)) = self.swept.pop_front()
            {
                return Err(e);
            }
            // To the microsecond: a wait counted from the current whole millisecond would add up to one.
            let wake = self.early.peek().map(|e| {
                let d =
                    e.at.to_system_time()
                        .duration_since(std::time::SystemTime::now())
                        .unwrap_or_default();
                (e.at, d)
            });
            // Cancel-safe: a batch is either received whole (and kept in `self.batch`) or not at all, and
            // a precise sleep cut short is kept for the next round.
            let received = match wake {
                None => self.inbound.recv().await,
                Some((_, d)) if d > PRECISE_WITHIN => tokio::select! {
                    received = self.inbound.recv() => received,
                    () = tokio::time::sleep(d - PRECISE_WITHIN) => continue,
                },
                Some((at, d)) => {
                    let sleep = match &mut self.precise {
                        Some((until, sleep)) if *until == at => sleep,
                        slot => &mut slot.insert((at, precise_sleep(d))).1,
                    };
                    tokio::select! {
                        received = self.inbound.recv() => received,
                        _ = sleep => {
                            self.precise = None;
                            continue;
                        }
                    }
                }
            };
            match received {
                // `next_ready` took the last batch to its end before this wait.
                Some(Ok(records)) => {
                    self.batch = records.into_iter();
                    self.context
                        .room_made(&self.commands, self.inbound.source_queued());
                }
                Some(Err(e)) => return Err(e),
                None => return Err(Error::closed()),
            }
        }
    }

    async fn pause(&mut self) -> Result<(), Error> {
        self.commands
            .send(Command::Pause)
            .map_err(|_| Error::closed())
    }

    async fn resume(&mut self) -> Result<(), Error> {
        self.commands
            .send(Command::Resume)
            .map_err(|_| Error::closed())
    }

    async fn close(mut self: Box<Self>) -> Result<(), Error> {
        let (done, closed) = tokio::sync::oneshot::channel();
        let ladder = self.ladder.take();
        if self.commands.send(Command::Close(done)).is_ok() {
            tokio::time::timeout(Duration::from_secs(30), closed)
                .await
                .map_err(|_| {
                    Error::new(
                        Kind::Timeout,
                        format!("closing the consumer of {} timed out", self.spec.topic),
                    )
                })?
                .map_err(|_| Error::closed())?;
        }
        if let Some(ladder) = ladder {
            ladder.stop().await;
        }
        Ok(())
    }
}

/// What a subscription's receipts share (one reference count per record): the link and the consumer
/// thread they settle through, and the topics and group they settle to.
struct Shared {
    link: Arc<Link>,
    context: Arc<Context>,
    source: Arc<str>,
    retry_topic: String,
    dlq_topic: String,
    group: String,
}

/// Where a record sits: what its settle reports to the consumer thread.
struct Position {
    tp: Tp,
    offset: i64,
    epoch: u64,
}

/// Settles one record.
struct KafkaReceipt {
    shared: Arc<Shared>,
    partition: i32,
    position: Unsettled<Position>,
    /// The record as copied, decoded again only if [`Receipt::release`] needs it whole (a clone of the
    /// decoded message per record would cost a header list and a reference count per header).
    original: Copied,
    /// The record's headers whose value was null: every copy writes them null again.
    nulls: Nulls,
}

impl KafkaReceipt {
    /// Reports the record settled; the consumer thread commits its offset once everything before it in
    /// the partition is settled too.
    fn finish(&mut self) -> Result<(), Error> {
        let p = self.position.take()?;
        // If the consumer is gone, the offset stays uncommitted and the record is consumed again.
        self.shared.context.settled(&p.tp, p.offset, p.epoch);
        Ok(())
    }

    /// Settles the record with a copy that comes back on the retry topic after `delay`.
    async fn delay(
        &mut self,
        raw: &RawMessage,
        delay: Duration,
        operation: &str,
    ) -> Result<(), Error> {
        if self.shared.context.transactional() {
            let (topic, extra) = self.shared.link.delayed_target(
                &self.shared.source,
                &self.shared.retry_topic,
                delay,
            );
            return self
                .finish_with_copy(topic, raw.clone(), extra, operation)
                .await;
        }
        self.shared
            .link
            .send_delayed(
                &self.shared.source,
                &self.shared.retry_topic,
                self.partition,
                codec::Outbound {
                    raw,
                    nulls: &self.nulls,
                },
                delay,
                operation,
            )
            .await?;
        self.finish()
    }

    /// Settles the record with a copy of `raw` to `topic`, produced in the transaction that commits its
    /// offset; returns once that transaction committed.
    async fn finish_with_copy(
        &mut self,
        topic: String,
        raw: RawMessage,
        extra: Vec<(&'static str, Vec<u8>)>,
        operation: &str,
    ) -> Result<(), Error> {
        // The copy keeps its record's partition: the topic's count must be known to place it.
        self.shared
            .link
            .partitions(&topic)
            .await
            .map_err(|e| e.with_operation(operation.to_string()))?;
        let p = self.position.get()?;
        let (tp, offset, epoch) = (p.tp.clone(), p.offset, p.epoch);
        let copy = StagedCopy {
            topic,
            partition: Some(self.partition),
            raw,
            nulls: self.nulls.clone(),
            extra,
        };
        self.shared
            .context
            .settled_with_copy(&tp, offset, epoch, copy)
            .await
            .map_err(|_| Error::closed())?
            .map_err(|e| e.with_operation(operation.to_string()))?;
        // Settled: the record is no longer this receipt's to release.
        self.position.take().map(drop)
    }
}

#[async_trait]
impl Receipt for KafkaReceipt {
    async fn ack(&mut self) -> Result<(), Error> {
        self.finish()
    }

    fn try_ack(&mut self) -> Option<Result<(), Error>> {
        Some(self.finish())
    }

    async fn retry(&mut self, event: &Event, delay: Duration) -> Result<(), Error> {
        self.position.get()?;
        let operation = format!("retry of {} through the delay ladder", self.shared.source);
        self.delay(&event.to_raw(), delay, &operation).await
    }

    async fn dead_letter(&mut self, event: &Event) -> Result<(), Error> {
        self.position.get()?;
        let dlq = self.shared.dlq_topic.clone();
        let operation = format!("dead-letter to {dlq}");
        let group = event_retry_core::metadata::names::GROUP;
        if self.shared.context.transactional() {
            let extra = vec![(group, self.shared.group.as_bytes().to_vec())];
            return self
                .finish_with_copy(dlq, event.to_raw(), extra, &operation)
                .await;
        }
        let extra = [(group, self.shared.group.as_bytes())];
        self.shared
            .link
            .send(
                &dlq,
                Some(self.partition),
                &event.to_raw(),
                &self.nulls,
                &extra,
                &operation,
            )
            .await?;
        self.finish()
    }

    async fn release(&mut self, after: Duration) -> Result<(), Error> {
        self.position.get()?;
        // Kafka cannot hand one record back: a copy comes back through the retry topic instead, and
        // if it cannot be produced the offset stays uncommitted.
        let original = self.original.clone().decode().raw;
        self.delay(&original, after, "release").await
    }
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

    #[test]
    fn the_fetch_wait_is_short_unless_the_user_set_it() {
        let mut config = rdkafka::ClientConfig::new();
        default_fetch_wait(&mut config);
        assert_eq!(config.get("fetch.wait.max.ms"), Some(SOURCE_FETCH_WAIT_MS));
        let mut theirs = rdkafka::ClientConfig::new();
        theirs.set("fetch.wait.max.ms", "400");
        default_fetch_wait(&mut theirs);
        assert_eq!(theirs.get("fetch.wait.max.ms"), Some("400"));
    }
}
