//! The conformance suite against an SQS endpoint (`RETRY_TEST_SQS`; ElasticMQ started by
//! `scripts/brokers`).
//!
//! Each scenario gets its own queue, DLQ and redrive policy, with the adapter's default settings. The DLQ
//! fault deletes the DLQ queue (a dead-letter send then fails) and creates it again.

use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{Adapter, Faults, Fixture};
use event_retry_sqs::SqsTransport;
use retry_core::adapter::Admin;
use retry_core::broker::Broker;
use retry_core::error::Error;

/// Deletes and re-creates a topic's DLQ queue.
struct DlqQueue(SqsTransport);

#[async_trait]
impl Faults for DlqQueue {
    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), Error> {
        if writable {
            self.0.declare(topic, None).await
        } else {
            self.0.delete_dlq(topic).await
        }
    }
}

async fn connect(url: String) -> Result<Fixture, String> {
    let transport = SqsTransport::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let broker = Broker::new(transport.clone());
    Ok(Fixture::new("sqs", broker, Duration::from_secs(1)).with_faults(DlqQueue(transport)))
}

fn main() {
    conformance_tests::run(Adapter {
        name: "sqs",
        url_env: Some("RETRY_TEST_SQS"),
        connect: |url| Box::pin(connect(url)),
    })
}
