//! The conformance suite's Kafka fixture, shared by the suite's columns (`kafka`, and
//! `kafka-transactional` with transactional hops).
//!
//! Each scenario gets its own source topic of two partitions (so two consumers of a group can share it)
//! with its ladder and DLQ. The DLQ fault lowers the DLQ topic's `max.message.bytes` below any dead letter, so
//! the broker refuses every dead letter, and restores it. The raw client publishes and reads records
//! with rdkafka directly, so scenario 12 compares what Kafka itself holds.

use std::time::Duration;

use async_trait::async_trait;
use event_retry_core::broker::Broker;
use event_retry_core::error::{Error, Kind, wrap};
use event_retry_kafka::{KafkaConfig, KafkaTransport, bootstrap_of};
use event_retry_testkit::{Faults, Fixture, Inspect, NativeMessage, RawClient, hex};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

/// The settings the suite runs the adapter with: a 100 ms ladder up to 10 minutes (13 levels), and
/// source topics of two partitions.
pub(crate) fn suite_config() -> KafkaConfig {
    KafkaConfig {
        granularity: Duration::from_millis(100),
        max_delay: Duration::from_secs(600),
        partitions: 2,
        ..KafkaConfig::default()
    }
}

/// Makes a DLQ topic refuse dead letters by its `max.message.bytes`.
struct DlqSize {
    transport: KafkaTransport,
    admin: AdminClient<DefaultClientContext>,
}

#[async_trait]
impl Faults for DlqSize {
    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), Error> {
        let dlq = self.transport.config().dlq_topic(topic);
        // 1 MiB is the broker's default. 200 bytes is less than any batch holding a dead letter (its
        // headers alone are longer) and more than a transaction's commit or abort marker (about 80):
        // with a limit below the marker, the coordinator can never end a transaction that wrote to the
        // DLQ (Kafka's marker sender fails with RecordTooLargeException) and the group's offsets stay
        // pending.
        let limit = if writable { "1048588" } else { "200" };
        let change =
            AlterConfig::new(ResourceSpecifier::Topic(&dlq)).set("max.message.bytes", limit);
        let results = self
            .admin
            .alter_configs([&change], &AdminOptions::new())
            .await
            .map_err(wrap(Kind::Connection, "alter the DLQ's configuration"))?;
        for result in results {
            result.map_err(|(_, code)| {
                Error::new(Kind::Rejected, code.to_string())
                    .with_operation(format!("set max.message.bytes of {dlq}"))
            })?;
        }
        // The broker applies a topic's configuration asynchronously; give it a moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(())
    }
}

/// Reads a group's committed offsets and the topics' ends with a raw rdkafka consumer.
#[derive(Clone)]
struct Offsets {
    bootstrap: String,
    config: KafkaConfig,
}

impl Offsets {
    /// Every record ever written to the topic's delay ladder and the group's retry topic: the sum of
    /// their end offsets (a topic that does not exist has none).
    fn sent_to_route_blocking(&self, topic: &str, group: &str) -> Result<u64, Error> {
        let timeout = Duration::from_secs(10);
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .map_err(wrap(Kind::Config, "create a raw consumer"))?;
        let metadata = consumer
            .fetch_metadata(None, timeout)
            .map_err(wrap(Kind::Connection, "read the cluster's metadata"))?;
        let mut route = self.config.level_topics(topic);
        route.push(self.config.retry_topic(topic, group));
        let mut sent = 0;
        for t in metadata
            .topics()
            .iter()
            .filter(|t| route.iter().any(|r| r == t.name()))
        {
            for p in t.partitions() {
                let (_, high) = consumer
                    .fetch_watermarks(t.name(), p.id(), timeout)
                    .map_err(wrap(Kind::Connection, "read the watermarks"))?;
                sent += u64::try_from(high).unwrap_or(0);
            }
        }
        Ok(sent)
    }

    fn held_blocking(&self, topic: &str, group: &str) -> Result<u64, Error> {
        let timeout = Duration::from_secs(10);
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(wrap(Kind::Config, "create a raw consumer"))?;
        let metadata = consumer
            .fetch_metadata(Some(topic), timeout)
            .map_err(wrap(Kind::Connection, "read the topic's metadata"))?;
        let partitions = metadata
            .topics()
            .first()
            .map_or(0, |t| t.partitions().len() as i32);
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        let committed = consumer
            .committed_offsets(tpl, timeout)
            .map_err(wrap(Kind::Connection, "read the committed offsets"))?;
        let mut held = 0;
        for p in 0..partitions {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, timeout)
                .map_err(wrap(Kind::Connection, "read the watermarks"))?;
            let from = match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => low,
            };
            held += u64::try_from(high - from).unwrap_or(0);
        }
        Ok(held)
    }
}

