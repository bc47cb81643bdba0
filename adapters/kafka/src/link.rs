//! The shared state of one transport: client settings, the idempotent producer every copy goes through,
//! the admin client that creates topics, and the partition counts of the topics copies go to.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use event_retry_core::error::{Error, Kind, wrap};
use event_retry_core::event::RawMessage;
use event_retry_core::time::Timestamp;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryFuture, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

use crate::codec::{self, Nulls, Outbound, Route};
use crate::config::KafkaConfig;
use crate::error::{error, settings_error};
use crate::ladder::{Hop, next_hop};
use crate::producer::{Handle, KafkaProducer, Producers};

/// How long a produced record may take to be acknowledged before it is an error.
pub(crate) const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a metadata or admin request may take.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The shared state of one transport.
pub(crate) struct Link {
    pub(crate) bootstrap: String,
    pub(crate) config: KafkaConfig,
    /// The idempotent producer every record goes through (replaced when broken).
    pub(crate) producers: Producers,
    admin: AdminClient<DefaultClientContext>,
    partitions: Mutex<HashMap<String, i32>>,
    /// The settings of the consumers' transactional producers (`transactional_hops`), less their ids.
    pub(crate) transactional: ClientConfig,
}

/// Where the broker put a record: its partition and offset.
pub(crate) type Position = (i32, i64);

/// `topic` does not exist.
fn missing(topic: &str) -> Error {
    Error::new(Kind::NotFound, format!("topic {topic} does not exist"))
}

