//! What the Pulsar conformance binaries share: the fixture over the broker the suite runs against.

use std::time::Duration;

use event_retry_core::broker::Broker;
use event_retry_pulsar::{PulsarConfig, PulsarTransport};
use event_retry_testkit::Fixture;

/// A fixture named `name` over the broker at `url`, with its raw client, view and faults.
pub(crate) async fn connect(url: String, name: &'static str) -> Result<Fixture, String> {
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
    let fixture = Fixture::new(name, Broker::new(transport), Duration::from_millis(300));
    raw_brokers::fixture::pulsar::equip(fixture, &url, admin).await
}
