//! The conformance suite against an SQS endpoint (`RETRY_TEST_SQS`; ElasticMQ started by
//! `scripts/brokers`).
//!
//! Each scenario gets its own queue, DLQ and redrive policy, with the adapter's default settings. The DLQ
//! fault deletes the DLQ queue (a dead-letter send then fails) and creates it again. The raw client sends
//! and reads messages with aws-sdk-sqs directly, so scenario 12 compares what SQS itself holds.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName};
use conformance_tests::{Adapter, Faults, Fixture, Inspect, NativeMessage, RawClient, hex};
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

/// Sends and reads messages with aws-sdk-sqs itself.
struct RawSqs {
    client: Client,
    dlq_suffix: String,
}

/// A message's body and its attributes (SQS returns them as a map: listed by name), each with its data
/// type; the SDK's `x-retry*` attributes left out.
fn describe(
    body: &str,
    attributes: Option<&std::collections::HashMap<String, MessageAttributeValue>>,
) -> NativeMessage {
    let mut lines = vec![("payload".to_string(), hex(body.as_bytes()))];
    let mut attrs: Vec<_> = attributes
        .into_iter()
        .flatten()
        .filter(|(name, _)| !name.starts_with("x-retry"))
        .map(|(name, v)| {
            let value = match (v.string_value(), v.binary_value()) {
                (Some(s), _) => format!("{} {s:?}", v.data_type()),
                (None, Some(b)) => format!("{} {}", v.data_type(), hex(b.as_ref())),
                (None, None) => v.data_type().to_string(),
            };
            (format!("attribute {name}"), value)
        })
        .collect();
    attrs.sort();
    lines.extend(attrs);
    lines
}

impl RawSqs {
    async fn url(&self, queue: &str) -> Result<String, Error> {
        Ok(self
            .client
            .get_queue_url()
            .queue_name(queue)
            .send()
            .await
            .map_err(wrap(Kind::NotFound, format!("look up {queue}")))?
            .queue_url
            .unwrap_or_default())
    }
}

#[async_trait]
impl RawClient for RawSqs {
    /// Nine attributes of every data type — String, Number, Binary holding text and holding bytes,
    /// and custom labels on each (`String.x`, `Number.int`, `Binary.gz`) — leaving the SDK one of SQS's
    /// ten. (A message with all ten is scenario 12's SDK-level check and the adapter's broker test.)
    async fn publish_native(&self, topic: &str, payload: &[u8]) -> Result<NativeMessage, Error> {
        let body = String::from_utf8_lossy(payload).into_owned();
        let typed = |data_type: &str, text: Option<&str>, binary: Option<&[u8]>| {
            let mut b = MessageAttributeValue::builder().data_type(data_type);
            if let Some(t) = text {
                b = b.string_value(t);
            }
            if let Some(bin) = binary {
                b = b.binary_value(Blob::new(bin.to_vec()));
            }
            b.build().map_err(wrap(Kind::Other, "build an attribute"))
        };
        let attributes: std::collections::HashMap<String, MessageAttributeValue> = [
            ("zulu", typed("String", Some("héllo"), None)?),
            ("number", typed("Number", Some("12.50"), None)?),
            ("big-number", typed("Number", Some("-1e10"), None)?),
            (
                "text-as-binary",
                typed("Binary", None, Some(b"plain text"))?,
            ),
            ("bytes", typed("Binary", None, Some(&[0xff, 0x00, 0x80]))?),
            ("custom-string", typed("String.x", Some("labelled"), None)?),
            ("custom-number", typed("Number.int", Some("42"), None)?),
            (
                "custom-binary",
                typed("Binary.gz", None, Some(&[0x1f, 0x8b]))?,
            ),
            (
                "content-type",
                typed("String", Some("application/x-custom"), None)?,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        self.client
            .send_message()
            .queue_url(self.url(topic).await?)
            .message_body(&body)
            .set_message_attributes(Some(attributes.clone()))
            .send()
            .await
            .map_err(wrap(Kind::Rejected, "raw send"))?;
        Ok(describe(&body, Some(&attributes)))
    }

    /// Receives every message of the DLQ with a short visibility timeout, so they come back at once.
    async fn dead_letters(&self, topic: &str) -> Result<Vec<NativeMessage>, Error> {
        let url = self.url(&format!("{topic}{}", self.dlq_suffix)).await?;
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for _ in 0..5 {
            let got = self
                .client
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(10)
                .visibility_timeout(2)
                .wait_time_seconds(1)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(wrap(Kind::Connection, "read the DLQ"))?;
            let messages = got.messages.unwrap_or_default();
            if messages.is_empty() {
                break;
            }
            for m in messages {
                if seen.insert(m.message_id().unwrap_or_default().to_string()) {
                    out.push(describe(
                        m.body().unwrap_or_default(),
                        m.message_attributes(),
                    ));
                }
            }
        }
        Ok(out)
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
    let raw = RawSqs {
        client: raw_client(&url),
        dlq_suffix: transport.config().dlq_suffix.clone(),
    };
    Ok(Fixture::new("sqs", broker, Duration::from_secs(1))
        .with_faults(DlqQueue(transport))
        .with_inspect(QueueCounts(raw_client(&url)))
        .with_raw_client(raw))
}

fn main() {
    conformance_tests::run(Adapter {
        name: "sqs",
        url_env: Some("RETRY_TEST_SQS"),
        connect: |url| Box::pin(connect(url)),
    })
}