impl Link {
    /// Creates the clients (librdkafka connects lazily; `connect` checks the broker answers).
    pub(crate) fn new(bootstrap: &str, config: KafkaConfig) -> Result<Self, Error> {
        let base = client_config(bootstrap, &config);
        let mut producer_config = base.clone();
        producer_config
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "2")
            .set("message.timeout.ms", SEND_TIMEOUT.as_millis().to_string());
        let producers = Producers::new(producer_config)?;
        let admin = base.create().map_err(settings_error("admin"))?;
        let transactional = transactional_config(bootstrap, &config);
        Ok(Self {
            bootstrap: bootstrap.to_string(),
            config,
            producers,
            admin,
            partitions: Mutex::new(HashMap::new()),
            transactional,
        })
    }

    /// Settings for a consumer in `group` (offsets committed only by the adapter). The prefetch
    /// defaults below give way to the user's own `rdkafka.*` settings.
    pub(crate) fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut c = client_config_with(
            &self.bootstrap,
            &self.config,
            &[
                // librdkafka prefetches up to 64 MB per consumer by default; the adapter keeps its
                // own backlog too, so a smaller prefetch bounds the memory of a consumer.
                ("queued.max.messages.kbytes", "16384"),
                // When that prefetch is full, librdkafka stops fetching for this long (1 s by
                // default): a consumer that drains 16 MB faster would sit idle for the rest of it.
                ("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS),
            ],
        );
        // Copies of an aborted transaction are never read (librdkafka's default, said here because the
        // transactional hops rely on it).
        c.set("group.id", group)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("enable.partition.eof", "false");
        c
    }

    /// The partition count of `topic`, from the cache or the broker.
    pub(crate) fn partitions_blocking(&self, topic: &str) -> Result<i32, Error> {
        if let Some(n) = self.lock_partitions().get(topic) {
            return Ok(*n);
        }
        let topics = [topic.to_string()];
        let counts = self
            .clone_for_blocking()
            .fetch_partitions_blocking(&topics)?;
        self.remember(topics.into_iter().zip(counts.iter().copied()).collect());
        match counts[..] {
            [n] if n > 0 => Ok(n),
            _ => Err(missing(topic)),
        }
    }

    /// The partition count of `topic`, from the cache or the broker; an error of kind
    /// [`Kind::NotFound`] if it does not exist.
    pub(crate) async fn partitions(&self, topic: &str) -> Result<i32, Error> {
        if let Some(n) = self.cached_partitions(topic) {
            return Ok(n);
        }
        match self.fetch_partitions(vec![topic.to_string()]).await?[..] {
            [n] if n > 0 => Ok(n),
            _ => Err(missing(topic)),
        }
    }

    /// Forgets the cached partition counts of `topics` (after they were deleted).
    pub(crate) fn forget(&self, topics: &[String]) {
        let mut cache = self.lock_partitions();
        for t in topics {
            cache.remove(t);
        }
    }

    /// Forgets every cached partition count (the next use of a topic asks the cluster).
    pub(crate) fn forget_all(&self) {
        self.lock_partitions().clear();
    }

    /// The cached partition count of `topic`.
    pub(crate) fn cached_partitions(&self, topic: &str) -> Option<i32> {
        self.lock_partitions().get(topic).copied()
    }

    fn lock_partitions(&self) -> std::sync::MutexGuard<'_, HashMap<String, i32>> {
        self.partitions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes sure `source` and the topics derived from it exist (creating what is missing when allowed):
    /// the retry topic of `group` if given, the ladder and the DLQ, with the source's partition count.
    pub(crate) async fn ensure_topics(
        &self,
        source: &str,
        group: Option<&str>,
    ) -> Result<(), Error> {
        let mut derived = self.config.level_topics(source);
        derived.push(self.config.dlq_topic(source));
        if let Some(group) = group {
            derived.push(self.config.retry_topic(source, group));
        }
        let all: Vec<String> = std::iter::once(source.to_string()).chain(derived).collect();
        self.create_missing(all).await
    }

    /// Makes sure `topic` exists (creating it when allowed), for a producer.
    pub(crate) async fn ensure_topic(&self, topic: &str) -> Result<(), Error> {
        if self.cached_partitions(topic).is_some() {
            return Ok(());
        }
        self.create_missing(vec![topic.to_string()]).await
    }

    /// Creates the topics of `all` that are missing, with the partition count of the first (or the
    /// configured count if the first is missing too), and waits until the broker shows them.
    async fn create_missing(&self, all: Vec<String>) -> Result<(), Error> {
        let counts = self.fetch_partitions(all.clone()).await?;
        let missing: Vec<&String> = all
            .iter()
            .zip(&counts)
            .filter(|(_, n)| **n == 0)
            .map(|(t, _)| t)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if !self.config.create_topics {
            return Err(Error::new(
                Kind::NotFound,
                format!(
                    "missing topics {missing:?} (declare is off: create them with {} partitions)",
                    counts[0].max(1)
                ),
            ));
        }
        let partitions = if counts[0] > 0 {
            counts[0]
        } else {
            self.config.partitions
        };
        let replication = self.config.replication_factor.unwrap_or(-1);
        let new: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(replication)))
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let results = self
            .admin
            .create_topics(new.iter(), &options)
            .await
            .map_err(error("create topics"))?;
        for result in results {
            if let Err((topic, code)) = result
                && code != RDKafkaErrorCode::TopicAlreadyExists
            {
                return Err(error(format!("create topic {topic}"))(KafkaError::AdminOp(
                    code,
                )));
            }
        }
        // Wait until the broker's metadata shows them, so a consumer subscribing next finds them.
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        loop {
            let counts = self.fetch_partitions(all.clone()).await?;
            if counts.iter().all(|n| *n > 0) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::new(
                    Kind::Timeout,
                    format!("created topics {missing:?} but the broker does not show them"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes `topics` (those already missing are fine) and forgets their partition counts.
    pub(crate) async fn delete_topics(&self, topics: &[String]) -> Result<(), Error> {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let results = self
            .admin
            .delete_topics(&names, &options)
            .await
            .map_err(error("delete topics"))?;
        self.forget(topics);
        for result in results {
            if let Err((topic, code)) = result
                && code != RDKafkaErrorCode::UnknownTopicOrPartition
            {
                return Err(error(format!("delete topic {topic}"))(KafkaError::AdminOp(
                    code,
                )));
            }
        }
        Ok(())
    }

    async fn fetch_partitions(&self, topics: Vec<String>) -> Result<Vec<i32>, Error> {
        let reader = self.clone_for_blocking();
        let asked = topics.clone();
        let counts = tokio::task::spawn_blocking(move || reader.fetch_partitions_blocking(&asked))
            .await
            .map_err(wrap(Kind::Other, "read the cluster's metadata"))??;
        self.remember(topics.into_iter().zip(counts.iter().copied()).collect());
        Ok(counts)
    }

    /// The names of every topic the cluster has.
    pub(crate) async fn topic_names(&self) -> Result<Vec<String>, Error> {
        let reader = self.clone_for_blocking();
        tokio::task::spawn_blocking(move || reader.topic_names_blocking())
            .await
            .map_err(wrap(Kind::Other, "read the cluster's metadata"))?
    }

    fn clone_for_blocking(&self) -> MetadataReader {
        MetadataReader {
            producer: self.producers.current().producer,
        }
    }

    /// Remembers partition counts read elsewhere.
    pub(crate) fn remember(&self, counts: Vec<(String, i32)>) {
        let mut cache = self.lock_partitions();
        for (t, n) in counts {
            if n > 0 {
                cache.insert(t, n);
            }
        }
    }

    /// Starts producing `raw` (plus `extra` headers) to `topic` (partition `partition` modulo the topic's
    /// count, if given and the count is known); the future resolves when the broker acknowledged it. The
    /// error is the client's, so a caller can tell a full local queue from a refusal.
    pub(crate) fn start_send(
        &self,
        topic: &str,
        partition: Option<i32>,
        raw: &RawMessage,
        nulls: &Nulls,
        extra: &[(&str, &[u8])],
    ) -> Result<DeliveryFuture, KafkaError> {
        self.start_send_on(topic, partition, raw, nulls, extra)
            .map(|(delivery, _)| delivery)
    }

    /// The record that carries `raw` (plus `extra` headers) to `topic`, on partition `partition` modulo
    /// the topic's count if given and the count is known.
    pub(crate) fn record<'a>(
        &self,
        topic: &'a str,
        partition: Option<i32>,
        raw: &'a RawMessage,
        nulls: &Nulls,
        extra: &[(&str, &[u8])],
    ) -> FutureRecord<'a, [u8], [u8]> {
        let mut record = FutureRecord::<[u8], [u8]>::to(topic)
            .payload(&raw.payload[..])
            .headers(codec::headers(raw, nulls, extra));
        if let Some(key) = &raw.key {
            record = record.key(&key[..]);
        }
        if let (Some(p), Some(n)) = (partition, self.cached_partitions(topic)) {
            record = record.partition(p.rem_euclid(n.max(1)));
        }
        record
    }

    /// [`Self::start_send`], also returning the producer that took the record.
    fn start_send_on(
        &self,
        topic: &str,
        partition: Option<i32>,
        raw: &RawMessage,
        nulls: &Nulls,
        extra: &[(&str, &[u8])],
    ) -> Result<(DeliveryFuture, Handle), KafkaError> {
        let record = self.record(topic, partition, raw, nulls, extra);
        let unusable = |_| KafkaError::MessageProduction(RDKafkaErrorCode::Fatal);
        let handle = self.producers.usable().map_err(unusable)?;
        match handle.producer.send_result(record) {
            Ok(delivery) => Ok((delivery, handle)),
            // The producer went fatal since its last record: a new one takes this record.
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::Fatal), record)) => {
                let fresh = self
                    .producers
                    .replace(&handle, "librdkafka declared it fatal")
                    .map_err(unusable)?;
                match fresh.producer.send_result(record) {
                    Ok(delivery) => Ok((delivery, fresh)),
                    Err((e, _)) => Err(e),
                }
            }
            Err((e, _)) => Err(e),
        }
    }

    /// Produces and waits for the broker's acknowledgement; returns where the record landed, or an
    /// error for `operation`.
    pub(crate) async fn send(
        &self,
        topic: &str,
        partition: Option<i32>,
        raw: &RawMessage,
        nulls: &Nulls,
        extra: &[(&str, &[u8])],
        operation: &str,
    ) -> Result<Position, Error> {
        let mut attempts = 0;
        let mut resent = false;
        loop {
            match self.start_send_on(topic, partition, raw, nulls, extra) {
                Ok((delivery, _)) if resent => return delivered(delivery.await, operation),
                Ok((delivery, used)) => match watch_delivery(delivery, &used).await {
                    Watched::Delivered(result) => return delivered(result, operation),
                    // The producer broke with this record in it: once more through a new one.
                    Watched::Broken(why) => {
                        self.producers
                            .replace(&used, &why)
                            .map_err(|e| e.with_operation(operation.to_string()))?;
                        resent = true;
                    }
                },
                // The local queue is full: wait for room rather than fail (bounded).
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
                    if attempts < 300 =>
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => {
                    return Err(error(operation.to_string())(e));
                }
            }
        }
    }

    /// Sends `record` to come back on `to` after `delay` at the earliest: straight to `to` when there is
    /// no delay, otherwise into the ladder level of its first hop.
    pub(crate) async fn send_delayed(
        &self,
        source: &str,
        to: &str,
        partition: i32,
        record: Outbound<'_>,
        delay: Duration,
        operation: &str,
    ) -> Result<(), Error> {
        let Outbound { raw, nulls } = record;
        let (topic, headers) = self.delayed_target(source, to, delay);
        let extra: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        self.send(&topic, Some(partition), raw, nulls, &extra, operation)
            .await
            .map(drop)
    }

    /// Where a record that is to come back on `to` after `delay` at the earliest goes first, and the
    /// routing headers it carries there: `to` itself when there is no delay, otherwise the ladder level
    /// of its first hop.
    pub(crate) fn delayed_target(
        &self,
        source: &str,
        to: &str,
        delay: Duration,
    ) -> (String, Vec<(&'static str, Vec<u8>)>) {
        let now = Timestamp::now();
        // Whole milliseconds (`plus` rounds the delay up): one more keeps the clock's rounding from
        // making the retry early.
        let due = if delay.is_zero() {
            now
        } else {
            now.plus(delay).plus(Duration::from_millis(1))
        };
        match next_hop(
            now,
            // Handed over early by the lead; the consumer holds it to its due time.
            due.minus(self.config.handover_lead()),
            self.config.granularity,
            self.config.levels(),
        ) {
            Hop::Due => (to.to_string(), Vec::new()),
            Hop::Level { level, leave_at } => {
                let route = Route {
                    to: to.to_string(),
                    due,
                    hop_due: leave_at,
                };
                (
                    self.config.level_topic(source, level),
                    codec::route_headers(&route).to_vec(),
                )
            }
        }
    }
}

