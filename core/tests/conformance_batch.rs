//! The conformance suite against the in-memory transport with a batch handler: every scenario's consumer
//! is started with `start_batch`, its per-event script run on each event of a batch.

mod memory_fixture;

fn main() {
    event_retry_testkit::run(event_retry_testkit::Adapter {
        name: "memory-batch",
        url_env: None,
        container: None,
        connect: |_url| {
            Box::pin(async { Ok(memory_fixture::fixture("memory-batch").with_batch_handler()) })
        },
    })
}
