//! The conformance suite against an SQS endpoint (`RETRY_TEST_SQS`), over FIFO queues: the report's
//! `sqs-fifo` column. A FIFO queue keeps per-key order (the key is the message group), so the per-key
//! ordering scenario runs here; a delay must fit the visibility window.

mod fixture;

fn main() {
    event_retry_testkit::run(event_retry_testkit::Adapter {
        name: "sqs-fifo",
        url_env: Some("RETRY_TEST_SQS"),
        container: event_retry_testkit::hooks::SQS,
        connect: |url| {
            Box::pin(fixture::connect(
                "sqs-fifo",
                url,
                ".fifo",
                Default::default(),
            ))
        },
    })
}
