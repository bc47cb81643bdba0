//! The conformance suite against the same broker as `tests/conformance.rs` (`RETRY_TEST_AMQP`), with a batch
//! handler: every scenario's consumer is started with `start_batch`, the scenario's per-event script run
//! on each event of a batch (the deliveries the subscription already holds). The report's column is
//! `rabbitmq-batch`.

mod suite;

use event_retry_rabbitmq::RabbitConfig;
use event_retry_testkit::Adapter;

fn main() {
    event_retry_testkit::run(Adapter {
        name: "rabbitmq-batch",
        url_env: Some("RETRY_TEST_AMQP"),
        container: event_retry_testkit::hooks::RABBITMQ,
        connect: |url| {
            Box::pin(async move {
                suite::connect(
                    url,
                    "rabbitmq-batch",
                    "RETRY_TEST_AMQP",
                    RabbitConfig::default(),
                )
                .await
                .map(|fixture| fixture.with_batch_handler())
            })
        },
    })
}
