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

/// Every scenario but `crash_mid_handle_redelivered`.
const SCENARIOS: [&str; 17] = [
    "success_acked_once",
    "transient_then_success",
    "policy_spent_to_dlq",
    "non_retryable_to_dlq",
    "non_blocking_isolation",
    "blocking_pauses_in_order",
    "per_key_ordering",
    "dlq_replay",
    "poison_input_to_dlq",
    "duplicate_delivery_idempotent",
    "bytes_preserved_every_hop",
    "delay_precision",
    "rebalance_during_retries",
    "dlq_unwritable_holds",
    "graceful_shutdown",
    "groups_each_get_every_event",
    "trace_context_every_hop",
];

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
