//! A representative part of the conformance suite — success, retries, policy spent → DLQ,
//! non-retryable → DLQ, and DLQ replay — over Pulsar's TLS listener with token authentication
//! (`RETRY_TEST_PULSAR_TLS`, started by `scripts/brokers start --tls`): the token read from a file, the
//! CA named in the URL. The broker's delivery settings are read through its admin API over HTTPS with
//! the same token (`RETRY_TEST_PULSAR_TLS_ADMIN`), or, without it, given as options (the same short
//! strict tick). The report's column is `pulsar-tls`.

use std::time::Duration;

use event_retry_pulsar::SCHEME;
use event_retry_testkit::{Adapter, Fixture};
use test_support::security::with_query;

/// The scenarios run over TLS: delivery, retry, DLQ and replay.
const SCENARIOS: [&str; 5] = [
    "success_acked_once",
    "transient_then_success",
    "policy_spent_to_dlq",
    "non_retryable_to_dlq",
    "dlq_replay",
];

async fn connect(url: String) -> Result<Fixture, String> {
    let url = match test_support::broker::url("RETRY_TEST_PULSAR_TLS_ADMIN") {
        Some(admin) => with_query(&url, "admin_url", Some(&admin)),
        None => with_query(
            &with_query(&url, "granularity", Some("100ms")),
            "strict_deliver_at",
            Some("true"),
        ),
    };
    let broker = test_support::security::connect(&SCHEME, &url)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Fixture::new(
        "pulsar-tls",
        broker,
        Duration::from_millis(300),
    ))
}

fn main() {
    event_retry_testkit::run_only(
        Adapter {
            name: "pulsar-tls",
            url_env: Some("RETRY_TEST_PULSAR_TLS"),
            container: None,
            connect: |url| Box::pin(connect(url)),
        },
        &SCENARIOS,
    )
}
