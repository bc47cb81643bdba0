//! Reading what a topic holds with each broker's own client (rdkafka, lapin), never through the SDK:
//! the suite's counts of what was published come from here.

use std::time::{Duration, Instant};

use lapin::options::BasicGetOptions;
use lapin::types::AMQPValue;
use lapin::{Connection, ConnectionProperties};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// One message as the broker holds it, by the event id it carries.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) event_id: String,
}

const EVENT_ID: &str = "x-retry-event-id";

/// Every message on Kafka topic `topic`, partition by partition from the low to the high watermark.
pub(crate) fn kafka(bootstrap: &str, topic: &str) -> Result<Vec<Seen>, String> {
    let timeout = Duration::from_secs(10);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("outbox-raw-{}", uuid::Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| format!("raw Kafka consumer: {e}"))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| format!("metadata of {topic}: {e}"))?;
    let partitions = metadata
        .topics()
        .first()
        .map_or(0, |t| t.partitions().len());
    let mut tpl = TopicPartitionList::new();
    let mut ends = Vec::new();
    for p in 0..i32::try_from(partitions).unwrap_or(0) {
        let (low, high) = raw_brokers::kafka_watermarks(&consumer, topic, p, timeout)
            .map_err(|e| format!("watermarks of {topic}/{p}: {e}"))?;
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Offset(low))
                .map_err(|e| e.to_string())?;
            ends.push((p, low - 1, high));
        }
    }
    let mut out = Vec::new();
    if ends.is_empty() {
        return Ok(out);
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while ends.iter().any(|(_, seen, end)| *seen < end - 1) {
        if Instant::now() > deadline {
            return Err(format!("reading {topic} took over 60 s"));
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = match message {
            Ok(message) => message,
            Err(e) if raw_brokers::kafka_leader_moving(&e) => continue,
            Err(e) => return Err(format!("read {topic}: {e}")),
        };
        if let Some(n) = ends.iter_mut().find(|(p, _, _)| *p == message.partition()) {
            n.1 = n.1.max(message.offset());
        }
        let event_id = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == EVENT_ID))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        out.push(Seen { event_id });
    }
    Ok(out)
}

/// Every message in RabbitMQ queue `queue`, taken off it in order (the queue is left empty).
pub(crate) async fn rabbitmq(url: &str, queue: &str) -> Result<Vec<Seen>, String> {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| format!("raw AMQP connection: {e}"))?;
    let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .map_err(|e| format!("read {queue}: {e}"))?
    {
        let props = &message.delivery.properties;
        let from_header = props.headers().as_ref().and_then(|h| {
            h.inner().iter().find_map(|(k, v)| {
                (k.as_str() == EVENT_ID).then(|| match v {
                    AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                    other => format!("{other:?}"),
                })
            })
        });
        let event_id = from_header
            .or_else(|| props.message_id().as_ref().map(|s| s.as_str().to_string()))
            .unwrap_or_default();
        out.push(Seen { event_id });
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(out)
}
