//! The conformance suite against RabbitMQ 4 (`RETRY_TEST_AMQP4`, started by `scripts/brokers start
//! rabbitmq4`: Debian 13's RabbitMQ 4.0 in a root of its own), with the adapter's default settings
//! (classic queues). The broker's view is read with the node's own `rabbitmqctl`
//! (`RETRY_TEST_AMQP4_CTL`). The report's column is `rabbitmq4`.

mod suite;

use event_retry_rabbitmq::RabbitConfig;
use event_retry_testkit::Adapter;

fn main() {
    event_retry_testkit::run(Adapter {
        name: "rabbitmq4",
        url_env: Some("RETRY_TEST_AMQP4"),
        container: None,
        connect: |url| {
            Box::pin(suite::connect(
                url,
                "rabbitmq4",
                "RETRY_TEST_AMQP4",
                RabbitConfig::default(),
            ))
        },
    })
}
