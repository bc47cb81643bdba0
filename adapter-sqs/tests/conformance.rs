//! The conformance suite against an SQS endpoint (`RETRY_TEST_SQS`; ElasticMQ started by
//! `scripts/brokers`).
//!
//! Each scenario gets its own queue, DLQ and redrive policy, with the adapter's default settings. The DLQ
//! fault deletes the DLQ queue (a dead-letter send then fails) and creates it again.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::QueueAttributeName;
use conformance_tests::{Adapter, Faults, Fixture, Inspect};
use event_retry_sqs::SqsTransport;
use retry_core::adapter::Admin;
use retry_core::broker::Broker;
use retry_core::error::{Error, Kind, wrap};

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

/// Reads a queue's approximate counts with a raw aws-sdk-sqs client.
struct QueueCounts(Client);

/// Messages in the topic's queue, visible, in flight or delayed (consumers of every group share it).
#[async_trait]
impl Inspect for QueueCounts {
    async fn held_in_source(&self, topic: &str, _group: &str) -> Result<u64, Error> {
        let url = self
            .0
            .get_queue_url()
            .queue_name(topic)
            .send()
            .await
            .map_err(wrap(Kind::NotFound, format!("look up {topic}")))?
            .queue_url
            .unwrap_or_default();
        let attributes = self
            .0
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(wrap(
                Kind::Connection,
                format!("read the counts of {topic}"),
            ))?
            .attributes
            .unwrap_or_default();
        Ok([
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            QueueAttributeName::ApproximateNumberOfMessagesDelayed,
        ]
        .iter()
        .filter_map(|name| attributes.get(name)?.parse::<u64>().ok())
        .sum())
    }
}

fn raw_client(url: &str) -> Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(url)
        .credentials_provider(Credentials::new("local", "local", None, None, "test"))
        .build();
    Client::from_conf(config)
}

async fn connect(url: String) -> Result<Fixture, String> {
    let transport = SqsTransport::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let broker = Broker::new(transport.clone());
    Ok(Fixture::new("sqs", broker, Duration::from_secs(1))
        .with_faults(DlqQueue(transport))
        .with_inspect(QueueCounts(raw_client(&url))))
}

fn main() {
    conformance_tests::run(Adapter {
        name: "sqs",
        url_env: Some("RETRY_TEST_SQS"),
        connect: |url| Box::pin(connect(url)),
    })
}
