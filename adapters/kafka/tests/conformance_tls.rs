//! A representative part of the conformance suite — success, retries, policy spent → DLQ,
//! non-retryable → DLQ, and DLQ replay — over Kafka's SASL_SSL listener (`RETRY_TEST_KAFKA_TLS`,
//! started by `scripts/brokers start --tls`): SCRAM-SHA-512, the password read from a file, the CA
//! named in the URL. The report's column is `kafka-tls`.

use std::time::Duration;

use event_retry_core::broker::Broker;
use event_retry_core::options::Options;
use event_retry_kafka::{KafkaConfig, KafkaTransport};
use event_retry_testkit::{Adapter, Fixture};

/// The scenarios run over TLS: delivery, retry, DLQ and replay.
const SCENARIOS: [&str; 5] = [
    "success_acked_once",
    "transient_then_success",
    "policy_spent_to_dlq",
    "non_retryable_to_dlq",
    "dlq_replay",
];

async fn connect(url: String) -> Result<Fixture, String> {
    let (base, options) = Options::split_url(&url).map_err(|e| e.to_string())?;
    let config = KafkaConfig {
        granularity: Duration::from_millis(100),
        max_delay: Duration::from_secs(600),
        partitions: 2,
        ..KafkaConfig::from_options(&options).map_err(|e| e.to_string())?
    };
    let transport = KafkaTransport::connect_with(&base, config)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Fixture::new(
        "kafka-tls",
        Broker::new(transport),
        Duration::from_millis(300),
    ))
}

fn main() {
    event_retry_testkit::run_only(
        Adapter {
            name: "kafka-tls",
            url_env: Some("RETRY_TEST_KAFKA_TLS"),
            container: None,
            connect: |url| Box::pin(connect(url)),
        },
        &SCENARIOS,
    )
}
