//! The conformance suite's Kafka fixture, shared by the suite's columns (`kafka`, and
//! `kafka-transactional` with transactional hops).
//!
//! Each scenario gets its own source topic of two partitions (so two consumers of a group can share it)
//! with its ladder and DLQ. The raw client, the offset reader and the DLQ fault are
//! `raw_brokers::fixture::kafka`'s.

use std::time::Duration;

use event_retry_core::broker::Broker;
use event_retry_kafka::{KafkaConfig, KafkaTransport, bootstrap_of};
use event_retry_testkit::Fixture;

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

/// The suite's fixture for the column `name`: the adapter with `config`, and the raw rdkafka client,
/// the committed-offset reader and the DLQ fault of `raw_brokers::fixture::kafka`.
pub(crate) async fn connect(
    url: String,
    name: &'static str,
    config: KafkaConfig,
) -> Result<Fixture, String> {
    let transport = KafkaTransport::connect_with(&url, config)
        .await
        .map_err(|e| e.to_string())?;
    let bootstrap = bootstrap_of(&url).map_err(|e| e.to_string())?;
    let fixture = Fixture::new(name, Broker::new(transport), Duration::from_millis(300));
    raw_brokers::fixture::kafka::equip(fixture, &bootstrap)
}
