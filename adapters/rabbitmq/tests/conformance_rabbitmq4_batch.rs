//! The conformance suite against RabbitMQ 4 (`RETRY_TEST_AMQP4`) with a batch handler, as
//! `tests/conformance_batch.rs` runs it against Debian 12's RabbitMQ. The report's column is
//! `rabbitmq4-batch`.

mod suite;

use event_retry_rabbitmq::RabbitConfig;
use event_retry_testkit::Adapter;

fn main() {
    event_retry_testkit::run(Adapter {
        name: "rabbitmq4-batch",
        url_env: Some("RETRY_TEST_AMQP4"),
        container: None,
        connect: |url| {
            Box::pin(async move {
                suite::connect(
                    url,
                    "rabbitmq4-batch",
                    "RETRY_TEST_AMQP4",
                    RabbitConfig::default(),
                )
                .await
                .map(|fixture| fixture.with_batch_handler())
            })
        },
    })
}
