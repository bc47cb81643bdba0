//! The Apache Pulsar adapter of event-retry.
//!
//! A consumer reads its topic and the topic's retry topic on one Shared subscription (Key_Shared when
//! per-key order is asked for; delayed delivery works on both). A retry is a copy sent to the retry topic
//! with `deliver_at`, carrying the SDK's metadata as properties; the original is acknowledged once the
//! broker confirmed the copy. Dead letters go to `<topic>-DLQ` with the key preserved. The `pulsar` crate
//! has no retry-letter topic, no delay on `nack` and no redelivery count: this adapter provides the first
//! two and counts attempts in its own metadata.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use event_retry_pulsar::PulsarTransport;
//! let transport = PulsarTransport::connect("pulsar://127.0.0.1:6650").await?;
//! # Ok(()) }
//! ```

mod codec;
pub mod config;
mod dlq;
mod link;
mod subscription;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use pulsar::{Pulsar, TokioExecutor};
use retry_core::dlq::DeadLetterQueue;
use retry_core::event::Event;
use retry_core::transport::{
    Capabilities, Subscription, SubscriptionSpec, Transport, TransportError,
};
use tokio::sync::Mutex;

pub use crate::config::PulsarConfig;
use crate::dlq::PulsarDlq;
use crate::link::Link;

/// A Pulsar cluster as an event-retry transport. Cheap to clone; clones share one client.
#[derive(Clone)]
pub struct PulsarTransport {
    link: Arc<Link>,
    dlq: Arc<PulsarDlq>,
}

impl std::fmt::Debug for PulsarTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PulsarTransport")
            .field("config", &self.link.config)
            .finish_non_exhaustive()
    }
}

impl PulsarTransport {
    /// Connects to `url` (`pulsar://host:6650`, `pulsar+ssl://...`) with the default settings.
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        Self::connect_with(url, PulsarConfig::default()).await
    }

    /// Connects with explicit settings.
    pub async fn connect_with(url: &str, config: PulsarConfig) -> Result<Self, TransportError> {
        config.validate()?;
        let client: Pulsar<TokioExecutor> = Pulsar::builder(url, TokioExecutor)
            .build()
            .await
            .map_err(|e| TransportError::Connection(format!("connect to {url}: {e}")))?;
        let link = Arc::new(Link::new(client, config));
        Ok(Self {
            dlq: Arc::new(PulsarDlq {
                link: link.clone(),
                consumers: Arc::new(Mutex::new(HashMap::new())),
            }),
            link,
        })
    }

    /// The settings in use.
    pub fn config(&self) -> &PulsarConfig {
        &self.link.config
    }

    /// Creates `topic`'s DLQ subscription now (it is otherwise made on first use), so dead letters are
    /// kept from the start.
    pub async fn declare(&self, topic: &str) -> Result<(), TransportError> {
        self.link.forget(topic);
        self.dlq.forget(topic).await;
        self.link.ensure_topic(topic).await
    }
}

#[async_trait]
impl Transport for PulsarTransport {
    fn name(&self) -> &'static str {
        "pulsar"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            delay: self.link.config.delay_capability(),
            per_key_order: true,
            blocking_pause: true,
            replay: true,
            shared_subscription: true,
            crash_redelivery: true,
        }
    }

    async fn publish(&self, topic: &str, event: &Event) -> Result<(), TransportError> {
        self.link.ensure_topic(topic).await?;
        let message = codec::encode(&event.to_raw(), None)?;
        self.link
            .send(
                &self.link.config.full_name(topic),
                message,
                &format!("publish to {topic}"),
            )
            .await
    }

    async fn subscribe(
        &self,
        spec: &SubscriptionSpec,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        self.link.ensure_topic(&spec.topic).await?;
        Ok(Box::new(
            subscription::subscribe(self.link.clone(), spec.clone()).await?,
        ))
    }

    fn dead_letters(&self) -> Arc<dyn DeadLetterQueue> {
        self.dlq.clone()
    }
}
