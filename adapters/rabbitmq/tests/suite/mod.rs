//! What the RabbitMQ conformance binaries share: the fixture over the broker the suite runs against.

use std::time::Duration;

use event_retry_core::broker::Broker;
use event_retry_rabbitmq::{RabbitConfig, RabbitTransport};
use event_retry_testkit::Fixture;
use raw_brokers::Rabbitmqctl;

/// A fixture named `name` over the broker at `url` with the adapter's settings `config`, its raw
/// client, DLQ fault and the broker's own view through the node that `{node}_NODE` names (and
/// `{node}_CTL`, where the node's `rabbitmqctl` is not the host's): `node` is `RETRY_TEST_AMQP` for
/// Debian 12's RabbitMQ, `RETRY_TEST_AMQP4` for RabbitMQ 4.
pub(crate) async fn connect(
    url: String,
    name: &'static str,
    node: &str,
    config: RabbitConfig,
) -> Result<Fixture, String> {
    let transport = RabbitTransport::connect_with(&url, config)
        .await
        .map_err(|e| e.to_string())?;
    let fixture = Fixture::new(name, Broker::new(transport), Duration::from_millis(250));
    raw_brokers::fixture::rabbitmq::equip(fixture, &url, Rabbitmqctl::from_env(node))
        .await
        .map_err(|e| e.to_string())
}