/// A producer handle that reads metadata on a blocking thread.
struct MetadataReader {
    producer: KafkaProducer,
}

impl MetadataReader {
    /// The cluster's metadata, every topic's.
    fn metadata(&self) -> Result<rdkafka::metadata::Metadata, Error> {
        self.producer
            .client()
            .fetch_metadata(None, REQUEST_TIMEOUT)
            .map_err(error("read the cluster's metadata"))
    }

    fn topic_names_blocking(&self) -> Result<Vec<String>, Error> {
        Ok(self
            .metadata()?
            .topics()
            .iter()
            .filter(|m| m.error().is_none())
            .map(|m| m.name().to_string())
            .collect())
    }

    fn fetch_partitions_blocking(&self, topics: &[String]) -> Result<Vec<i32>, Error> {
        let metadata = self.metadata()?;
        Ok(topics
            .iter()
            .map(|t| {
                metadata
                    .topics()
                    .iter()
                    .find(|m| m.name() == t && m.error().is_none())
                    .map_or(0, |m| {
                        i32::try_from(m.partitions().len()).unwrap_or(i32::MAX)
                    })
            })
            .collect())
    }
}

/// How often a send checks whether its producer broke while it waits for the broker.
const BROKEN_CHECK: Duration = Duration::from_secs(1);

