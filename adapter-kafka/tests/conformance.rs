//! The conformance suite against a real Kafka broker (`RETRY_TEST_KAFKA`, started by `scripts/brokers`),
//! with the adapter's defaults but the suite's ladder (see [`suite`]). The report's column is `kafka`.

use conformance_tests::Adapter;

mod suite;

fn main() {
    conformance_tests::run(Adapter {
        name: "kafka",
        url_env: Some("RETRY_TEST_KAFKA"),
        connect: |url| Box::pin(suite::connect(url, "kafka", suite::suite_config())),
    })
}
