//! The conformance suite against a real Kafka broker (`RETRY_TEST_KAFKA`, started by `scripts/brokers`).
//!
//! Each scenario gets its own source topic of two partitions (so two consumers of a group can share it)
//! with its ladder and DLQ. The DLQ fault lowers the DLQ topic's `max.message.bytes` below any record, so
//! the broker refuses every dead letter, and restores it.

use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{Adapter, Faults, Fixture};
use event_retry_kafka::{KafkaConfig, KafkaTransport, bootstrap_of};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
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

async fn connect(url: String) -> Result<Fixture, String> {
    let transport = KafkaTransport::connect_with(&url, suite_config())
        .await
        .map_err(|e| e.to_string())?;
    let admin = ClientConfig::new()
        .set(
            "bootstrap.servers",
            bootstrap_of(&url).map_err(|e| e.to_string())?,
        )
        .create()
        .map_err(|e| e.to_string())?;
    let broker = Broker::new(transport.clone());
    Ok(Fixture::new("kafka", broker, Duration::from_millis(300))
        .with_faults(DlqSize { transport, admin }))
}

fn main() {
    conformance_tests::run(Adapter {
        name: "kafka",
        url_env: Some("RETRY_TEST_KAFKA"),
        connect: |url| Box::pin(connect(url)),
    })
}
