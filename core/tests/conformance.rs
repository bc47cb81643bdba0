//! The conformance suite against the in-memory transport — called exactly as every broker adapter calls
//! it: a fixture over the broker, then `event_retry_testkit::run`.

mod memory_fixture;

fn main() {
    event_retry_testkit::run(event_retry_testkit::Adapter {
        name: "memory",
        url_env: None,
        container: None,
        connect: |_url| Box::pin(async { Ok(memory_fixture::fixture("memory")) }),
    })
}
