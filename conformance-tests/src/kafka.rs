//! The Kafka adapter as a fixture: each scenario gets its own source topic (two partitions, so two
//! consumers of a group can share it), with its ladder and DLQ. The DLQ fault lowers the DLQ topic's
//! `max.message.bytes` below any record, so the broker refuses every dead letter, and restores it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use event_retry_kafka::{KafkaConfig, KafkaTransport, bootstrap_of};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use retry_core::transport::{Transport, TransportError};

use crate::fixture::{Fixture, FixtureCapabilities, made};
use crate::probe::BoxFuture;

/// A fixture over the Kafka broker started by `scripts/brokers`.
#[derive(Clone)]
pub struct KafkaFixture {
    transport: KafkaTransport,
    admin: Arc<AdminClient<DefaultClientContext>>,
}

impl std::fmt::Debug for KafkaFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaFixture")
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

/// The settings the suite runs the adapter with: a 100 ms ladder up to 10 minutes (13 levels), and
/// source topics of two partitions.
pub fn suite_config() -> KafkaConfig {
    KafkaConfig {
        granularity: Duration::from_millis(100),
        max_delay: Duration::from_secs(600),
        partitions: 2,
        ..KafkaConfig::default()
    }
}

impl KafkaFixture {
    /// Connects to `url` (`kafka://host:port`).
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        let transport = KafkaTransport::connect_with(url, suite_config()).await?;
        let admin = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_of(url)?)
            .create()
            .map_err(|e| TransportError::Config(e.to_string()))?;
        Ok(Self {
            transport,
            admin: Arc::new(admin),
        })
    }

    /// The harness's constructor.
    pub fn make(url: String) -> BoxFuture<Result<Arc<dyn Fixture>, String>> {
        Box::pin(async move { made(Self::connect(&url).await) })
    }
}

#[async_trait]
impl Fixture for KafkaFixture {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(self.transport.clone())
    }

    fn fixture_capabilities(&self) -> FixtureCapabilities {
        FixtureCapabilities { dlq_fault: true }
    }

    async fn fresh_topic(&self, scenario: &str) -> Result<String, TransportError> {
        let topic = format!("conformance-{scenario}-{}", uuid::Uuid::new_v4().simple());
        self.transport.declare(&topic, None).await?;
        Ok(topic)
    }

    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), TransportError> {
        let dlq = self.transport.config().dlq_topic(topic);
        // 1 MiB is the broker's default; 1 byte is less than any record batch.
        let limit = if writable { "1048588" } else { "1" };
        let change =
            AlterConfig::new(ResourceSpecifier::Topic(&dlq)).set("max.message.bytes", limit);
        let results = self
            .admin
            .alter_configs([&change], &AdminOptions::new())
            .await
            .map_err(|e| TransportError::Connection(e.to_string()))?;
        for result in results {
            result.map_err(|(_, code)| TransportError::Rejected {
                operation: format!("set max.message.bytes of {dlq}"),
                reason: code.to_string(),
            })?;
        }
        // The broker applies a topic's configuration asynchronously; give it a moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(())
    }

    /// Deletes the topic and every topic derived from it (best effort).
    async fn cleanup(&self, topic: &str) {
        let mut names = self.transport.config().level_topics(topic);
        names.push(self.transport.config().dlq_topic(topic));
        names.push(topic.to_string());
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let _ = self.admin.delete_topics(&refs, &AdminOptions::new()).await;
    }

    fn delay_unit(&self) -> Duration {
        Duration::from_millis(300)
    }
}