/// The group's uncommitted records of the topic: end offset minus committed offset, per partition.
#[async_trait]
impl Inspect for Offsets {
    async fn held_in_source(&self, topic: &str, group: &str) -> Result<u64, Error> {
        let (this, topic, group) = (self.clone(), topic.to_string(), group.to_string());
        tokio::task::spawn_blocking(move || this.held_blocking(&topic, &group))
            .await
            .map_err(wrap(Kind::Other, "read the offsets"))?
    }

    async fn sent_to_retry_route(&self, topic: &str, group: &str) -> Result<Option<u64>, Error> {
        let (this, topic, group) = (self.clone(), topic.to_string(), group.to_string());
        tokio::task::spawn_blocking(move || this.sent_to_route_blocking(&topic, &group))
            .await
            .map_err(wrap(Kind::Other, "read the watermarks"))?
            .map(Some)
    }
}

/// Publishes and reads records with rdkafka itself.
struct RawKafka {
    bootstrap: String,
    producer: FutureProducer,
    dlq_topic: fn(&KafkaConfig, &str) -> String,
    config: KafkaConfig,
}

/// A record as rdkafka gives it: key (or its absence), every header in order with its value or null,
/// and the timestamp with its type. A copy the adapter made is stamped anew (Kafka's retention counts
/// from a record's stamp) and carries the original's stamp in `x-retry-origin-timestamp[-type]`: that is
/// the record's timestamp here when present. The SDK's own headers are left out.
fn describe(message: &BorrowedMessage<'_>) -> NativeMessage {
    let mut lines = vec![(
        "payload".to_string(),
        hex(message.payload().unwrap_or_default()),
    )];
    lines.push(("key".into(), message.key().map_or("null".into(), hex)));
    let (mut origin_at, mut origin_type) = (None, None);
    if let Some(headers) = message.headers() {
        for h in headers.iter() {
            match h.key {
                "x-retry-origin-timestamp" => {
                    origin_at = h.value.map(|v| String::from_utf8_lossy(v).to_string())
                }
                "x-retry-origin-timestamp-type" => {
                    origin_type = h.value.map(|v| String::from_utf8_lossy(v).to_string())
                }
                name if name.starts_with("x-retry") => {}
                name => lines.push((format!("header {name}"), h.value.map_or("null".into(), hex))),
            }
        }
    }
    let own = match message.timestamp() {
        rdkafka::Timestamp::CreateTime(t) => format!("create-time {t}"),
        rdkafka::Timestamp::LogAppendTime(t) => format!("log-append-time {t}"),
        rdkafka::Timestamp::NotAvailable => "none".into(),
    };
    let timestamp = match (origin_type, origin_at) {
        (Some(kind), Some(at)) => format!("{kind} {at}"),
        _ => own,
    };
    lines.push(("timestamp".into(), timestamp));
    lines
}

