//! The Amazon SQS adapter of event-retry.
//!
//! On a standard queue a retry is a copy carrying its metadata, sent with its delay to the queue's retry
//! queue (`<queue>-retry`), which each consumer polls beside the source and hands out first: a due
//! retry does not wait behind the source's backlog. On a FIFO queue (or with `retry_queue` off) a
//! retry is the received message itself, hidden with `ChangeMessageVisibility(delay)`, its
//! `ApproximateReceiveCount` counting the attempts. A delay that would end beyond the 12 h visibility
//! window (or the 15 min a send can delay) is carried in hops, never capped.
//! Dead letters are sent to the queue's DLQ (the redrive policy's target) with their diagnostics as
//! message attributes, then deleted from the source; the redrive policy is the safety net for crashes and
//! is checked at start-up against the retry policy. With the `sns` setting a topic is an SNS topic and
//! each consumer group a queue of its own subscribed to it, so every group gets every event. See the
//! README for the details and limits.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use event_retry_sqs::SqsTransport;
//! // A local endpoint (ElasticMQ) with static credentials; `sqs://` alone is AWS, configured from the
//! // environment, and `SqsTransport::from_client` takes a client built with aws-config.
//! let transport = SqsTransport::connect("http://127.0.0.1:9324").await?;
//! # Ok(()) }
//! ```

mod admin;
mod client;
mod codec;
pub mod config;
mod dlq;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod link;
mod queues;
mod settle;
mod sns;
mod subscription;

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use event_retry_core::adapter::{
    Admin, BeyondMax, Capabilities, ConnectFuture, DelayCapability, DlqSession, Published, Scheme,
    Subscription, SubscriptionSpec, Transport,
};
use event_retry_core::error::{Error, Kind};
use event_retry_core::event::Event;
use event_retry_core::options::Options;

pub use crate::config::{ClientSettings, SqsConfig};
use crate::error::sdk_error;
use crate::link::Link;
use crate::queues::{Queues, check_redrive, check_retention};
use crate::subscription::SqsSubscription;

/// `sqs://…`, an `https://` SQS queue URL, or `http://` to an SQS-compatible endpoint on this machine,
/// in `event_retry::connect`; the URL's query parameters are [`SqsConfig::from_options`]'s keys.
pub const SCHEME: Scheme = Scheme::new(&["sqs", "https", "http"], "Amazon SQS", connect_url);

fn connect_url(url: String, options: Options) -> ConnectFuture {
    Box::pin(async move {
        let (config, client) = SqsConfig::from_options(&options)?;
        let transport = SqsTransport::connect_in(&url, config, &client).await?;
        Ok(Arc::new(transport) as Arc<dyn Transport>)
    })
}

/// An SQS endpoint as an event-retry transport. Cheap to clone.
#[derive(Clone)]
pub struct SqsTransport {
    link: Arc<Link>,
}

impl std::fmt::Debug for SqsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsTransport")
            .field("config", &self.link.queues.config)
            .finish_non_exhaustive()
    }
}

impl SqsTransport {
    /// Connects by URL with the default settings: `sqs://` (AWS; region and credentials from the AWS
    /// chain: environment, profiles, SSO, web identity, container and instance roles),
    /// `sqs://key:secret@host:port` or `http://host:port` (an SQS-compatible endpoint; `?region=` sets
    /// the region), or an `https://` queue URL (its endpoint and region).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, SqsConfig::default()).await
    }

    /// Connects by URL with explicit settings, and checks the endpoint answers.
    pub async fn connect_with(url: &str, config: SqsConfig) -> Result<Self, Error> {
        Self::connect_in(url, config, &ClientSettings::default()).await
    }

    /// Connects with client settings (region, profile) that override the URL's and the chain's.
    pub async fn connect_in(
        url: &str,
        config: SqsConfig,
        client: &ClientSettings,
    ) -> Result<Self, Error> {
        let shared = client::sdk_config_for(url, client).await?;
        let transport = Self::from_sdk_config(&shared, config)?;
        transport
            .link
            .queues
            .client
            .list_queues()
            .max_results(1)
            .send()
            .await
            .map_err(|e| {
                sdk_error(
                    &format!(
                        "reach SQS at {}",
                        event_retry_core::options::redact_url(url)
                    ),
                    e,
                )
            })?;
        if let Some(sns) = &transport.link.sns {
            sns.check_reachable().await.map_err(|e| {
                e.with_operation(format!(
                    "reach SNS at {}",
                    event_retry_core::options::redact_url(url)
                ))
            })?;
        }
        Ok(transport)
    }

    /// Uses a client built elsewhere (e.g. from `aws_config::load_from_env()`, for the whole AWS
    /// credential chain). Consumer groups through SNS (`config.sns`) need an SNS client too:
    /// [`SqsTransport::from_sdk_config`] builds both.
    pub fn from_client(client: Client, config: SqsConfig) -> Result<Self, Error> {
        config.validate()?;
        if config.sns {
            return Err(Error::new(
                Kind::Config,
                "the sns setting needs an SNS client too: use SqsTransport::from_sdk_config"
                    .to_string(),
            ));
        }
        Ok(Self {
            link: Arc::new(Link::new(Queues::new(client, config), None)),
        })
    }

    /// Builds the SQS client (and, with `config.sns`, the SNS client) from an AWS configuration (e.g.
    /// `aws_config::load_from_env().await`).
    pub fn from_sdk_config(
        shared: &aws_config::SdkConfig,
        config: SqsConfig,
    ) -> Result<Self, Error> {
        config.validate()?;
        let sns = config
            .sns
            .then(|| crate::sns::Sns::new(aws_sdk_sns::Client::new(shared)));
        Ok(Self {
            link: Arc::new(Link::new(Queues::new(Client::new(shared), config), sns)),
        })
    }

    /// The settings in use.
    pub fn config(&self) -> &SqsConfig {
        &self.link.queues.config
    }

    pub(crate) async fn delete_queue(&self, name: &str) -> Result<(), Error> {
        let Some(url) = self.link.queues.url_of(name).await? else {
            return Ok(());
        };
        self.link
            .queues
            .client
            .delete_queue()
            .queue_url(url)
            .send()
            .await
            .map(drop)
            .map_err(|e| sdk_error(&format!("delete queue {name}"), e))
    }
}