/// What came of waiting for a delivery.
enum Watched {
    /// The broker answered (or the producer gave up on the record).
    Delivered(
        Result<
            rdkafka::producer::future_producer::OwnedDeliveryResult,
            futures::channel::oneshot::Canceled,
        >,
    ),
    /// The producer broke first: it will not deliver the record.
    Broken(String),
}

/// Waits for `delivery`, checking every [`BROKEN_CHECK`] whether `used` broke meanwhile (a stranded
/// producer keeps a record until its message timeout, 30 s, without sending it).
async fn watch_delivery(mut delivery: DeliveryFuture, used: &Handle) -> Watched {
    let mut tick = tokio::time::interval(BROKEN_CHECK);
    tick.tick().await;
    loop {
        tokio::select! {
            result = &mut delivery => {
                return match (&result, used.broken()) {
                    (Ok(Ok(_)), _) | (_, None) => Watched::Delivered(result),
                    (_, Some(why)) => Watched::Broken(why),
                };
            }
            _ = tick.tick() => {
                if let Some(why) = used.broken() {
                    return Watched::Broken(why);
                }
            }
        }
    }
}

/// The outcome of a delivery future: where the record landed, or why the broker did not take it.
pub(crate) fn delivered(
    result: Result<
        rdkafka::producer::future_producer::OwnedDeliveryResult,
        futures::channel::oneshot::Canceled,
    >,
    operation: &str,
) -> Result<Position, Error> {
    match result {
        Ok(Ok(delivery)) => Ok((delivery.partition, delivery.offset)),
        Ok(Err((e, _))) => Err(error(operation.to_string())(e)),
        Err(e) => Err(Error::from_source(Kind::Closed, e).with_operation(operation.to_string())),
    }
}

