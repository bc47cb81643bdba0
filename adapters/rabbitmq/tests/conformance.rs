//! The conformance suite against a real RabbitMQ broker (`RETRY_TEST_AMQP`, started by `scripts/brokers`).
//!
//! Each scenario gets its own work queue and DLQ, with the adapter's default settings. The DLQ fault
//! deletes the DLQ queue (a dead-letter publish then comes back unroutable) and declares it again. The
//! raw client publishes and reads messages with lapin directly, so scenario 12 compares what RabbitMQ
//! itself holds.

use std::time::Duration;

use async_trait::async_trait;
use event_retry_core::adapter::Admin;
use event_retry_core::broker::Broker;
use event_retry_core::error::{Error, Kind, wrap};
use event_retry_rabbitmq::RabbitTransport;
use event_retry_testkit::{
    Adapter, Faults, Fixture, HeldParts, Inspect, NativeMessage, RawClient, hex,
};
use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, DecimalValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};

/// Deletes a topic's DLQ queue with lapin, and re-declares it through the SDK.
struct DlqQueue {
    transport: RabbitTransport,
    raw: raw_brokers::RawRabbit,
}

#[async_trait]
impl Faults for DlqQueue {
    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), Error> {
        if writable {
            self.transport.declare(topic, None).await
        } else {
            // The SDK still takes the topic as declared, so nothing declares the DLQ again behind the
            // test's back.
            let dlq = self.transport.names(topic, None).await?.dlq;
            self.raw
                .delete_queue(&dlq)
                .await
                .map_err(|e| Error::new(Kind::Connection, format!("delete {dlq}: {e}")))
        }
    }
}

/// Reads a work queue's counts with the broker's own tool: `rabbitmqctl list_queues` on the node
/// `RETRY_TEST_AMQP_NODE` names (AMQP itself tells only the messages ready, not those a consumer holds
/// unacknowledged), and the delay ladder's messages with lapin.
struct QueueDepth {
    node: String,
    url: String,
    transport: RabbitTransport,
}

impl QueueDepth {
    /// The group's work queue's messages ready and unacknowledged.
    async fn counts(&self, topic: &str, group: &str) -> Result<HeldParts, Error> {
        let queue = self.transport.names(topic, Some(group)).await?.topic;
        let out = tokio::process::Command::new("rabbitmqctl")
            .args([
                "-q",
                "-n",
                &self.node,
                "list_queues",
                "name",
                "messages_ready",
                "messages_unacknowledged",
                "--formatter",
                "json",
            ])
            .output()
            .await
            .map_err(wrap(Kind::Other, "run rabbitmqctl"))?;
        if !out.status.success() {
            return Err(Error::new(
                Kind::Connection,
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            )
            .with_operation("rabbitmqctl list_queues"));
        }
        let queues: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)
            .map_err(wrap(Kind::Other, "read rabbitmqctl's output"))?;
        let queue = queues
            .iter()
            .find(|q| q["name"] == queue.as_str())
            .ok_or_else(|| Error::new(Kind::NotFound, format!("no queue {queue}")))?;
        Ok(HeldParts {
            waiting: queue["messages_ready"].as_u64().unwrap_or(0),
            handed_out: queue["messages_unacknowledged"].as_u64().unwrap_or(0),
        })
    }

    /// The queues of the delay ladder's levels, named as the adapter names them.
    fn ladder_queues(&self) -> Vec<String> {
        let config = self.transport.config();
        (0..config.levels)
            .map(|k| {
                format!(
                    "{}.delay-{}ms-{}.{k:02}",
                    config.prefix,
                    config.granularity.as_millis(),
                    config.queue_type.as_str()
                )
            })
            .collect()
    }
}

/// The group's work queue read with `rabbitmqctl`; the retry route is the shared delay ladder, read with
/// lapin message by message: a copy on its way to a work queue carries the queue's name as the last word
/// of its routing key.
#[async_trait]
impl Inspect for QueueDepth {
    async fn held_in_source(&self, topic: &str, group: &str) -> Result<u64, Error> {
        let parts = self.counts(topic, group).await?;
        Ok(parts.waiting + parts.handed_out)
    }

    async fn held_parts(&self, topic: &str, group: &str) -> Result<Option<HeldParts>, Error> {
        self.counts(topic, group).await.map(Some)
    }

