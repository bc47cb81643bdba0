//! TxnProducer hops: a copy and the offset of the record it copies, committed together.
//!
//! Without transactions a hop is two writes — the copy, acknowledged by every in-sync replica, then the
//! offset commit — and a crash between them consumes the record again and copies it twice. With
//! `transactional_hops` every commit of a consumer that carries copies (the source consumer's retry and
//! DLQ copies, a ladder's forwards) is one Kafka transaction: the copies of the records it commits past
//! and the offsets themselves (`send_offsets_to_transaction`, fenced by the consumer's group
//! generation). Both land, or neither; every consumer reads `read_committed`, so a copy of an aborted
//! transaction is never seen.
//!
//! A copy whose offset cannot be committed within a second (a record before it is still unsettled, and
//! may be waiting for this copy's settle) goes in a transaction without the offset: see
//! `commit::STRANDED_AFTER`.
//!
//! Each consumer thread owns one transactional producer with a transactional id of its own. The open
//! transaction of a process that crashed is aborted by the coordinator after `transaction.timeout.ms`
//! ([`crate::link::TRANSACTION_TIMEOUT_MS`] unless set); until then `read_committed` readers of the partitions it
//! wrote wait.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_retry_core::error::Error;
use event_retry_core::event::RawMessage;
use rdkafka::TopicPartitionList;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer};
use tracing::warn;

use crate::codec::Nulls;
use crate::consumer::offsets::Tp;
use crate::error::{error, settings_error};
use crate::link::{Link, delivered};

/// How long a transactional call (begin, offsets, commit, abort) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// A record to produce in a transaction.
pub(crate) struct StagedCopy {
    /// Its topic.
    pub(crate) topic: String,
    /// Its partition (modulo the topic's partition count), if it keeps its source's.
    pub(crate) partition: Option<i32>,
    /// Key, headers and payload.
    pub(crate) raw: RawMessage,
    /// The headers whose value is written null.
    pub(crate) nulls: Nulls,
    /// Headers added to the record's own (the route through the ladder, the group of a dead letter).
    pub(crate) extra: Vec<(&'static str, Vec<u8>)>,
}

/// A copy waiting for its transaction, and the receipt waiting for the outcome.
pub(super) struct PendingCopy {
    pub(super) tp: Tp,
    pub(super) offset: i64,
    pub(super) epoch: u64,
    /// When the receipt handed it over.
    pub(super) since: Instant,
    pub(super) copy: StagedCopy,
    pub(super) done: tokio::sync::oneshot::Sender<Result<(), Error>>,
}

/// The transactional producer of a consumer with transactional hops, shared by its thread and its
/// rebalance callbacks (hence the lock), and the link its records use.
pub(crate) struct SharedTxnProducer {
    pub(super) link: Arc<Link>,
    pub(super) producer: Mutex<TxnProducer>,
}

impl SharedTxnProducer {
    /// The shared transactional producer of the consumer named `owner`.
    pub(crate) fn new(link: Arc<Link>, owner: &str) -> Self {
        let producer = Mutex::new(TxnProducer::new(link.transactional.clone(), owner));
        Self { link, producer }
    }
}

/// Why a transaction was aborted: the error, and for each copy the error its delivery met, if any.
pub(crate) struct Aborted {
    /// What aborted it.
    pub(crate) error: Error,
    /// Per copy, in order: the error of its own delivery.
    pub(crate) copies: Vec<Option<Error>>,
}

impl Aborted {
    fn whole(error: Error, copies: usize) -> Self {
        Self {
            error,
            copies: (0..copies).map(|_| None).collect(),
        }
    }
}

/// One consumer's transactional producer, created on first use and again after librdkafka gave it up.
pub(crate) struct TxnProducer {
    config: ClientConfig,
    owner: String,
    producer: Option<FutureProducer>,
    /// A producer given up in the transaction at hand, destroyed off the consumer's thread after it.
    retired: Option<FutureProducer>,
}

/// Destroys producers on a thread of their own: librdkafka's destroy of a transactional producer can
/// block while its coordinator is unreachable (a broker stopped for 20 s held a consumer thread that
/// dropped one for good), and a consumer thread must go on polling.
fn destroy_apart(producers: Vec<FutureProducer>) {
    let spawned = std::thread::Builder::new()
        .name("kafka-txn-destroy".into())
        .spawn(move || drop(producers));
    if let Err(e) = spawned {
        warn!(error = %e, "no thread to destroy a transactional producer on; it is leaked");
    }
}

impl TxnProducer {
    /// The transactional producer of `owner` (a consumer's name, the start of its transactional id).
    pub(crate) fn new(config: ClientConfig, owner: &str) -> Self {
        Self {
            config,
            owner: owner.to_string(),
            producer: None,
            retired: None,
        }
    }

