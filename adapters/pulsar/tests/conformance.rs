//! The conformance suite against a Pulsar standalone (`RETRY_TEST_PULSAR`, started by `scripts/brokers`
//! with a delayed-delivery tick of 100 ms and strict `deliverAt`, which the adapter reads from the admin
//! API at `RETRY_TEST_PULSAR_ADMIN`).
//!
//! Each scenario gets its own topics. The raw client, the broker's view and the DLQ fault (through the
//! admin REST API; without its URL scenario 15 is skipped, with the reason) are
//! `raw_brokers::fixture::pulsar`'s.

use std::time::Duration;

use event_retry_core::broker::Broker;
use event_retry_pulsar::{PulsarConfig, PulsarTransport};
use event_retry_testkit::{Adapter, Fixture};

async fn connect(url: String) -> Result<Fixture, String> {
    // With the admin API the adapter reads the broker's tick and strictness itself (scripts/brokers
    // starts Pulsar with a 100 ms tick and strict deliverAt); without it, they are given here.
    let admin = event_retry_testkit::env::url("RETRY_TEST_PULSAR_ADMIN");
    let config = match &admin {
        Some(admin) => PulsarConfig {
            admin_url: Some(admin.clone()),
            ..PulsarConfig::default()
        },
        None => PulsarConfig {
            tick: Duration::from_millis(100),
            strict_deliver_at: true,
            ..PulsarConfig::default()
        },
    };
    let transport = PulsarTransport::connect_with(&url, config)
        .await
        .map_err(|e| e.to_string())?;
    let fixture = Fixture::new("pulsar", Broker::new(transport), Duration::from_millis(300));
    raw_brokers::fixture::pulsar::equip(fixture, &url, admin).await
}

fn main() {
    event_retry_testkit::run(Adapter {
        name: "pulsar",
        url_env: Some("RETRY_TEST_PULSAR"),
        container: event_retry_testkit::hooks::PULSAR,
        connect: |url| Box::pin(connect(url)),
    })
}
