//! What the RabbitMQ conformance binaries share: the fixture over the broker the suite runs against.

use std::time::Duration;

use event_retry_core::broker::Broker;
use event_retry_rabbitmq::RabbitTransport;
use event_retry_testkit::Fixture;

/// A fixture named `name` over the broker at `url`, with its raw client, view and faults.
pub(crate) async fn connect(url: String, name: &'static str) -> Result<Fixture, String> {
    let transport = RabbitTransport::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let fixture = Fixture::new(name, Broker::new(transport), Duration::from_millis(250));
    let node = event_retry_testkit::env::url("RETRY_TEST_AMQP_NODE");
    raw_brokers::fixture::rabbitmq::equip(fixture, &url, node)
        .await
        .map_err(|e| e.to_string())
}
