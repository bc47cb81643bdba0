//! The RabbitMQ adapter of event-retry.
//!
//! A topic is a fanout exchange of that name; each consumer group has a durable work queue bound to it
//! (`<topic>:<group>`), whose consumers share its messages. A retry is a copy sent through a fixed ladder
//! of delay levels — queues where a copy waits a fixed time, moved on by the consumer processes with
//! publisher confirms (the `ladder::mover` module in the source), and finally into the group's retry queue
//! (`<topic>:<group>:retries`), which its consumers read before the work queue (see the `topics`
//! module's docs) — so any delay up to the ladder's maximum is exact to its granularity, a due retry
//! does not wait behind a backlog, no broker crash loses a copy between levels, and the original is
//! acknowledged only after the broker confirmed the copy. Dead letters go to `<topic>.dlq` with their metadata as headers. A
//! blocking error cancels the consumers until the dependency heals. An ordered consumer (per-key order)
//! consumes exclusively; another one stands by until it leaves.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use event_retry_rabbitmq::RabbitTransport;
//! let transport = RabbitTransport::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
//! # Ok(()) }
//! ```

mod admin;
mod codec;
pub mod config;
mod declare;
mod dlq;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod ladder;
mod link;
mod security;
mod settle;
mod subscription;
mod topics;

use std::sync::Arc;

use async_trait::async_trait;
use event_retry_core::adapter::{
    Admin, BeyondMax, Capabilities, ConnectFuture, DelayCapability, DlqSession, Published, Scheme,
    Subscription, SubscriptionSpec, Transport,
};
use event_retry_core::error::Error;
use event_retry_core::event::Event;
use event_retry_core::options::Options;
use lapin::options::QueueDeleteOptions;

pub use crate::config::{QueueType, RabbitConfig, RabbitSecurity};
use crate::error::amqp_error;
use crate::link::Link;
use crate::subscription::RabbitSubscription;

/// `amqp://` and `amqps://` in `event_retry::connect`; the URL's query parameters are
/// [`RabbitConfig::from_options`]'s keys, and the AMQP URI's own (`heartbeat`, …) pass through.
pub const SCHEME: Scheme = Scheme::new(&["amqp", "amqps"], "RabbitMQ", connect_url);

fn connect_url(url: String, options: Options) -> ConnectFuture {
    Box::pin(async move {
        let (config, uri) = RabbitConfig::from_options(&options)?;
        let url = if uri.is_empty() {
            url
        } else {
            let query: Vec<String> = uri.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{url}?{}", query.join("&"))
        };
        let transport = RabbitTransport::connect_with(&url, config).await?;
        Ok(Arc::new(transport) as Arc<dyn Transport>)
    })
}

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
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, RabbitConfig::default()).await
    }

    /// Connects with explicit settings; fails at once when the settings are invalid or the broker cannot
    /// be reached.
    pub async fn connect_with(url: &str, config: RabbitConfig) -> Result<Self, Error> {
        let link = Arc::new(Link::new(url.to_string(), config)?);
        link.connection().await?;
        Ok(Self { link })
    }

    /// The settings in use.
    pub fn config(&self) -> &RabbitConfig {
        &self.link.config
    }

    pub(crate) async fn delete_queue(&self, queue: &str) -> Result<(), Error> {
        let ch = self.link.channel().await?;
        let result = ch
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .map(drop)
            .map_err(|e| amqp_error(e, format!("delete queue {queue}")));
        let _ = ch.close(200, "deleted".into()).await;
        result
    }

    /// Deletes an exchange (best left to [`Admin::delete`]).
    pub(crate) async fn delete_exchange(&self, exchange: &str) -> Result<(), Error> {
        let ch = self.link.channel().await?;
        let result = ch
            .exchange_delete(
                exchange.into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await
            .map(drop)
            .map_err(|e| amqp_error(e, format!("delete exchange {exchange}")));
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
        capabilities_of(&self.link.config)
    }

    fn topology(&self) -> Option<String> {
        Some(self.link.config.topology())
    }

    async fn publish(&self, topic: &str, event: &Event) -> Result<Published, Error> {
        let id = self
            .link
            .publish_event(topic, None, event, None, &format!("publish to {topic}"))
            .await?;
        Ok(Published::accepted().with_message_id(id))
    }

    /// Declares the group's queue before it returns, so the group receives every event published from
    /// then on, and starts moving the delay ladder's due copies (see the adapter's docs) if this
    /// transport does not yet.
    async fn subscribe(&self, spec: &SubscriptionSpec) -> Result<Box<dyn Subscription>, Error> {
        self.link.ensure_group(&spec.topic, &spec.group).await?;
        self.link.start_movers();
        Ok(Box::new(RabbitSubscription::new(
            self.link.clone(),
            spec.clone(),
        )))
    }

    async fn open_dead_letters(
        &self,
        source_topic: &str,
    ) -> Result<Option<Box<dyn DlqSession>>, Error> {
        crate::topics::check_topic(&self.link.names, source_topic)?;
        dlq::open(self.link.clone(), source_topic).await
    }

    /// Publishes the entry to `<topic>.dlq` with a new entry id and the group header, after declaring
    /// the topic's topology (a replay declares the group's queue when it needs it).
    async fn write_dead_letter(
        &self,
        source_topic: &str,
        group: Option<&str>,
        event: &Event,
    ) -> Result<(), Error> {
        if let Some(group) = group {
            crate::topics::check_group(&self.link.names, source_topic, group)?;
        }
        self.link.ensure_topic(source_topic).await?;
        self.link
            .dead_letter(source_topic, group, event, None)
            .await
    }

    fn admin(&self) -> &dyn Admin {
        self
    }
}

/// The README's Rust examples, compiled (and run, where not `no_run`) by `cargo test --doc`, so that the
/// code people copy from it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// What a transport with `config` can do (the broker does not change it).
fn capabilities_of(config: &RabbitConfig) -> Capabilities {
    Capabilities::new(
        DelayCapability::new(config.granularity)
            .with_max_native(config.max_delay(), BeyondMax::Refuse),
    )
    .per_key_order(true)
    .blocking_pause(true)
    .replay(true)
    .shared_subscription(true)
    .crash_redelivery(true)
    .fan_out(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_carries_the_default_capabilities() {
        let listed =
            capabilities_of(&RabbitConfig::default()).check_listed_in(include_str!("../README.md"));
        assert_eq!(listed, Ok(()));
    }
}
