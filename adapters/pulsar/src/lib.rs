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

mod admin;
mod codec;
pub mod config;
mod consumer_requests;
mod delay_settings;
mod dlq;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod link;
mod security;
mod subscription;

use std::sync::Arc;

use async_trait::async_trait;
use event_retry_core::adapter::{
    Admin, Capabilities, ConnectFuture, DlqSession, Published, Scheme, Subscription,
    SubscriptionSpec, Transport,
};
use event_retry_core::error::Error;
use event_retry_core::event::Event;
use event_retry_core::options::Options;

pub use crate::config::{PulsarConfig, PulsarSecurity};
use crate::dlq::DlqConsumers;
use crate::link::Link;

/// `pulsar://` and `pulsar+ssl://` in `event_retry::connect`; the URL's query parameters are
/// [`PulsarConfig::from_options`]'s keys.
pub const SCHEME: Scheme = Scheme::new(&["pulsar", "pulsar+ssl"], "Apache Pulsar", connect_url);

fn connect_url(url: String, options: Options) -> ConnectFuture {
    Box::pin(async move {
        let config = PulsarConfig::from_options(&options)?;
        let transport = PulsarTransport::connect_with(&url, config).await?;
        Ok(Arc::new(transport) as Arc<dyn Transport>)
    })
}

/// A Pulsar cluster as an event-retry transport. Cheap to clone; clones share one client.
#[derive(Clone)]
pub struct PulsarTransport {
    link: Arc<Link>,
    dlq: Arc<DlqConsumers>,
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
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, PulsarConfig::default()).await
    }

    /// Connects with explicit settings.
    pub async fn connect_with(url: &str, mut config: PulsarConfig) -> Result<Self, Error> {
        config.validate()?;
        delay_settings::apply(&mut config, url).await?;
        let client = security::connect(url, &config.security).await?;
        let link = Arc::new(Link::new(client, url, config));
        Ok(Self {
            dlq: Arc::default(),
            link,
        })
    }

    /// The settings in use.
    pub fn config(&self) -> &PulsarConfig {
        &self.link.config
    }
}

#[async_trait]
impl Transport for PulsarTransport {
    fn name(&self) -> &'static str {
        "pulsar"
    }

    fn capabilities(&self) -> Capabilities {
        capabilities_of(&self.link.config)
    }

    async fn publish(&self, topic: &str, event: &Event) -> Result<Published, Error> {
        self.link.ensure_topic(topic).await?;
        let message = codec::encode(event, None, None, &[])?;
        self.link
            .send(
                &self.link.config.full_name(topic),
                message,
                &format!("publish to {topic}"),
            )
            .await
            .map(|id| Published::accepted().with_message_id(id))
    }

    async fn subscribe(&self, spec: &SubscriptionSpec) -> Result<Box<dyn Subscription>, Error> {
        self.link.ensure_topic(&spec.topic).await?;
        Ok(Box::new(
            subscription::subscribe(self.link.clone(), spec.clone()).await?,
        ))
    }

    async fn open_dead_letters(
        &self,
        source_topic: &str,
    ) -> Result<Option<Box<dyn DlqSession>>, Error> {
        dlq::open(self.link.clone(), &self.dlq, source_topic).await
    }

    /// Sends the entry to `<topic>-DLQ` with the group property, after making sure the DLQ keeps it
    /// (its subscription exists) and that the group's retry topic a replay goes to keeps what is sent
    /// there.
    async fn write_dead_letter(
        &self,
        source_topic: &str,
        group: Option<&str>,
        event: &Event,
    ) -> Result<(), Error> {
        self.link.ensure_topic(source_topic).await?;
        if let Some(group) = group {
            self.link.ensure_retry_topic(source_topic, group).await?;
        }
        let dlq = self.link.config.dlq_topic(source_topic);
        let extra: Vec<(&str, &str)> = group
            .map(|g| (event_retry_core::metadata::names::GROUP, g))
            .into_iter()
            .collect();
        let message = codec::encode(event, None, None, &extra)?;
        self.link
            .send(&dlq, message, &format!("dead-letter to {dlq}"))
            .await
            .map(drop)
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
fn capabilities_of(config: &PulsarConfig) -> Capabilities {
    Capabilities::new(config.delay_capability())
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
            capabilities_of(&PulsarConfig::default()).check_listed_in(include_str!("../README.md"));
        assert_eq!(listed, Ok(()));
    }
}
