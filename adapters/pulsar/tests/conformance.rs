//! The conformance suite against a Pulsar standalone (`RETRY_TEST_PULSAR`, started by `scripts/brokers`
//! with a delayed-delivery tick of 100 ms and strict `deliverAt`, which the adapter reads from the admin
//! API at `RETRY_TEST_PULSAR_ADMIN`).
//!
//! Each scenario gets its own topics. The DLQ fault terminates the DLQ topic through the admin REST API
//! (`RETRY_TEST_PULSAR_ADMIN`, called with curl), so sends to it fail, and makes it writable again by
//! deleting it, to be created anew; without the admin URL the scenario is skipped, with the reason. The
//! raw client publishes and reads messages with the pulsar crate directly, so scenario 12 compares what
//! Pulsar itself holds.

use std::time::Duration;

use async_trait::async_trait;
use event_retry_core::adapter::Admin;
use event_retry_core::broker::Broker;
use event_retry_core::error::{Error, Kind, wrap};
use event_retry_pulsar::{PulsarConfig, PulsarTransport};
use event_retry_testkit::{Adapter, Faults, Fixture, Inspect, NativeMessage, RawClient, hex};
use futures::StreamExt;
use pulsar::consumer::InitialPosition;
use pulsar::proto::MessageMetadata;
use pulsar::{ConsumerOptions, Pulsar, SubType, TokioExecutor, producer};

/// Terminates and deletes DLQ topics through the admin REST API.
struct AdminApi {
    transport: PulsarTransport,
    admin: String,
}

impl AdminApi {
    /// Calls the admin REST API on the path of `topic` (`persistent/public/default/<topic>`); returns the
    /// response body. A 404 is an error of kind `NotFound`.
    async fn call(&self, method: &str, topic: &str, action: &str) -> Result<String, Error> {
        let url = format!(
            "{}/admin/v2/persistent/public/default/{topic}{action}",
            self.admin
        );
        let out = tokio::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "30",
                "-w",
                "\n%{http_code}",
                "-X",
                method,
                &url,
            ])
            .output()
            .await
            .map_err(|e| Error::from_source(Kind::Other, e).with_operation("run curl"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
        let failed = |kind, what: String| {
            Err(Error::new(kind, what).with_operation(format!("{method} {url}")))
        };
        match status.trim().parse::<u16>() {
            Ok(200..=299) => Ok(body.to_string()),
            Ok(404) => failed(Kind::NotFound, format!("404: {body}")),
            Ok(code) => failed(Kind::Rejected, format!("{code}: {body}")),
            Err(_) => failed(
                Kind::Connection,
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ),
        }
    }
}

#[async_trait]
impl Faults for AdminApi {
    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), Error> {
        let dlq = format!("{topic}{}", self.transport.config().dlq_suffix);
        if writable {
            self.call("DELETE", &dlq, "?force=true").await?;
            self.transport.declare(topic, None).await
        } else {
            self.call("POST", &dlq, "/terminate").await.map(drop)
        }
    }
}

/// The group's backlog on the topic (messages it has not acknowledged), from the broker's topic stats.
#[async_trait]
impl Inspect for AdminApi {
    async fn held_in_source(&self, topic: &str, group: &str) -> Result<u64, Error> {
        let body = self.call("GET", topic, "/stats").await?;
        let stats: serde_json::Value = serde_json::from_str(&body)
            .map_err(wrap(Kind::Other, format!("read the stats of {topic}")))?;
        Ok(stats["subscriptions"][group]["msgBacklog"]
            .as_u64()
            .unwrap_or(0))
    }

    /// Every message published to the group's retry topic (`msgInCounter`); none when it does not exist.
    async fn sent_to_retry_route(&self, topic: &str, group: &str) -> Result<Option<u64>, Error> {
        let retry = format!("{topic}-{group}{}", self.transport.config().retry_suffix);
        match self.call("GET", &retry, "/stats").await {
            Ok(body) => {
                let stats: serde_json::Value = serde_json::from_str(&body)
                    .map_err(wrap(Kind::Other, format!("read the stats of {retry}")))?;
                Ok(Some(stats["msgInCounter"].as_u64().unwrap_or(0)))
            }
            Err(e) if e.kind() == Kind::NotFound => Ok(Some(0)),
            Err(e) => Err(e),
        }
    }
}

/// Publishes and reads messages with the pulsar crate itself.
struct RawPulsar {
    client: Pulsar<TokioExecutor>,
    config: PulsarConfig,
}

