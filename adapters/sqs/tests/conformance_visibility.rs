//! The conformance suite against an SQS endpoint (`RETRY_TEST_SQS`; ElasticMQ started by
//! `scripts/brokers`), over standard queues with the `retry_queue` setting: every retry a copy in the
//! queue's retry queue, received beside the source. The report's `sqs-retry-queue` column.

mod fixture;

fn main() {
    event_retry_testkit::run(event_retry_testkit::Adapter {
        name: "sqs-retry-queue",
        url_env: Some("RETRY_TEST_SQS"),
        container: event_retry_testkit::hooks::SQS,
        connect: |url| {
            Box::pin(fixture::connect(
                "sqs-retry-queue",
                url,
                "",
                event_retry_sqs::SqsConfig {
                    retry_queue: true,
                    ..Default::default()
                },
            ))
        },
    })
}
