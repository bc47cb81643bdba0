//! The Apache Kafka adapter of event-retry.
//!
//! A consumer is a member of its consumer group on the source topic and on its group's retry topic. A
//! retry is a copy produced into a fixed binary ladder of delay topics — level *k* holds a record
//! `granularity × 2^k` — which the topic's ladder consumers move down level by level, pausing a
//! partition until its head is due, and finally into the retry topic; dead letters go to `<topic>.dlq`
//! in the source's partition. Every copy is acknowledged by the broker (idempotent producer, `acks=all`)
//! before the source offset may be committed, and offsets are committed only up to the first record
//! not yet settled. See [`config`] for the topology and the adapter's README for the guarantees.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use event_retry_kafka::KafkaTransport;
//! let transport = KafkaTransport::connect("kafka://127.0.0.1:9092").await?;
//! # Ok(()) }
//! ```

/// A named crash point of the broker tests (`fail::fail_point!`, set by the `FAILPOINTS` variable);
/// nothing at all without the `failpoints` feature, which only the tests turn on.
#[cfg(feature = "failpoints")]
macro_rules! failpoint {
    ($($point:tt)*) => {
        fail::fail_point!($($point)*)
    };
}
#[cfg(not(feature = "failpoints"))]
macro_rules! failpoint {
    ($($point:tt)*) => {};
}

mod admin;
mod codec;
pub mod config;
mod consumer;
mod dlq;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod ladder;
mod link;
mod producer;
pub mod security;
mod stranding;
mod subscription;

use std::sync::Arc;

use async_trait::async_trait;
use event_retry_core::adapter::{
    Admin, Capabilities, ConnectFuture, DlqSession, Published, Scheme, Subscription,
    SubscriptionSpec, Transport,
};
use event_retry_core::error::{Error, Kind, wrap};
use event_retry_core::event::Event;
use event_retry_core::options::Options;

pub use crate::config::KafkaConfig;
use crate::config::check_name;
use crate::link::{Link, REQUEST_TIMEOUT};
pub use crate::stranding::CLIENT_HEALS;

/// `kafka://host:port[,host:port…]` in `event_retry::connect`; the URL's query parameters are
/// [`KafkaConfig::from_options`]'s keys.
pub const SCHEME: Scheme = Scheme::new(&["kafka"], "Apache Kafka", connect_url);

fn connect_url(url: String, options: Options) -> ConnectFuture {
    Box::pin(async move {
        let config = KafkaConfig::from_options(&options)?;
        let transport = KafkaTransport::connect_with(&url, config).await?;
        Ok(Arc::new(transport) as Arc<dyn Transport>)
    })
}

/// A Kafka cluster as an event-retry transport. Cheap to clone; clones share one producer.
#[derive(Clone)]
pub struct KafkaTransport {
    link: Arc<Link>,
}

impl std::fmt::Debug for KafkaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTransport")
            .field("bootstrap", &self.link.bootstrap)
            .field("config", &self.link.config)
            .finish_non_exhaustive()
    }
}

/// The bootstrap servers of a `kafka://host:port[,host:port…]` URL (a bare `host:port` list is taken
/// as it is).
pub fn bootstrap_of(url: &str) -> Result<String, Error> {
    let rest = url.strip_prefix("kafka://").unwrap_or(url);
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains(['/', '@', '?']) {
        return Err(Error::new(
            Kind::Config,
            format!("{url:?} is not a Kafka URL: expected kafka://host:port[,host:port...]"),
        ));
    }
    Ok(rest.to_string())
}

