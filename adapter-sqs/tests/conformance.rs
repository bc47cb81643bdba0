//! The conformance suite against an SQS endpoint (`RETRY_TEST_SQS`; ElasticMQ started by
//! `scripts/brokers`), over standard queues: the report's `sqs` column.

mod fixture;

fn main() {
    conformance_tests::run(conformance_tests::Adapter {
        name: "sqs",
        url_env: Some("RETRY_TEST_SQS"),
        connect: |url| Box::pin(fixture::connect("sqs", url, "")),
    })
}
