//! The RabbitMQ adapter of event-retry.
//!
//! A topic is a durable work queue of that name; every consumer of it shares its messages (the queue is
//! the consumer group). A retry is a copy sent through a fixed ladder of delay levels — queues with a
//! fixed TTL that dead-letter into the next level and finally back to the work queue (see [`topology`]'s
//! docs in the source) — so any delay up to the ladder's maximum is exact to its granularity, and is
//! acknowledged only after the broker confirmed the copy. Dead letters go to `<topic>.dlq` with their
//! metadata as headers. A blocking error cancels the consumer until the dependency heals. An ordered
//! consumer (per-key order) consumes exclusively; another one stands by until it leaves.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use event_retry_rabbitmq::RabbitTransport;
//! let transport = RabbitTransport::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
//! # Ok(()) }
//! ```

mod codec;
pub mod config;
mod dlq;
mod link;
mod subscription;
mod topology;

use std::sync::Arc;

use async_trait::async_trait;
use lapin::options::QueueDeleteOptions;
use retry_core::dlq::DeadLetterQueue;
use retry_core::event::Event;
use retry_core::transport::{
    BeyondMax, Capabilities, DelayCapability, Subscription, SubscriptionSpec, Transport,
    TransportError,
};

pub use crate::config::{QueueType, RabbitConfig};
use crate::dlq::RabbitDlq;
use crate::link::Link;
use crate::subscription::RabbitSubscription;

/// A RabbitMQ broker as an event-retry transport. Cheap to clone; clones share one connection.
#[derive(Clone)]
pub struct RabbitTransport {
    link: Arc<Link>,
}

impl std::fmt::Debug for RabbitTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitTransport")
            .field("config", &self.link.config)
            .finish_non_exhaustive()
    }
}

impl RabbitTransport {
    /// Connects to `url` (`amqp://user:pass@host:port/vhost`, `amqps://...`) with the default settings.
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        Self::connect_with(url, RabbitConfig::default()).await
    }

    /// Connects with explicit settings; fails at once when the settings are invalid or the broker cannot
    /// be reached.
    pub async fn connect_with(url: &str, config: RabbitConfig) -> Result<Self, TransportError> {
        let link = Arc::new(Link::new(url.to_string(), config)?);
        link.connection().await?;
        Ok(Self { link })
    }

    /// The settings in use.
    pub fn config(&self) -> &RabbitConfig {
        &self.link.config
    }

    /// The name of `topic`'s DLQ queue.
    pub fn dlq_name(&self, topic: &str) -> String {
        self.link.names.dlq(topic)
    }

    /// Declares the delay ladder and `topic`'s work queue and DLQ now (they are otherwise declared on first
    /// use); with declaring off, checks that they exist.
    pub async fn declare(&self, topic: &str) -> Result<(), TransportError> {
        self.link.forget(topic);
        self.link.ensure_topic(topic).await
    }

    /// Deletes `topic`'s work queue and DLQ with every message in them (the shared ladder stays).
    pub async fn delete_topic(&self, topic: &str) -> Result<(), TransportError> {
        self.link.forget(topic);
        for queue in [topic.to_string(), self.link.names.dlq(topic)] {
            self.delete_queue(&queue).await?;
        }
        Ok(())
    }

    /// Deletes `topic`'s DLQ queue with its entries; until [`RabbitTransport::declare`] creates it again,
    /// dead-lettering from `topic` fails (and the originals stay unacknowledged).
    pub async fn delete_dlq(&self, topic: &str) -> Result<(), TransportError> {
        self.delete_queue(&self.link.names.dlq(topic)).await
    }

    async fn delete_queue(&self, queue: &str) -> Result<(), TransportError> {
        let ch = self.link.channel().await?;
        let result = ch
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .map(drop)
            .map_err(|e| TransportError::Config(format!("delete queue {queue}: {e}")));
        let _ = ch.close(200, "deleted".into()).await;
        result
    }

    /// Closes the connection.
    pub async fn close(&self) {
        self.link.close().await;
    }
}

#[async_trait]
impl Transport for RabbitTransport {
    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            delay: DelayCapability {
                granularity: self.link.config.granularity,
                max_native: Some(self.link.config.max_delay()),
                beyond_max: BeyondMax::Refuse,
            },
            per_key_order: true,
            blocking_pause: true,
            replay: true,
            shared_subscription: true,
            crash_redelivery: true,
        }
    }

    async fn publish(&self, topic: &str, event: &Event) -> Result<(), TransportError> {
        self.link.ensure_topic(topic).await?;
        let id = event
            .id()
            .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string);
        self.link
            .publish(
                "",
                topic,
                &event.to_raw(),
                &id,
                &format!("publish to {topic}"),
            )
            .await
    }

    async fn subscribe(
        &self,
        spec: &SubscriptionSpec,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        self.link.ensure_topic(&spec.topic).await?;
        Ok(Box::new(RabbitSubscription::new(
            self.link.clone(),
            spec.clone(),
        )))
    }

    fn dead_letters(&self) -> Arc<dyn DeadLetterQueue> {
        Arc::new(RabbitDlq {
            link: self.link.clone(),
        })
    }
}