    /// The copies on their way through the ladder to the group's work queue now (taken one by one
    /// without an acknowledgement and given back when the connection closes). A copy that already came
    /// out of the ladder waits in the work queue, where [`Inspect::held_parts`] counts it.
    async fn sent_to_retry_route(&self, topic: &str, group: &str) -> Result<Option<u64>, Error> {
        let queue = self.transport.names(topic, Some(group)).await?.topic;
        let suffix = format!(".{queue}");
        let conn = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .map_err(wrap(Kind::Connection, "connect to read the ladder"))?;
        let channel = conn
            .create_channel()
            .await
            .map_err(wrap(Kind::Connection, "open a channel"))?;
        let mut copies = 0;
        let mut read = Ok(());
        'levels: for level in self.ladder_queues() {
            loop {
                match channel
                    .basic_get(level.as_str().into(), BasicGetOptions { no_ack: false })
                    .await
                {
                    Ok(Some(message)) => {
                        if message.delivery.routing_key.as_str().ends_with(&suffix) {
                            copies += 1;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        read = Err(Error::from_source(Kind::Connection, e)
                            .with_operation(format!("read {level}")));
                        break 'levels;
                    }
                }
            }
        }
        // Closing gives every message taken back to its level, unacknowledged.
        let _ = conn.close(200, "read".into()).await;
        read.map(|()| Some(copies))
    }
}

/// Publishes and reads messages with lapin itself.
struct RawAmqp {
    url: String,
    dlq_suffix: String,
}

/// A message's every property and header (typed), without the SDK's `x-retry-*` headers, without
/// `delivery-mode` (a copy is always persistent: see the adapter's README) and without the count a quorum
/// queue adds to a message it delivers again (`x-delivery-count`: here the reads before this one). A header table is a map
/// sorted by name in lapin, so the order of names is the table's.
fn describe(body: &[u8], props: &BasicProperties) -> NativeMessage {
    let mut lines = vec![("payload".to_string(), hex(body))];
    let mut property = |name: &str, value: Option<String>| {
        if let Some(value) = value {
            lines.push((format!("property {name}"), value));
        }
    };
    property(
        "content-type",
        props.content_type().as_ref().map(|v| v.to_string()),
    );
    property(
        "content-encoding",
        props.content_encoding().as_ref().map(|v| v.to_string()),
    );
    property("priority", props.priority().map(|v| v.to_string()));
    property(
        "correlation-id",
        props.correlation_id().as_ref().map(|v| v.to_string()),
    );
    property("reply-to", props.reply_to().as_ref().map(|v| v.to_string()));
    property(
        "expiration",
        props.expiration().as_ref().map(|v| v.to_string()),
    );
    property(
        "message-id",
        props.message_id().as_ref().map(|v| v.to_string()),
    );
    property("timestamp", props.timestamp().map(|v| v.to_string()));
    property("type", props.kind().as_ref().map(|v| v.to_string()));
    property("user-id", props.user_id().as_ref().map(|v| v.to_string()));
    property("app-id", props.app_id().as_ref().map(|v| v.to_string()));
    property(
        "cluster-id",
        props.cluster_id().as_ref().map(|v| v.to_string()),
    );
    if let Some(headers) = props.headers() {
        for (name, value) in headers.inner() {
            if !name.as_str().starts_with("x-retry") && name.as_str() != "x-delivery-count" {
                lines.push((format!("header {name}"), format!("{value:?}")));
            }
        }
    }
    lines
}

impl RawAmqp {
    async fn channel(&self) -> Result<(Connection, lapin::Channel), Error> {
        let conn = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .map_err(wrap(Kind::Connection, "connect a raw client"))?;
        let ch = conn
            .create_channel()
            .await
            .map_err(wrap(Kind::Connection, "open a channel"))?;
        Ok((conn, ch))
    }
}

