//! The whole conformance suite against a real Kafka broker (`RETRY_TEST_KAFKA`) with transactional hops:
//! every retry, DLQ and ladder copy committed in one transaction with the offset of the record it
//! copies. The report's column is `kafka-transactional`.
//!
//! Every scenario runs but the consumer-killed-mid-handle one (`crash_mid_handle_redelivered`, a
//! consumer killed with retries scheduled): there the killed consumer's
//! retries wait behind events that hang in its handler, and with transactional hops a retry is
//! scheduled only once its offset can be committed with it, which those events prevent — a crash undoes
//! an uncommitted hop, and the record is consumed again. `tests/broker.rs` shows what a crash does to
//! transactional hops instead: exactly one copy of each retry.

use event_retry_kafka::KafkaConfig;
use event_retry_testkit::Adapter;

mod suite;

/// Every scenario but the consumer-killed-mid-handle one (the suite selects scenarios by number: it is
/// number 8).
const SCENARIOS: [u8; 17] = [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18];

fn main() {
    event_retry_testkit::run_only(
        Adapter {
            name: "kafka-transactional",
            url_env: Some("RETRY_TEST_KAFKA"),
            container: event_retry_testkit::hooks::KAFKA,
            connect: |url| {
                Box::pin(suite::connect(
                    url,
                    "kafka-transactional",
                    KafkaConfig {
                        transactional_hops: true,
                        ..suite::suite_config()
                    },
                ))
            },
        },
        &SCENARIOS,
    )
}