    fn producer(&mut self) -> Result<FutureProducer, Error> {
        if let Some(p) = &self.producer {
            return Ok(p.clone());
        }
        let mut config = self.config.clone();
        config.set(
            "transactional.id",
            format!("{}-{}", self.owner, uuid::Uuid::new_v4().simple()),
        );
        let producer: FutureProducer = config
            .create()
            .map_err(settings_error("transactional producer"))?;
        if let Err(e) = producer.init_transactions(CALL_TIMEOUT) {
            destroy_apart(vec![producer]);
            return Err(error("start the transactional producer")(e));
        }
        self.producer = Some(producer.clone());
        Ok(producer)
    }

    /// Produces `copies` and commits `offsets` for the consumer of `group` in one transaction. On any
    /// failure the transaction is aborted (nothing of it is seen) and the producer replaced if
    /// librdkafka cannot go on with it.
    pub(crate) fn commit(
        &mut self,
        link: &Link,
        copies: &[&StagedCopy],
        offsets: &TopicPartitionList,
        group: &ConsumerGroupMetadata,
    ) -> Result<(), Aborted> {
        let producer = self
            .producer()
            .map_err(|e| Aborted::whole(e, copies.len()))?;
        let outcome = self.transaction(&producer, link, copies, offsets, group);
        if let Some(old) = self.retired.take() {
            destroy_apart(vec![old, producer]);
        }
        outcome
    }

    fn transaction(
        &mut self,
        producer: &FutureProducer,
        link: &Link,
        copies: &[&StagedCopy],
        offsets: &TopicPartitionList,
        group: &ConsumerGroupMetadata,
    ) -> Result<(), Aborted> {
        producer
            .begin_transaction()
            .map_err(|e| self.abort(producer, e, "begin a transaction", copies.len()))?;
        let sends: Vec<_> = copies
            .iter()
            .map(|c| {
                let extra: Vec<(&str, &[u8])> =
                    c.extra.iter().map(|(n, v)| (*n, v.as_slice())).collect();
                producer
                    .send_result(link.record(&c.topic, c.partition, &c.raw, &c.nulls, &extra))
                    .map_err(|(e, _)| error(format!("produce to {}", c.topic))(e))
            })
            .collect();
        let failures: Vec<Option<Error>> = futures::executor::block_on(async {
            let mut out = Vec::with_capacity(sends.len());
            for (send, copy) in sends.into_iter().zip(copies.iter()) {
                out.push(match send {
                    Ok(delivery) => {
                        delivered(delivery.await, &format!("produce to {}", copy.topic)).err()
                    }
                    Err(e) => Some(e),
                });
            }
            out
        });
        if let Some(first) = failures.iter().flatten().next() {
            let error = Error::new(first.kind(), format!("a copy failed: {first}"));
            self.abort_quietly(producer);
            return Err(Aborted {
                error,
                copies: failures,
            });
        }
        // No offsets: the copies of records an unsettled record holds back (see
        // `commit::STRANDED_AFTER`), committed before their offsets.
        if offsets.count() > 0 {
            producer
                .send_offsets_to_transaction(offsets, group, CALL_TIMEOUT)
                .map_err(|e| {
                    self.abort(
                        producer,
                        e,
                        "add the offsets to the transaction",
                        copies.len(),
                    )
                })?;
        }
        // A process that dies here has produced its copies and not committed them.
        failpoint!("kafka-before-commit-transaction", |_| std::process::abort());
        // A commit that fails is aborted, also one that timed out and might still land: resuming it
        // (calling it again) held the consumer thread past a 20 s broker stop (fault F3 stalled), so
        // such a transaction can leave a duplicate copy, never a lost one.
        producer
            .commit_transaction(CALL_TIMEOUT)
            .map_err(|e| self.abort(producer, e, "commit the transaction", copies.len()))
    }

    /// Aborts the open transaction after `e` and says what failed.
    fn abort(
        &mut self,
        producer: &FutureProducer,
        e: KafkaError,
        what: &str,
        copies: usize,
    ) -> Aborted {
        self.abort_quietly(producer);
        Aborted::whole(error(what.to_string())(e), copies)
    }

    /// Aborts the open transaction; a producer that cannot abort (or went fatal) is replaced next time
    /// (and destroyed apart).
    fn abort_quietly(&mut self, producer: &FutureProducer) {
        let fatal = producer.client().fatal_error().is_some();
        if fatal || producer.abort_transaction(CALL_TIMEOUT).is_err() {
            warn!(owner = %self.owner, "the transactional producer is replaced");
            self.retired = self.producer.take();
        }
    }
}

impl Drop for TxnProducer {
    /// The producer goes with its consumer (closing, or its thread ending), destroyed apart too: the
    /// consumer's and the ladder's threads are joined at close.
    fn drop(&mut self) {
        let producers: Vec<FutureProducer> = self
            .producer
            .take()
            .into_iter()
            .chain(self.retired.take())
            .collect();
        if !producers.is_empty() {
            destroy_apart(producers);
        }
    }
}
