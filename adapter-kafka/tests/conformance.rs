//! The conformance suite against a real Kafka broker (`RETRY_TEST_KAFKA`, started by `scripts/brokers`).
//!
//! Each scenario gets its own source topic of two partitions (so two consumers of a group can share it)
//! with its ladder and DLQ. The DLQ fault lowers the DLQ topic's `max.message.bytes` below any record, so
//! the broker refuses every dead letter, and restores it.

use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{Adapter, Faults, Fixture, Inspect};
use event_retry_kafka::{KafkaConfig, KafkaTransport, bootstrap_of};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use retry_core::broker::Broker;
use retry_core::error::{Error, Kind, wrap};

/// The settings the suite runs the adapter with: a 100 ms ladder up to 10 minutes (13 levels), and
/// source topics of two partitions.
fn suite_config() -> KafkaConfig {
    KafkaConfig {
        granularity: Duration::from_millis(100),
        max_delay: Duration::from_secs(600),
        partitions: 2,
        ..KafkaConfig::default()
    }
}

/// Makes a DLQ topic refuse records by its `max.message.bytes`.
struct DlqSize {
    transport: KafkaTransport,
    admin: AdminClient<DefaultClientContext>,
}

#[async_trait]
impl Faults for DlqSize {
    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), Error> {
        let dlq = self.transport.config().dlq_topic(topic);
        // 1 MiB is the broker's default; 1 byte is less than any record batch.
        let limit = if writable { "1048588" } else { "1" };
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

/// Reads a group's committed offsets and the topic's ends with a raw rdkafka consumer.
struct Offsets {
    bootstrap: String,
}

impl Offsets {
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
        let (this, topic, group) = (
            Offsets {
                bootstrap: self.bootstrap.clone(),
            },
            topic.to_string(),
            group.to_string(),
        );
        tokio::task::spawn_blocking(move || this.held_blocking(&topic, &group))
            .await
            .map_err(wrap(Kind::Other, "read the offsets"))?
    }
}

async fn connect(url: String) -> Result<Fixture, String> {
    let transport = KafkaTransport::connect_with(&url, suite_config())
        .await
        .map_err(|e| e.to_string())?;
    let bootstrap = bootstrap_of(&url).map_err(|e| e.to_string())?;
    let admin = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .map_err(|e| e.to_string())?;
    let broker = Broker::new(transport.clone());
    Ok(Fixture::new("kafka", broker, Duration::from_millis(300))
        .with_faults(DlqSize { transport, admin })
        .with_inspect(Offsets { bootstrap }))
}

fn main() {
    conformance_tests::run(Adapter {
        name: "kafka",
        url_env: Some("RETRY_TEST_KAFKA"),
        connect: |url| Box::pin(connect(url)),
    })
}