/// The longest retry a FIFO queue takes: it is a visibility change, which must end inside the visibility
/// window counted from the receive, so some of the window is left for the handler that ran before it.
fn fifo_max_delay(config: &SqsConfig) -> std::time::Duration {
    config
        .max_visibility
        .saturating_sub(std::time::Duration::from_secs(300))
}

#[async_trait]
impl Transport for SqsTransport {
    fn name(&self) -> &'static str {
        "sqs"
    }

    /// A standard queue's: a delay longer than the visibility window is carried by copies; per-key order
    /// is not SQS's, and fan-out only through SNS (the `sns` setting: a queue per consumer group);
    /// without it the consumers of a queue compete for its messages.
    fn capabilities(&self) -> Capabilities {
        standard_capabilities(&self.link.queues.config).fan_out(self.link.sns.is_some())
    }

    /// A standard queue's, or a FIFO queue's (`.fifo`): per-key order, the key being the message group,
    /// and delays that fit the visibility window.
    fn capabilities_for(&self, topic: &str) -> Capabilities {
        if topic.ends_with(".fifo") {
            fifo_capabilities(&self.link.queues.config)
        } else {
            self.capabilities()
        }
    }

    async fn publish(&self, topic: &str, event: &Event) -> Result<Published, Error> {
        self.link
            .send_event(topic, event, None, &format!("publish to {topic}"))
            .await
            .map(|id| Published::accepted().with_message_id(id))
    }

    async fn subscribe(&self, spec: &SubscriptionSpec) -> Result<Box<dyn Subscription>, Error> {
        let (name, queue) = self.link.source_queue(&spec.topic, &spec.group).await?;
        let config = &self.link.queues.config;
        check_redrive(
            &name,
            &queue,
            spec.max_deliveries,
            spec.longest_delay,
            config.max_visibility,
        )?;
        check_retention(&name, &queue, spec.longest_delay)?;
        if queue.fifo
            && let Some(longest) = spec.longest_delay
            && longest > fifo_max_delay(&self.link.queues.config)
        {
            return Err(Error::new(
                Kind::Config,
                format!(
                    "{} is a FIFO queue: retries use visibility only, which ends {:?} after the receive \
                     (less room for the handler), but the policy asks for {longest:?}",
                    spec.topic, self.link.queues.config.max_visibility
                ),
            ));
        }
        Ok(Box::new(SqsSubscription::new(
            self.link.clone(),
            spec.clone(),
            name,
            queue,
        )))
    }

    async fn open_dead_letters(
        &self,
        source_topic: &str,
    ) -> Result<Option<Box<dyn DlqSession>>, Error> {
        if self.link.sns.is_some() {
            dlq::open_groups(self.link.clone(), source_topic).await
        } else {
            dlq::open(self.link.clone(), source_topic).await
        }
    }

    /// Sends the entry to the queue's DLQ (found or created with the queue). Without SNS a topic has no
    /// consumer groups, so `group` is not stored and a replay goes to the queue every consumer shares;
    /// with SNS the entry goes to the DLQ of `group`'s queue (the default group's when `None`).
    async fn write_dead_letter(
        &self,
        source_topic: &str,
        group: Option<&str>,
        event: &Event,
    ) -> Result<(), Error> {
        let queue = if self.link.sns.is_some() {
            let group = group.map_or_else(
                || event_retry_core::adapter::default_group(source_topic),
                str::to_string,
            );
            self.link.group_queue(source_topic, &group).await?.1
        } else {
            self.link.queues.resolve(source_topic).await?
        };
        self.link.send_dead_letter(&queue, event, None).await
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

/// A standard queue's: a delay longer than the visibility window is carried by copies; per-key order and
/// fan-out are not SQS's (consumers of a queue compete for its messages; fan-out needs SNS).
fn standard_capabilities(config: &SqsConfig) -> Capabilities {
    Capabilities::new(
        DelayCapability::new(std::time::Duration::from_secs(1))
            .with_max_native(config.max_visibility, BeyondMax::Split),
    )
    .blocking_pause(true)
    .replay(true)
    .shared_subscription(true)
    .crash_redelivery(true)
}

/// A FIFO queue's: per-key order, the key being the message group (SQS hands out a group's messages one
/// batch at a time, in order); a delay must fit the visibility window (a FIFO queue takes no per-message
/// delay to carry a longer one).
fn fifo_capabilities(config: &SqsConfig) -> Capabilities {
    let standard = standard_capabilities(config);
    Capabilities::new(
        standard
            .delay
            .with_max_native(fifo_max_delay(config), BeyondMax::Refuse),
    )
    .blocking_pause(standard.blocking_pause)
    .replay(standard.replay)
    .shared_subscription(standard.shared_subscription)
    .crash_redelivery(standard.crash_redelivery)
    .per_key_order(true)
    .broker_orders_keys(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_carries_the_default_capabilities() {
        let readme = include_str!("../README.md");
        let config = SqsConfig::default();
        assert_eq!(
            standard_capabilities(&config).check_listed_in(readme),
            Ok(())
        );
        assert_eq!(fifo_capabilities(&config).check_listed_in(readme), Ok(()));
    }
}
