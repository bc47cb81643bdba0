//! The conformance suite against a Pulsar standalone (`RETRY_TEST_PULSAR`, started by `scripts/brokers`
//! with a short delayed-delivery tick and strict `deliverAt`, which the adapter reads from the admin
//! API at `RETRY_TEST_PULSAR_ADMIN`).
//!
//! Each scenario gets its own topics. The raw client, the broker's view and the DLQ fault (through the
//! admin REST API; without its URL the DLQ-unwritable scenario is skipped, with the reason) are
//! `raw_brokers::fixture::pulsar`'s.

mod suite;

use event_retry_testkit::Adapter;

fn main() {
    event_retry_testkit::run(Adapter {
        name: "pulsar",
        url_env: Some("RETRY_TEST_PULSAR"),
        container: event_retry_testkit::hooks::PULSAR,
        connect: |url| Box::pin(suite::connect(url, "pulsar")),
    })
}
