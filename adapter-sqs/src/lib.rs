//! The Amazon SQS adapter of event-retry.
//!
//! SQS is the broker where a retry is not a copy: the received message is hidden with
//! `ChangeMessageVisibility(delay)` and comes back, its `ApproximateReceiveCount` counting the attempts.
//! A delay that would end beyond the 12 h visibility window is carried by a copy instead, never capped.
//! Dead letters are sent to the queue's DLQ (the redrive policy's target) with their diagnostics as
//! message attributes, then deleted from the source; the redrive policy is the safety net for crashes and
//! is checked at start-up against the retry policy. See the README for the details and limits.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use event_retry_sqs::SqsTransport;
//! // A local endpoint (ElasticMQ) with static credentials; `sqs://` alone is AWS, configured from the
//! // environment, and `SqsTransport::from_client` takes a client built with aws-config.
//! let transport = SqsTransport::connect("http://127.0.0.1:9324").await?;
//! # Ok(()) }
//! ```

mod codec;
pub mod config;
mod dlq;
mod queues;
mod shared;
mod subscription;
mod url;

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use retry_core::dlq::DeadLetterQueue;
use retry_core::event::Event;
use retry_core::transport::{
    BeyondMax, Capabilities, DelayCapability, Subscription, SubscriptionSpec, Transport,
    TransportError,
};

pub use crate::config::SqsConfig;
use crate::dlq::SqsDlq;
use crate::queues::{Queues, check_redrive, check_retention, sdk_error};
use crate::shared::{SendOptions, Shared, group_of};
use crate::subscription::SqsSubscription;

/// An SQS endpoint as an event-retry transport. Cheap to clone.
#[derive(Clone)]
pub struct SqsTransport {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SqsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsTransport")
            .field("config", &self.shared.queues.config)
            .finish_non_exhaustive()
    }
}

impl SqsTransport {
    /// Connects by URL with the default settings: `sqs://` (AWS; region and credentials from `AWS_REGION`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), `sqs://key:secret@host:port`
    /// or `http://host:port` (an SQS-compatible endpoint; `?region=` sets the region), or an `https://`
    /// queue URL (its endpoint and region).
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        Self::connect_with(url, SqsConfig::default()).await
    }

    /// Connects by URL with explicit settings, and checks the endpoint answers.
    pub async fn connect_with(url: &str, config: SqsConfig) -> Result<Self, TransportError> {
        let client = url::client_for(url)?;
        let transport = Self::from_client(client, config)?;
        transport
            .shared
            .queues
            .client
            .list_queues()
            .max_results(1)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("reach SQS at {url}"), e))?;
        Ok(transport)
    }

    /// Uses a client built elsewhere (e.g. from `aws_config::load_from_env()`, for the whole AWS
    /// credential chain).
    pub fn from_client(client: Client, config: SqsConfig) -> Result<Self, TransportError> {
        config.validate()?;
        Ok(Self {
            shared: Arc::new(Shared::new(Queues::new(client, config))),
        })
    }

    /// The settings in use.
    pub fn config(&self) -> &SqsConfig {
        &self.shared.queues.config
    }

    /// Resolves `topic`'s queue and DLQ now (creating them when missing and allowed).
    pub async fn declare(&self, topic: &str) -> Result<(), TransportError> {
        self.shared.queues.forget(topic);
        self.shared.queues.resolve(topic).await.map(drop)
    }

    /// The name of `topic`'s DLQ queue.
    pub async fn dlq_name(&self, topic: &str) -> Result<String, TransportError> {
        Ok(self.shared.queues.resolve(topic).await?.dlq_name)
    }

    /// Deletes `topic`'s DLQ queue with its entries; dead-lettering from `topic` then fails (and the
    /// originals stay in the source queue) until [`SqsTransport::declare`] creates it again.
    pub async fn delete_dlq(&self, topic: &str) -> Result<(), TransportError> {
        let name = self.dlq_name(topic).await?;
        self.delete_queue(&name).await
    }

    /// Deletes `topic`'s queue and its DLQ with every message in them.
    pub async fn delete_topic(&self, topic: &str) -> Result<(), TransportError> {
        let dlq = self.dlq_name(topic).await.ok();
        self.shared.queues.forget(topic);
        self.delete_queue(topic).await?;
        if let Some(dlq) = dlq {
            self.delete_queue(&dlq).await?;
        }
        Ok(())
    }

    async fn delete_queue(&self, name: &str) -> Result<(), TransportError> {
        let Some(url) = self.shared.queues.url_of(name).await? else {
            return Ok(());
        };
        self.shared
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

#[async_trait]
impl Transport for SqsTransport {
    fn name(&self) -> &'static str {
        "sqs"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            delay: DelayCapability {
                granularity: std::time::Duration::from_secs(1),
                max_native: Some(self.shared.queues.config.max_visibility),
                beyond_max: BeyondMax::Split,
            },
            per_key_order: false,
            blocking_pause: true,
            replay: true,
            shared_subscription: true,
            crash_redelivery: true,
        }
    }

    async fn publish(&self, topic: &str, event: &Event) -> Result<(), TransportError> {
        let queue = self.shared.queues.resolve(topic).await?;
        let out = codec::encode(event)?;
        let group = group_of(event.key.as_deref());
        self.shared
            .send(
                &queue,
                &queue.url,
                out,
                SendOptions {
                    group,
                    ..SendOptions::default()
                },
                &format!("publish to {topic}"),
            )
            .await
    }

    async fn subscribe(
        &self,
        spec: &SubscriptionSpec,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        let queue = self.shared.queues.resolve(&spec.topic).await?;
        let config = &self.shared.queues.config;
        check_redrive(
            &spec.topic,
            &queue,
            spec.max_deliveries,
            spec.longest_delay,
            config.max_visibility,
        )?;
        check_retention(&spec.topic, &queue, spec.longest_delay)?;
        if queue.fifo
            && let Some(longest) = spec.longest_delay
            && longest > self.shared.queues.config.max_visibility
        {
            return Err(TransportError::Config(format!(
                "{} is a FIFO queue: retries use visibility only, which ends {:?} after the receive, but the \
                 policy asks for {longest:?}",
                spec.topic, self.shared.queues.config.max_visibility
            )));
        }
        Ok(Box::new(SqsSubscription::new(
            self.shared.clone(),
            spec.clone(),
            queue,
        )))
    }

    fn dead_letters(&self) -> Arc<dyn DeadLetterQueue> {
        Arc::new(SqsDlq {
            shared: self.shared.clone(),
        })
    }
}
