//! The conformance suite against the same broker as `tests/conformance.rs` (`RETRY_TEST_PULSAR`), with a batch
//! handler: every scenario's consumer is started with `start_batch`, the scenario's per-event script run
//! on each event of a batch (the deliveries the subscription already holds). The report's column is
//! `pulsar-batch`.

mod suite;

use event_retry_testkit::Adapter;

fn main() {
    event_retry_testkit::run(Adapter {
        name: "pulsar-batch",
        url_env: Some("RETRY_TEST_PULSAR"),
        container: event_retry_testkit::hooks::PULSAR,
        connect: |url| {
            Box::pin(async move {
                suite::connect(url, "pulsar-batch")
                    .await
                    .map(|fixture| fixture.with_batch_handler())
            })
        },
    })
}
