//! A representative part of the conformance suite — success, retries, policy spent → DLQ,
//! non-retryable → DLQ, and DLQ replay — over RabbitMQ's TLS listener (`RETRY_TEST_AMQP_TLS`, started
//! by `scripts/brokers start --tls`): `amqps://`, a user of its own, the password read from a file,
//! the CA named in the URL. The report's column is `rabbitmq-tls`.

use std::time::Duration;

use event_retry_rabbitmq::SCHEME;
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
    let broker = test_support::security::connect(&SCHEME, &url)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Fixture::new(
        "rabbitmq-tls",
        broker,
        Duration::from_millis(250),
    ))
}

fn main() {
    event_retry_testkit::run_only(
        Adapter {
            name: "rabbitmq-tls",
            url_env: Some("RETRY_TEST_AMQP_TLS"),
            container: None,
            connect: |url| Box::pin(connect(url)),
        },
        &SCENARIOS,
    )
}