/// How long librdkafka waits before fetching again once a consumer's prefetch queue is full.
const FETCH_QUEUE_BACKOFF_MS: &str = "10";

/// Settings every client shares, and the user's own `rdkafka.*` settings.
pub(crate) fn client_config(bootstrap: &str, config: &KafkaConfig) -> ClientConfig {
    client_config_with(bootstrap, config, &[])
}

/// How long a transaction may stay open before the coordinator aborts it (ms), unless the client
/// settings say otherwise: also how long a crashed member's open transaction holds back readers.
pub(crate) const TRANSACTION_TIMEOUT_MS: &str = "10000";

/// The settings of a consumer's transactional producer: acknowledged by every in-sync replica, a
/// transaction aborted by the coordinator after [`TRANSACTION_TIMEOUT_MS`] unless the client
/// settings say otherwise, and a record given up no later than its transaction.
fn transactional_config(bootstrap: &str, config: &KafkaConfig) -> ClientConfig {
    let mut c = client_config_with(
        bootstrap,
        config,
        &[("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS)],
    );
    let timeout = c
        .get("transaction.timeout.ms")
        .unwrap_or(TRANSACTION_TIMEOUT_MS)
        .to_string();
    c.set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "2")
        .set("message.timeout.ms", timeout);
    c
}

/// The settings every client shares, then `defaults`, then the user's own `rdkafka.*` settings, which
/// override both.
fn client_config_with(
    bootstrap: &str,
    config: &KafkaConfig,
    defaults: &[(&str, &str)],
) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("allow.auto.create.topics", "false")
        .set("log_level", "3");
    for (k, v) in defaults {
        c.set(*k, *v);
    }
    for (k, v) in &config.client {
        c.set(k, v);
    }
    for (k, v) in &config.client_secrets {
        c.set(k, v.expose());
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_prefetch_defaults_give_way_to_user_settings_and_the_group_settings_do_not() {
        let link = Link::new("127.0.0.1:1", KafkaConfig::default()).expect("clients");
        let c = link.consumer_config("orders-group");
        assert_eq!(
            c.get("fetch.queue.backoff.ms"),
            Some(FETCH_QUEUE_BACKOFF_MS)
        );
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("16384"));

        let config = KafkaConfig {
            client: vec![
                ("queued.max.messages.kbytes".into(), "1024".into()),
                ("fetch.queue.backoff.ms".into(), "500".into()),
                ("enable.auto.commit".into(), "true".into()),
                ("group.id".into(), "theirs".into()),
            ],
            ..KafkaConfig::default()
        };
        let link = Link::new("127.0.0.1:1", config).expect("clients");
        let c = link.consumer_config("orders-group");
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("1024"));
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("500"));
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(c.get("group.id"), Some("orders-group"));
    }

    /// librdkafka's mock cluster answers the first Produce with a sequence error that makes the
    /// idempotent producer fatal (a mock, not a broker: a real one cannot be made to do this on cue).
    #[tokio::test]
    async fn a_producer_declared_fatal_is_replaced_and_the_record_sent_again() {
        use rdkafka::mocking::MockCluster;
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("orders", 1, 1).expect("topic");
        let link =
            Link::new(&cluster.bootstrap_servers(), KafkaConfig::default()).expect("clients");
        let raw = RawMessage {
            payload: bytes::Bytes::from_static(b"first"),
            ..RawMessage::default()
        };
        let nulls = Nulls::default();
        // A first record, so the producer has its id and the next Produce is the one that fails.
        link.send("orders", None, &raw, &nulls, &[], "warm up")
            .await
            .expect("first record");
        let before = link.producers.current().producer;
        cluster.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER],
        );
        let sent = link
            .send("orders", None, &raw, &nulls, &[], "publish to orders")
            .await;
        assert!(
            before.client().fatal_error().is_some(),
            "the injected error did not make the producer fatal"
        );
        sent.expect("the record went through the new producer");
        assert_eq!(link.producers.replaced(), 1);
        link.send("orders", None, &raw, &nulls, &[], "publish to orders")
            .await
            .expect("later records go through the new producer");
        assert_eq!(link.producers.replaced(), 1);
    }
}