impl RawKafka {
    fn dead_letters_blocking(&self, dlq: &str) -> Result<Vec<NativeMessage>, Error> {
        let timeout = Duration::from_secs(10);
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", format!("raw-reader-{}", uuid_like()))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .create()
            .map_err(wrap(Kind::Config, "create a raw consumer"))?;
        let metadata = consumer
            .fetch_metadata(Some(dlq), timeout)
            .map_err(wrap(Kind::Connection, "read the DLQ's metadata"))?;
        let partitions = metadata
            .topics()
            .first()
            .map_or(0, |t| t.partitions().len() as i32);
        let mut tpl = TopicPartitionList::new();
        let mut ends = Vec::new();
        for p in 0..partitions {
            let (low, high) = consumer
                .fetch_watermarks(dlq, p, timeout)
                .map_err(wrap(Kind::Connection, "read the watermarks"))?;
            if high > low {
                tpl.add_partition_offset(dlq, p, Offset::Offset(low))
                    .map_err(wrap(Kind::Other, "assign"))?;
                ends.push((p, high));
            }
        }
        let mut out = Vec::new();
        if ends.is_empty() {
            return Ok(out);
        }
        consumer
            .assign(&tpl)
            .map_err(wrap(Kind::Connection, "assign the DLQ"))?;
        let mut next: Vec<(i32, i64, i64)> = ends.iter().map(|&(p, end)| (p, -1, end)).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        // Read to the end: the last record read, or the position past the end (a log written in
        // transactions ends with a commit marker, which no reader gets).
        let position = |p: i32| -> i64 {
            consumer
                .position()
                .ok()
                .and_then(|tpl| match tpl.find_partition(dlq, p)?.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
                .unwrap_or(-1)
        };
        while next
            .iter()
            .any(|(p, seen, end)| *seen < end - 1 && position(*p) < *end)
        {
            if std::time::Instant::now() > deadline {
                return Err(Error::new(Kind::Timeout, "reading the DLQ took over 30 s"));
            }
            let Some(message) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let message = message.map_err(wrap(Kind::Connection, "read the DLQ"))?;
            if let Some(n) = next.iter_mut().find(|(p, _, _)| *p == message.partition()) {
                n.1 = n.1.max(message.offset());
            }
            out.push(describe(&message));
        }
        Ok(out)
    }
}

/// A short unique suffix.
fn uuid_like() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    )
}

#[async_trait]
impl RawClient for RawKafka {
    /// A keyed record with headers out of order, a repeated name, an empty and a null value, binary
    /// bytes, and a producer timestamp an hour in the past.
    async fn publish_native(&self, topic: &str, payload: &[u8]) -> Result<NativeMessage, Error> {
        let key: &[u8] = &[0x00, 0xfe, b'k'];
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as i64
            - 3_600_000;
        let headers: [(&str, Option<&[u8]>); 6] = [
            ("zulu", Some(b"first")),
            ("alpha", Some(&[0xff, 0x00, 0x80])),
            ("zulu", Some(b"second")),
            ("nothing", None),
            ("empty", Some(b"")),
            ("content-type", Some(b"application/octet-stream")),
        ];
        let mut owned = OwnedHeaders::new();
        for (key, value) in headers {
            owned = owned.insert(Header { key, value });
        }
        let record = FutureRecord::to(topic)
            .payload(payload)
            .key(key)
            .headers(owned)
            .timestamp(timestamp);
        self.producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| {
                Error::from_source(Kind::Rejected, e).with_operation("raw publish")
            })?;
        let mut lines = vec![
            ("payload".to_string(), hex(payload)),
            ("key".to_string(), hex(key)),
        ];
        for (name, value) in headers {
            lines.push((format!("header {name}"), value.map_or("null".into(), hex)));
        }
        lines.push(("timestamp".into(), format!("create-time {timestamp}")));
        Ok(lines)
    }

    async fn dead_letters(&self, topic: &str) -> Result<Vec<NativeMessage>, Error> {
        let dlq = (self.dlq_topic)(&self.config, topic);
        let this = RawKafka {
            bootstrap: self.bootstrap.clone(),
            producer: self.producer.clone(),
            dlq_topic: self.dlq_topic,
            config: self.config.clone(),
        };
        tokio::task::spawn_blocking(move || this.dead_letters_blocking(&dlq))
            .await
            .map_err(wrap(Kind::Other, "read the DLQ"))?
    }
}

/// The suite's fixture for the column `name`: the adapter with `config`, the raw rdkafka client, the
/// committed-offset reader and the DLQ fault.
pub(crate) async fn connect(
    url: String,
    name: &'static str,
    config: KafkaConfig,
) -> Result<Fixture, String> {
    let transport = KafkaTransport::connect_with(&url, config.clone())
        .await
        .map_err(|e| e.to_string())?;
    let bootstrap = bootstrap_of(&url).map_err(|e| e.to_string())?;
    let admin = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .map_err(|e| e.to_string())?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .map_err(|e| e.to_string())?;
    let raw = RawKafka {
        bootstrap: bootstrap.clone(),
        producer,
        dlq_topic: |config, topic| config.dlq_topic(topic),
        config: transport.config().clone(),
    };
    let broker = Broker::new(transport.clone());
    Ok(Fixture::new(name, broker, Duration::from_millis(300))
        .with_faults(DlqSize { transport, admin })
        .with_inspect(Offsets { bootstrap, config })
        .with_raw_client(raw))
}
