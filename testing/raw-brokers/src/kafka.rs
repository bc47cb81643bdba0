//! Kafka read with rdkafka itself: a topic from its first offset to its end, a consumer group's committed
//! offsets, and a DLQ made unwritable by lowering its `max.message.bytes` below any dead letter (its
//! records stay).

use std::time::{Duration, Instant};

/// The DLQ's `max.message.bytes` while it refuses dead letters.
const REFUSING_LIMIT: &str = "200";

use async_trait::async_trait;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::{BoxError, RawBroker, RawEntry, reader_name};

/// Kafka's own client on the broker at `bootstrap`.
pub struct RawKafka {
    bootstrap: String,
}

impl RawKafka {
    /// A client of the brokers in a `kafka://host:port[,host:port]` URL.
    pub fn new(url: &str) -> Self {
        let hosts = url.trim_start_matches("kafka://");
        let hosts = hosts.split(['?', '/']).next().unwrap_or(hosts);
        Self {
            bootstrap: hosts.to_string(),
        }
    }

    /// A consumer in `group` that commits nothing by itself, and the partition count of `topic`.
    fn consumer(&self, group: &str, topic: &str) -> Result<(BaseConsumer, i32), BoxError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", group)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .create()?;
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let partitions = metadata
            .topics()
            .first()
            .map_or(0, |t| t.partitions().len());
        Ok((consumer, i32::try_from(partitions)?))
    }

    fn read_all(&self, topic: &str) -> Result<Vec<RawEntry>, BoxError> {
        let timeout = Duration::from_secs(10);
        let (consumer, partitions) = self.consumer(&reader_name(), topic)?;
        let mut assignment = TopicPartitionList::new();
        let mut ends = Vec::new();
        for p in 0..partitions {
            let (low, high) = watermarks(&consumer, topic, p, timeout)?;
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
            // A log written in transactions ends with a commit marker, which no reader gets: a
            // partition is read once the consumer's position passed its end.
            if let Ok(positions) = consumer.position() {
                ends.retain(|&(p, end)| {
                    positions
                        .find_partition(topic, p)
                        .is_none_or(|e| !matches!(e.offset(), Offset::Offset(o) if o >= end))
                });
            }
            // A node that just died shows as a transport error; the client fails over by itself.
            let Some(Ok(message)) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let headers = message
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                        .collect()
                })
                .unwrap_or_default();
            payloads.push(RawEntry {
                payload: message.payload().unwrap_or_default().to_vec(),
                key: message.key().map(<[u8]>::to_vec),
                headers,
            });
            let (partition, offset) = (message.partition(), message.offset());
            ends.retain(|&(p, end)| p != partition || offset + 1 < end);
        }
        Ok(payloads)
    }

    /// How many records of `topic` lie at or beyond consumer group `group`'s committed offsets (all of
    /// a partition where it committed none).
    pub fn uncommitted(&self, group: &str, topic: &str) -> Result<i64, BoxError> {
        let timeout = Duration::from_secs(10);
        let (consumer, partitions) = self.consumer(group, topic)?;
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition(topic, p);
        }
        let committed = consumer.committed_offsets(list, timeout)?;
        let mut left = 0;
        for element in committed.elements() {
            let (low, high) = watermarks(&consumer, topic, element.partition(), timeout)?;
            let from = match element.offset() {
                Offset::Offset(o) => o.max(low),
                _ => low,
            };
            left += (high - from).max(0);
        }
        Ok(left)
    }

    /// The node that leads `partition` of `topic`.
    pub fn leader(&self, topic: &str, partition: i32) -> Result<i32, BoxError> {
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
    async fn messages(&self, topic: &str) -> Result<Vec<RawEntry>, BoxError> {
        let this = Self {
            bootstrap: self.bootstrap.clone(),
        };
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || this.read_all(&topic)).await?
    }

    /// The records at or beyond the group's committed offsets.
    async fn waiting(&self, topic: &str, group: &str) -> Result<u64, BoxError> {
        let this = Self {
            bootstrap: self.bootstrap.clone(),
        };
        let (topic, group) = (topic.to_string(), group.to_string());
        let left = tokio::task::spawn_blocking(move || this.uncommitted(&group, &topic)).await??;
        Ok(u64::try_from(left)?)
    }

    async fn refuse_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError> {
        // Less than any batch holding a dead letter (its headers alone are longer), more than a
        // transaction's commit or abort marker (about 80 bytes): below that, the coordinator could never
        // end a transaction that wrote to the DLQ. The records already there stay.
        self.set_max_message_bytes(dlq, REFUSING_LIMIT).await?;
        Ok(Vec::new())
    }

    async fn accept_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError> {
        // The broker's default.
        self.set_max_message_bytes(dlq, "1048588").await?;
        Ok(Vec::new())
    }
}

/// The low and high watermarks of `topic`/`partition` (a partition the topic's metadata listed). Right
/// after a broker comes back its partitions are briefly without a leader (a single KRaft node fences
/// itself for ~100 ms after a stall or a restart) and the broker answers "not leader", or librdkafka
/// answers "unknown partition" from its own cache (below): such answers are asked again for up to 30 s,
/// as any client would, each time after the topic's metadata is read again (librdkafka does not refresh
/// a cached leaderless partition for the watermark query itself).
pub fn watermarks(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<(i64, i64), KafkaError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match consumer.fetch_watermarks(topic, partition, timeout) {
            Err(e) if leader_moving(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
                // Its own answer does not matter: the next query reads the cache it refreshed.
                let _ = consumer.fetch_metadata(Some(topic), timeout);
            }
            answer => return answer,
        }
    }
}

/// Whether Kafka's answer says a partition's leadership is settling, so asking again will do (a
/// watermark query's, or a poll's of an assigned partition).
///
/// That includes librdkafka's local "unknown partition" (`-190`): its watermark query looks the
/// partition's leader up in the client's metadata cache, and a partition cached without a leader (-1,
/// or a node the client does not know yet) is answered at once with that error, not with "leader not
/// available" (`rd_kafka_topic_partition_list_get_leaders` and `…_query_leaders` in librdkafka 2.12's
/// `rdkafka_partition.c`). The outbox suite's broker-down cell met it once in 20 runs, reading a
/// partition the metadata had just listed, after every row was published once the stalled broker
/// resumed. The broker's own "unknown topic or partition" (`3`) is not retried: that topic is gone.
pub fn leader_moving(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        e.rdkafka_error_code(),
        Some(
            Code::NotLeaderForPartition
                | Code::LeaderNotAvailable
                | Code::FencedLeaderEpoch
                | Code::UnknownLeaderEpoch
                | Code::BrokerTransportFailure
                | Code::UnknownPartition
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaErrorCode as Code;

    #[test]
    fn a_partition_between_leaders_is_asked_again_and_a_missing_topic_is_not() {
        assert!(leader_moving(&KafkaError::MetadataFetch(
            Code::NotLeaderForPartition
        )));
        assert!(leader_moving(&KafkaError::MetadataFetch(
            Code::LeaderNotAvailable
        )));
        assert!(leader_moving(&KafkaError::MetadataFetch(
            Code::UnknownPartition
        )));
        assert!(!leader_moving(&KafkaError::MetadataFetch(
            Code::UnknownTopicOrPartition
        )));
    }
}