/// A message's properties (the client writes them from a map, so they are listed by name), keys, the
/// partition key's base64 flag and the event time; the SDK's `x-retry-*` properties left out.
fn describe(payload: &[u8], metadata: &MessageMetadata) -> NativeMessage {
    let mut lines = vec![("payload".to_string(), hex(payload))];
    let mut properties: Vec<_> = metadata
        .properties
        .iter()
        .filter(|kv| !kv.key.starts_with("x-retry"))
        .map(|kv| (format!("property {}", kv.key), kv.value.clone()))
        .collect();
    properties.sort();
    lines.extend(properties);
    let mut field = |name: &str, value: Option<String>| {
        lines.push((name.to_string(), value.unwrap_or_else(|| "absent".into())));
    };
    field("partition-key", metadata.partition_key.clone());
    field(
        "partition-key-b64",
        metadata.partition_key_b64_encoded.map(|b| b.to_string()),
    );
    field("ordering-key", metadata.ordering_key.as_deref().map(hex));
    field("event-time", metadata.event_time.map(|t| t.to_string()));
    lines
}

#[async_trait]
impl RawClient for RawPulsar {
    /// Properties, a partition key and a different ordering key, and an event time.
    async fn publish_native(&self, topic: &str, payload: &[u8]) -> Result<NativeMessage, Error> {
        let message = producer::Message {
            payload: payload.to_vec(),
            properties: [
                ("zulu", "last by name"),
                ("alpha", "héllo"),
                ("content-type", "application/x-custom"),
                ("empty", ""),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            partition_key: Some("partition-7".into()),
            ordering_key: Some(vec![0x00, 0xff, b'o']),
            event_time: Some(1_700_000_000_000),
            ..producer::Message::default()
        };
        let mut producer = self
            .client
            .producer()
            .with_topic(self.config.full_name(topic))
            .build()
            .await
            .map_err(wrap(Kind::Connection, "create a raw producer"))?;
        let metadata = MessageMetadata {
            properties: message
                .properties
                .iter()
                .map(|(key, value)| pulsar::proto::KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            partition_key: message.partition_key.clone(),
            partition_key_b64_encoded: message.partition_key_b64_encoded,
            ordering_key: message.ordering_key.clone(),
            event_time: message.event_time,
            ..MessageMetadata::default()
        };
        producer
            .send_non_blocking(message)
            .await
            .map_err(wrap(Kind::Rejected, "raw publish"))?
            .await
            .map_err(wrap(Kind::Rejected, "raw publish receipt"))?;
        let _ = producer.close().await;
        Ok(describe(payload, &metadata))
    }

    /// Reads the DLQ topic from its start on a subscription of its own, which it then removes.
    async fn dead_letters(&self, topic: &str) -> Result<Vec<NativeMessage>, Error> {
        let subscription = format!("raw-reader-{}", uuid::Uuid::new_v4().simple());
        let mut consumer: pulsar::Consumer<Vec<u8>, TokioExecutor> = self
            .client
            .consumer()
            .with_topic(self.config.dlq_topic(topic))
            .with_subscription(&subscription)
            .with_subscription_type(SubType::Exclusive)
            .with_options(
                ConsumerOptions::default().with_initial_position(InitialPosition::Earliest),
            )
            .build()
            .await
            .map_err(wrap(Kind::Connection, "subscribe a raw reader"))?;
        let mut out = Vec::new();
        while let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(1_500), consumer.next()).await
        {
            let message = message.map_err(wrap(Kind::Connection, "read the DLQ"))?;
            out.push(describe(&message.payload.data, &message.payload.metadata));
        }
        let _ = consumer.unsubscribe().await;
        let _ = consumer.close().await;
        Ok(out)
    }
}

async fn connect(url: String) -> Result<Fixture, String> {
    // With the admin API the adapter reads the broker's tick and strictness itself (scripts/brokers
    // starts Pulsar with a 100 ms tick and strict deliverAt); without it, they are given here.
    let config = match test_support::broker::url("RETRY_TEST_PULSAR_ADMIN") {
        Some(admin) => PulsarConfig {
            admin_url: Some(admin),
            ..PulsarConfig::default()
        },
        None => PulsarConfig {
            tick: Duration::from_millis(100),
            strict_deliver_at: true,
            ..PulsarConfig::default()
        },
    };
    let transport = PulsarTransport::connect_with(&url, config)
        .await
        .map_err(|e| e.to_string())?;
    let raw = RawPulsar {
        client: Pulsar::builder(url.as_str(), TokioExecutor)
            .build()
            .await
            .map_err(|e| e.to_string())?,
        config: transport.config().clone(),
    };
    let fixture = Fixture::new(
        "pulsar",
        Broker::new(transport.clone()),
        Duration::from_millis(300),
    )
    .with_raw_client(raw);
    Ok(match test_support::broker::url("RETRY_TEST_PULSAR_ADMIN") {
        Some(admin) => fixture
            .with_faults(AdminApi {
                transport: transport.clone(),
                admin: admin.clone(),
            })
            .with_inspect(AdminApi { transport, admin }),
        None => fixture,
    })
}

fn main() {
    event_retry_testkit::run(Adapter {
        name: "pulsar",
        url_env: Some("RETRY_TEST_PULSAR"),
        container: event_retry_testkit::hooks::PULSAR,
        connect: |url| Box::pin(connect(url)),
    })
}
