//! The conformance suite against a real RabbitMQ broker (`RETRY_TEST_AMQP`, started by `scripts/brokers`).
//!
//! Each scenario gets its own work queue and DLQ, with the adapter's default settings. The raw client,
//! the broker's view (with `rabbitmqctl` on the node `RETRY_TEST_AMQP_NODE` names) and the DLQ fault are
//! `raw_brokers::fixture::rabbitmq`'s.

mod suite;

use event_retry_rabbitmq::RabbitConfig;
use event_retry_testkit::Adapter;

fn main() {
    event_retry_testkit::run(Adapter {
        name: "rabbitmq",
        url_env: Some("RETRY_TEST_AMQP"),
        container: event_retry_testkit::hooks::RABBITMQ,
        connect: |url| {
            Box::pin(suite::connect(
                url,
                "rabbitmq",
                "RETRY_TEST_AMQP",
                RabbitConfig::default(),
            ))
        },
    })
}
