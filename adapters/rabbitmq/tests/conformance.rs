//! The conformance suite against a real RabbitMQ broker (`RETRY_TEST_AMQP`, started by `scripts/brokers`).
//!
//! Each scenario gets its own work queue and DLQ, with the adapter's default settings. The raw client,
//! the broker's view (with `rabbitmqctl` on the node `RETRY_TEST_AMQP_NODE` names) and the DLQ fault are
//! `raw_brokers::fixture::rabbitmq`'s.

use std::time::Duration;

use event_retry_core::broker::Broker;
use event_retry_rabbitmq::RabbitTransport;
use event_retry_testkit::{Adapter, Fixture};

async fn connect(url: String) -> Result<Fixture, String> {
    let transport = RabbitTransport::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let fixture = Fixture::new(
        "rabbitmq",
        Broker::new(transport),
        Duration::from_millis(250),
    );
    let node = event_retry_testkit::env::url("RETRY_TEST_AMQP_NODE");
    Ok(raw_brokers::fixture::rabbitmq::equip(fixture, &url, node))
}

fn main() {
    event_retry_testkit::run(Adapter {
        name: "rabbitmq",
        url_env: Some("RETRY_TEST_AMQP"),
        container: event_retry_testkit::hooks::RABBITMQ,
        connect: |url| Box::pin(connect(url)),
    })
}
