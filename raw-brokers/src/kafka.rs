//! Kafka read with rdkafka itself: the DLQ topic from its first offset to its end, and the DLQ made
//! unwritable by lowering its `max.message.bytes` below any record (its records stay).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

use super::{BoxError, RawBroker};

/// Kafka's own client on the broker at `bootstrap`.
pub(crate) struct RawKafka {
    bootstrap: String,
}

impl RawKafka {
    /// A client of the brokers in a `kafka://host:port[,host:port]` URL.
    pub(crate) fn new(url: &str) -> Self {
        let hosts = url.trim_start_matches("kafka://");
        let hosts = hosts.split(['?', '/']).next().unwrap_or(hosts);
        Self {
            bootstrap: hosts.to_string(),
        }
    }

    fn read_all(&self, topic: &str) -> Result<Vec<String>, BoxError> {
        let timeout = Duration::from_secs(10);
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set(
                "group.id",
                format!("faults-reader-{}", crate::record::now_ms()),
            )
            .set("enable.auto.commit", "false")
            .create()?;
        let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
        let partitions = metadata
            .topics()
            .first()
            .map_or(0, |t| t.partitions().len());
        let mut assignment = TopicPartitionList::new();
        let mut ends = Vec::new();
        for p in 0..i32::try_from(partitions)? {
            let (low, high) = consumer.fetch_watermarks(topic, p, timeout)?;
            if high > low {
                assignment.add_partition_offset(topic, p, Offset::Offset(low))?;
                ends.push((p, high));
            }
        }
        let mut payloads = Vec::new();
        if ends.is_empty() {
            return Ok(payloads);
        }
        consumer.assign(&assignment)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ends.is_empty() {
            if Instant::now() > deadline {
                return Err(format!("reading {topic} took over 60 s").into());
            }
            // A node that just died shows as a transport error; the client fails over by itself.
            let Some(Ok(message)) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            payloads
                .push(String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned());
            let (partition, offset) = (message.partition(), message.offset());
            ends.retain(|&(p, end)| p != partition || offset + 1 < end);
        }
        Ok(payloads)
    }

    /// The node that leads `partition` of `topic`.
    pub(crate) fn leader(&self, topic: &str, partition: i32) -> Result<i32, BoxError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()?;
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        metadata
            .topics()
            .first()
            .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
            .map(|p| p.leader())
            .ok_or_else(|| format!("no leader for {topic}/{partition}").into())
    }

    async fn set_max_message_bytes(&self, topic: &str, limit: &str) -> Result<(), BoxError> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()?;
        let change =
            AlterConfig::new(ResourceSpecifier::Topic(topic)).set("max.message.bytes", limit);
        for result in admin.alter_configs([&change], &AdminOptions::new()).await? {
            result.map_err(|(_, code)| format!("set max.message.bytes of {topic}: {code}"))?;
        }
        // The broker applies a topic's configuration asynchronously.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(())
    }
}

#[async_trait]
impl RawBroker for RawKafka {
    async fn dlq_payloads(&self, dlq: &str) -> Result<Vec<String>, BoxError> {
        let this = Self {
            bootstrap: self.bootstrap.clone(),
        };
        let dlq = dlq.to_string();
        tokio::task::spawn_blocking(move || this.read_all(&dlq)).await?
    }

    async fn refuse_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError> {
        // 1 byte is less than any record batch; the records already there stay.
        self.set_max_message_bytes(dlq, "1").await?;
        Ok(Vec::new())
    }

    async fn accept_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError> {
        // The broker's default.
        self.set_max_message_bytes(dlq, "1048588").await?;
        Ok(Vec::new())
    }
}
