//! The transport: one broker, as the SDK's consumers, producer and operator tools use it.

use async_trait::async_trait;

use super::admin::Admin;
use super::capabilities::Capabilities;
use super::dlq::DlqSession;
use super::spec::SubscriptionSpec;
use super::subscription::Subscription;
use crate::error::Error;
use crate::event::Event;

/// Where the broker put a published message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// The event id the message carries (the producer's, or one the SDK gave it).
    pub event_id: String,
    /// The broker's id for the message, where it gives one (SQS and Pulsar message ids).
    pub message_id: Option<String>,
    /// The partition, where the broker has partitions (Kafka).
    pub partition: Option<i32>,
    /// The offset in that partition, where the broker has offsets (Kafka).
    pub offset: Option<i64>,
}

impl Published {
    /// A message the broker accepted without telling where (RabbitMQ).
    pub fn accepted() -> Self {
        Self::default()
    }

    /// A message the broker knows by `id`.
    pub fn with_message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }

    /// A message at `offset` of `partition`.
    pub fn at(mut self, partition: i32, offset: i64) -> Self {
        self.partition = Some(partition);
        self.offset = Some(offset);
        self
    }

    /// Records the event id the message carries.
    pub fn with_event_id(mut self, id: impl Into<String>) -> Self {
        self.event_id = id.into();
        self
    }
}

/// A broker, as the runtime, the producer and the operator tools see it.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// A short name for reports ("memory", "kafka", ...).
    fn name(&self) -> &'static str;

    /// What this transport can do.
    fn capabilities(&self) -> Capabilities;

    /// What the transport declares on the broker for a consumer — queue types, the delay mechanism,
    /// delivery limits — in one line for the consumer's start-up report, so an operator reads what was
    /// chosen instead of inferring it. `None` (the default) where there is nothing to say.
    fn topology(&self) -> Option<String> {
        None
    }

    /// What this transport can do with `topic`, where that depends on the topic (an SQS FIFO queue keeps
    /// per-key order, a standard queue does not). By default, [`Transport::capabilities`].
    fn capabilities_for(&self, topic: &str) -> Capabilities {
        let _ = topic;
        self.capabilities()
    }

    /// Sends `event` (payload, key, headers and metadata encoded for the broker) to `topic`, and returns
    /// once the broker confirmed it.
    async fn publish(&self, topic: &str, event: &Event) -> Result<Published, Error>;

    /// Subscribes a consumer.
    async fn subscribe(&self, spec: &SubscriptionSpec) -> Result<Box<dyn Subscription>, Error>;

    /// Opens the DLQ of `source_topic` for one operation; `None` when it does not exist (nothing was
    /// dead-lettered from that topic).
    async fn open_dead_letters(
        &self,
        source_topic: &str,
    ) -> Result<Option<Box<dyn DlqSession>>, Error>;

    /// Writes `event` — a dead letter with its history, the dead-letter part of its metadata set — into
    /// the DLQ of `source_topic` as though consumer group `group` had dead-lettered it (declaring the
    /// DLQ if it is missing), and returns once the broker confirmed it. A migration between brokers uses
    /// it; the runtime dead-letters through a delivery's [`Receipt`](super::Receipt) instead. By default
    /// a transport cannot: [`Kind::Unsupported`](crate::error::Kind::Unsupported).
    async fn write_dead_letter(
        &self,
        source_topic: &str,
        group: Option<&str>,
        event: &Event,
    ) -> Result<(), Error> {
        let _ = (group, event);
        Err(Error::new(
            crate::error::Kind::Unsupported,
            format!("the {} transport cannot write dead letters", self.name()),
        )
        .with_operation(format!("dead-letter to the DLQ of {source_topic}")))
    }

    /// Creating, deleting and naming the broker objects of a topic.
    fn admin(&self) -> &dyn Admin;
}
