//! The conformance suite against an SQS endpoint (`RETRY_TEST_SQS`; ElasticMQ started by
//! `scripts/brokers`), over standard queues with `retry_queue=false`: every retry the received message
//! itself, hidden in the source queue by its visibility. The report's `sqs-visibility` column.

mod fixture;

fn main() {
    event_retry_testkit::run(event_retry_testkit::Adapter {
        name: "sqs-visibility",
        url_env: Some("RETRY_TEST_SQS"),
        container: event_retry_testkit::hooks::SQS,
        connect: |url| {
            Box::pin(fixture::connect(
                "sqs-visibility",
                url,
                "",
                event_retry_sqs::SqsConfig {
                    retry_queue: false,
                    ..Default::default()
                },
            ))
        },
    })
}
