//! The conformance suite against a real Kafka broker (`RETRY_TEST_KAFKA`, started by `scripts/brokers`),
//! with the adapter's defaults but the suite's ladder (see [`suite`]). The report's column is `kafka`.

use event_retry_testkit::Adapter;

mod suite;

fn main() {
    event_retry_testkit::run(Adapter {
        name: "kafka",
        url_env: Some("RETRY_TEST_KAFKA"),
        container: event_retry_testkit::hooks::KAFKA,
        connect: |url| Box::pin(suite::connect(url, "kafka", suite::suite_config())),
    })
}
