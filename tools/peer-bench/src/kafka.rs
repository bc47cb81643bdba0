//! The bench's own Kafka work, with the raw client (never through either consumer under test): the
//! round's topic created with its partitions, filled, and every topic of the round deleted afterwards
//! (the SDK's ladder and Spring's retry and DLT topics share the round's unique prefix).

use std::time::Duration;

use futures::StreamExt;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{FutureProducer, FutureRecord};

use test_support::bench;

use crate::Error;

/// `host:port` from a `kafka://host:port` URL (or a bare bootstrap list).
pub fn bootstrap(url: &str) -> String {
    url.strip_prefix("kafka://")
        .unwrap_or(url)
        .trim_end_matches('/')
        .to_string()
}

fn admin(url: &str) -> Result<AdminClient<DefaultClientContext>, Error> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap(url))
        .create()?)
}

/// Creates `topic` with `partitions` partitions (replication 1: the bench's broker is a single node).
pub async fn create_topic(url: &str, topic: &str, partitions: i32) -> Result<(), Error> {
    let results = admin(url)?
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await?;
    for result in results {
        if let Err((name, code)) = result {
            return Err(format!("creating topic {name}: {code}").into());
        }
    }
    Ok(())
}

/// Publishes `events` records of `payload_bytes` (keys `e0`, `e1`, …, spread over the partitions by key)
/// and waits until the broker has acknowledged every one.
pub async fn fill(url: &str, topic: &str, events: u64, payload_bytes: usize) -> Result<(), Error> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap(url))
        .create()?;
    let producer = &producer;
    let mut sends = futures::stream::iter(0..events)
        .map(|i| async move {
            let key = format!("e{i}");
            let body = bench::payload(i as usize, payload_bytes);
            producer
                .send(
                    FutureRecord::to(topic).key(&key).payload(&body),
                    Duration::from_secs(30),
                )
                .await
                .map(drop)
                .map_err(|(e, _)| e)
        })
        .buffer_unordered(1_000);
    while let Some(sent) = sends.next().await {
        sent?;
    }
    Ok(())
}

/// Deletes every topic whose name starts with `prefix`; topics already gone are fine.
pub async fn delete_topics(url: &str, prefix: &str) -> Result<(), Error> {
    let admin = admin(url)?;
    let metadata = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(30))?;
    let names: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|n| n.starts_with(prefix))
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    for result in admin.delete_topics(&refs, &AdminOptions::new()).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((name, code)) => return Err(format!("deleting topic {name}: {code}").into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_scheme() {
        assert_eq!(bootstrap("kafka://127.0.0.1:19092/"), "127.0.0.1:19092");
        assert_eq!(bootstrap("127.0.0.1:19092"), "127.0.0.1:19092");
    }
}
