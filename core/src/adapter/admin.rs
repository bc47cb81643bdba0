//! Topology administration, the same on every broker: declare, delete, and the names of what a topic
//! needs.

use async_trait::async_trait;

use crate::error::Error;

/// The broker objects behind one topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TopicNames {
    /// The source topic or queue.
    pub topic: String,
    /// Where its dead letters go.
    pub dlq: String,
    /// The retry route of the group, where the broker has one per group (Kafka, Pulsar).
    pub retry: Option<String>,
    /// The delay levels retries pass through (Kafka topics, RabbitMQ queues), if any.
    pub delay: Vec<String>,
}

impl TopicNames {
    /// The names of `topic` with its DLQ `dlq`.
    pub fn new(topic: impl Into<String>, dlq: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            dlq: dlq.into(),
            retry: None,
            delay: Vec::new(),
        }
    }

    /// Adds the group's retry route.
    pub fn with_retry(mut self, retry: impl Into<String>) -> Self {
        self.retry = Some(retry.into());
        self
    }

    /// Adds the delay levels.
    pub fn with_delay(mut self, delay: Vec<String>) -> Self {
        self.delay = delay;
        self
    }
}

/// Creating and deleting a topic with everything it needs, on any broker.
#[async_trait]
pub trait Admin: Send + Sync {
    /// Creates `topic` with its DLQ and delay route (and the retry route of `group`, where the broker has
    /// one per group) if they are missing; with creation turned off, checks that they exist.
    async fn declare(&self, topic: &str, group: Option<&str>) -> Result<(), Error>;

    /// Deletes `topic` and what belongs to it alone (its DLQ, its delay levels), with every message in
    /// them; objects shared with other topics stay.
    async fn delete(&self, topic: &str) -> Result<(), Error>;

    /// The names of the broker objects behind `topic` (and `group`'s retry route).
    async fn names(&self, topic: &str, group: Option<&str>) -> Result<TopicNames, Error>;
}
