//! The conformance suite against a real Kafka broker (`RETRY_TEST_KAFKA`) with a batch handler: every
//! scenario's consumer is started with `start_batch`, the scenario's per-event script run on each event
//! of a batch (the records the consumer thread has handed over at once). The report's column is
//! `kafka-batch`.

use event_retry_testkit::Adapter;

mod suite;

fn main() {
    event_retry_testkit::run(Adapter {
        name: "kafka-batch",
        url_env: Some("RETRY_TEST_KAFKA"),
        container: event_retry_testkit::hooks::KAFKA,
        connect: |url| {
            Box::pin(async move {
                suite::connect(url, "kafka-batch", suite::suite_config())
                    .await
                    .map(|fixture| fixture.with_batch_handler())
            })
        },
    })
}
