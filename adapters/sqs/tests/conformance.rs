//! The conformance suite against an SQS endpoint (`RETRY_TEST_SQS`; ElasticMQ started by
//! `scripts/brokers`), over standard queues: the report's `sqs` column.

mod fixture;

fn main() {
    event_retry_testkit::run(event_retry_testkit::Adapter {
        name: "sqs",
        url_env: Some("RETRY_TEST_SQS"),
        container: event_retry_testkit::hooks::SQS,
        connect: |url| Box::pin(fixture::connect("sqs", url, "", Default::default())),
    })
}
