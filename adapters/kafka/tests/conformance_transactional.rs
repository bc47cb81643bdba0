//! The whole conformance suite against a real Kafka broker (`RETRY_TEST_KAFKA`) with transactional hops:
//! every retry, DLQ and ladder copy committed in one transaction with the offset of the record it
//! copies. The report's column is `kafka-transactional`.
//!
//! Every scenario runs. In the consumer-killed-mid-handle one (`crash_mid_handle_redelivered`) the
//! killed consumer's retries wait behind events that hang in its handler, so their offsets cannot be
//! committed with them: after a second each is committed without its offset (`STRANDED_AFTER` in the
//! consumer's commits), which schedules it, and the survivor consumes those records again and copies
//! them a second time. `tests/broker.rs` shows both sides of a crash with transactional hops: exactly
//! one copy of each retry committed with its offset, two of one committed without.

use event_retry_kafka::KafkaConfig;
use event_retry_testkit::Adapter;

mod suite;

fn main() {
    event_retry_testkit::run(Adapter {
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
    })
}
