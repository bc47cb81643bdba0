//! The conformance suite against the in-memory transport on a current-thread Tokio runtime, where the
//! consumer polls each delivery in its receive loop first and makes a task only of one that must wait.

mod memory_fixture;

fn main() {
    event_retry_testkit::run_current_thread(event_retry_testkit::Adapter {
        name: "memory-current-thread",
        url_env: None,
        container: None,
        connect: |_url| Box::pin(async { Ok(memory_fixture::fixture("memory-current-thread")) }),
    })
}