impl KafkaTransport {
    /// Connects to `url` (`kafka://host:port[,host:port…]`) with the default settings.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, KafkaConfig::default()).await
    }

    /// Connects with explicit settings; fails when the cluster does not answer within 15 s, and at
    /// once with [`Kind::Security`] when it refuses the handshake (wrong credentials, an untrusted
    /// certificate, plaintext to a TLS listener or TLS to a plaintext one).
    pub async fn connect_with(url: &str, config: KafkaConfig) -> Result<Self, Error> {
        config.validate()?;
        let bootstrap = bootstrap_of(url)?;
        let probe = link::client_config(&bootstrap, &config);
        let target = bootstrap.clone();
        tokio::task::spawn_blocking(move || {
            security::check_connection(&target, &probe, REQUEST_TIMEOUT)
        })
        .await
        .map_err(wrap(Kind::Other, "connect"))??;
        let link = Arc::new(Link::new(&bootstrap, config)?);
        Ok(Self { link })
    }

    /// The settings in use.
    pub fn config(&self) -> &KafkaConfig {
        &self.link.config
    }
}

#[async_trait]
impl Transport for KafkaTransport {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn capabilities(&self) -> Capabilities {
        capabilities_of(&self.link.config)
    }

    async fn publish(&self, topic: &str, event: &Event) -> Result<Published, Error> {
        check_name("topic", topic)?;
        self.link.ensure_topic(topic).await?;
        let (partition, offset) = self
            .link
            .send(
                topic,
                None,
                &event.to_raw(),
                &codec::Nulls::default(),
                &[],
                &format!("publish to {topic}"),
            )
            .await?;
        Ok(Published::accepted().at(partition, offset))
    }

    async fn subscribe(&self, spec: &SubscriptionSpec) -> Result<Box<dyn Subscription>, Error> {
        check_name("topic", &spec.topic)?;
        check_name("group", &spec.group)?;
        self.link
            .ensure_topics(&spec.topic, Some(&spec.group))
            .await?;
        Ok(Box::new(
            subscription::subscribe(self.link.clone(), spec.clone()).await?,
        ))
    }

    async fn open_dead_letters(
        &self,
        source_topic: &str,
    ) -> Result<Option<Box<dyn DlqSession>>, Error> {
        check_name("topic", source_topic)?;
        dlq::open(self.link.clone(), source_topic).await
    }

    /// Produces the entry to `<topic>.dlq` (in its origin's partition, when the DLQ has it) with the
    /// group header, after declaring the DLQ and the group's retry topic a replay goes to.
    async fn write_dead_letter(
        &self,
        source_topic: &str,
        group: Option<&str>,
        event: &Event,
    ) -> Result<(), Error> {
        check_name("topic", source_topic)?;
        if let Some(group) = group {
            check_name("group", group)?;
        }
        self.link.ensure_topics(source_topic, group).await?;
        let dlq = self.link.config.dlq_topic(source_topic);
        let partition = event.metadata().origin.as_ref().and_then(|o| o.partition);
        let extra: Vec<(&str, &[u8])> = group
            .map(|g| (event_retry_core::metadata::names::GROUP, g.as_bytes()))
            .into_iter()
            .collect();
        self.link
            .send(
                &dlq,
                partition,
                &event.to_raw(),
                &codec::Nulls::default(),
                &extra,
                &format!("dead-letter to {dlq}"),
            )
            .await
            .map(drop)
    }

    fn admin(&self) -> &dyn Admin {
        self
    }
}

/// What a transport with `config` can do (the broker does not change it).
fn capabilities_of(config: &KafkaConfig) -> Capabilities {
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
            capabilities_of(&KafkaConfig::default()).check_listed_in(include_str!("../README.md"));
        assert_eq!(listed, Ok(()));
    }

    #[test]
    fn urls() {
        assert_eq!(
            bootstrap_of("kafka://127.0.0.1:9092").ok().as_deref(),
            Some("127.0.0.1:9092")
        );
        assert_eq!(
            bootstrap_of("kafka://a:1,b:2/").ok().as_deref(),
            Some("a:1,b:2")
        );
        assert!(bootstrap_of("kafka://").is_err());
        assert!(bootstrap_of("kafka://u@h:1").is_err());
    }
}

/// The README's Rust examples, compiled (and run, where not `no_run`) by `cargo test --doc`, so that the
/// code people copy from it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
