//! A consumer of a source topic and its group's retry topic, as the runtime sees it: the records
//! handed out in order, and the receipts that settle them ([`receipt`]).
//!
//! The records come from the consumer thread ([`crate::consumer`]) in batches, the group's retry
//! topic's first; a retry that came before its due time is held until it ([`early`]), and a record
//! whose partition was revoked since it was read is given back rather than handed out.

mod early;
mod receipt;

use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::time::Duration;

use async_trait::async_trait;
use event_retry_core::adapter::{
    Delivery, DeliveryInfo, Subscription, SubscriptionSpec, Unsettled,
};
use event_retry_core::error::{Error, Kind, wrap};
use event_retry_core::metadata::Origin;
use event_retry_core::time::Timestamp;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::consumer::context::{Command, Context};
use crate::consumer::handoff::{self, Record};
use crate::consumer::offsets::Tp;
use crate::consumer::txn::SharedTxnProducer;
use crate::consumer::worker;
use crate::ladder::mover::Ladder;
use crate::link::Link;
use crate::stranding::{BrokerWatch, report_statistics};
use early::{Early, PRECISE_WITHIN, hold_until, precise_sleep};
use receipt::{KafkaReceipt, Position, Shared};

/// How long the consumer's fetch waits at the broker for records, in ms. The consumer fetches the source
/// and the group's (mostly empty) retry topic in one request per broker, and librdkafka sends the next
/// request only once the one in flight returns: partitions left out of a request — the source's while
/// its prefetch queue was full, or before their start offsets were known — wait for a request of the
/// empty retry partitions to time out, as does a partition resumed after a pause. A shorter wait
/// than librdkafka's raised the consumer's throughput on the Kafka bench and brought its first record
/// sooner after it joined the group. The cost: an idle consumer sends a fetch
/// every 25 ms (the ladder's consumer one every 20 ms).
const SOURCE_FETCH_WAIT_MS: &str = "25";

/// Sets how long the consumer's fetch waits at the broker to [`SOURCE_FETCH_WAIT_MS`] (librdkafka's
/// default is 500 ms), unless the user's `rdkafka.fetch.wait.max.ms` set it.
fn default_fetch_wait(config: &mut rdkafka::ClientConfig) {
    if config.get("fetch.wait.max.ms").is_none() {
        config.set("fetch.wait.max.ms", SOURCE_FETCH_WAIT_MS);
    }
}

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
        BrokerWatch::new(&config, "consumer")?,
        crate::consumer::start::reset_position(&config),
    );
    // The range assignor shares out each topic's partitions on its own, so every member of a group gets
    // its share of the source topic (and, for per-key order, the same partition numbers of the source
    // and retry topics, which have the same count). The cooperative assignor balances only the total
    // count: a member that joined a running one was given the retry topic's partitions and none of the
    // source's (of two processes, one handled every event). Every member of a group must
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

#[cfg(test)]
mod tests {
    use super::*;

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