#[async_trait]
impl RawClient for RawAmqp {
    /// Every AMQP field type in the header table (one-element and empty arrays, a nested table, void),
    /// and every basic property a producer sets (`expiration` left out: the broker would drop the
    /// original before the test reads it).
    async fn publish_native(&self, topic: &str, payload: &[u8]) -> Result<NativeMessage, Error> {
        let mut nested = FieldTable::default();
        nested.insert("inner".into(), AMQPValue::LongLongInt(-1));
        nested.insert("flag".into(), AMQPValue::Boolean(false));
        let values = [
            ("zz-text", AMQPValue::LongString(LongString::from("héllo"))),
            ("bool", AMQPValue::Boolean(true)),
            ("i8", AMQPValue::ShortShortInt(-8)),
            ("u8", AMQPValue::ShortShortUInt(200)),
            ("i16", AMQPValue::ShortInt(-1600)),
            ("u16", AMQPValue::ShortUInt(60000)),
            ("i32", AMQPValue::LongInt(-320_000)),
            ("u32", AMQPValue::LongUInt(4_000_000_000)),
            ("i64", AMQPValue::LongLongInt(-6_400_000_000)),
            ("f32", AMQPValue::Float(1.5)),
            ("f64", AMQPValue::Double(-2.25)),
            (
                "decimal",
                AMQPValue::DecimalValue(DecimalValue {
                    scale: 2,
                    value: 1234,
                }),
            ),
            ("timestamp", AMQPValue::Timestamp(1_700_000_000)),
            ("void", AMQPValue::Void),
            ("table", AMQPValue::FieldTable(nested)),
            (
                "array",
                AMQPValue::FieldArray(FieldArray::from(vec![
                    AMQPValue::LongInt(1),
                    AMQPValue::LongString(LongString::from("two")),
                ])),
            ),
            (
                "one-element",
                AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongInt(7)])),
            ),
            ("empty-array", AMQPValue::FieldArray(FieldArray::default())),
            ("bytes", AMQPValue::ByteArray(vec![0xff, 0x00, 0x80].into())),
        ];
        let mut table = FieldTable::default();
        for (name, value) in values {
            table.insert(ShortString::from(name), value);
        }
        let props = BasicProperties::default()
            .with_content_type("application/x-custom".into())
            .with_content_encoding("identity".into())
            .with_headers(table)
            .with_delivery_mode(2)
            .with_priority(5)
            .with_correlation_id("corr-42".into())
            .with_reply_to("replies".into())
            .with_message_id(
                format!(
                    "native-{}",
                    hex(&payload[payload.len().saturating_sub(6)..])
                )
                .into(),
            )
            .with_timestamp(1_700_000_123)
            .with_type("order.created".into())
            .with_user_id("guest".into())
            .with_app_id("raw-producer".into());
        let (conn, ch) = self.channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(wrap(Kind::Connection, "confirm mode"))?;
        ch.basic_publish(
            topic.into(),
            "".into(),
            BasicPublishOptions {
                mandatory: true,
                immediate: false,
            },
            payload,
            props.clone(),
        )
        .await
        .map_err(wrap(Kind::Connection, "raw publish"))?
        .await
        .map_err(wrap(Kind::Rejected, "raw publish confirm"))?;
        let _ = conn.close(200, "done".into()).await;
        Ok(describe(payload, &props))
    }

    /// Takes every message of the DLQ on a channel without acknowledging, and closes the channel (the
    /// broker puts them all back).
    async fn dead_letters(&self, topic: &str) -> Result<Vec<NativeMessage>, Error> {
        let dlq = format!("{topic}{}", self.dlq_suffix);
        let (conn, ch) = self.channel().await?;
        let mut out = Vec::new();
        while let Some(message) = ch
            .basic_get(dlq.as_str().into(), BasicGetOptions { no_ack: false })
            .await
            .map_err(wrap(Kind::Connection, "read the DLQ"))?
        {
            out.push(describe(
                &message.delivery.data,
                &message.delivery.properties,
            ));
            if message.message_count == 0 {
                break;
            }
        }
        let _ = conn.close(200, "done".into()).await;
        Ok(out)
    }
}

async fn connect(url: String) -> Result<Fixture, String> {
    let transport = RabbitTransport::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let broker = Broker::new(transport.clone());
    let raw = RawAmqp {
        url: url.clone(),
        dlq_suffix: transport.config().dlq_suffix.clone(),
    };
    let fixture = Fixture::new("rabbitmq", broker, Duration::from_millis(250))
        .with_faults(DlqQueue {
            transport: transport.clone(),
            raw: raw_brokers::RawRabbit::new(&url),
        })
        .with_raw_client(raw);
    Ok(match test_support::broker::url("RETRY_TEST_AMQP_NODE") {
        Some(node) => fixture.with_inspect(QueueDepth {
            node,
            url: url.clone(),
            transport: transport.clone(),
        }),
        None => fixture,
    })
}

fn main() {
    event_retry_testkit::run(Adapter {
        name: "rabbitmq",
        url_env: Some("RETRY_TEST_AMQP"),
        container: event_retry_testkit::hooks::RABBITMQ,
        connect: |url| Box::pin(connect(url)),
    })
}
