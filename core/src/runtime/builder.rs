//! Configuring a consumer, and the checks that run before it may start.

use std::sync::Arc;
use std::time::Duration;

use crate::adapter::{SubscriptionSpec, Transport, default_group};
use crate::check::DelayReport;
use crate::classify::Classifier;
use crate::config::RetryConfig;
use crate::decide::Policies;
use crate::idempotency::IdempotencyStore;
use crate::policy::RetryPolicy;

use super::batch::BatchHandler;
use super::error::ConsumerError;
use super::handle::ConsumerHandle;
use super::handler::Handler;

/// The most events a batch handler is given at once, unless [`ConsumerBuilder::batch_size`] says.
const DEFAULT_BATCH_SIZE: usize = 64;

/// When permanent receive errors stop a consumer ([`ConsumerBuilder::give_up_receiving_after`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct GiveUp {
    pub(super) failures: u32,
    pub(super) over: Duration,
}

impl Default for GiveUp {
    fn default() -> Self {
        Self {
            failures: 10,
            over: Duration::from_secs(60),
        }
    }
}

/// What happens to the events parked behind a key's head when the head is dead-lettered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ParkedAfterDead {
    /// They follow the head into the DLQ, so the key's order is kept there too (the default).
    #[default]
    FollowToDlq,
    /// They run, in order, as if the head had succeeded.
    Run,
}

/// Per-key ordering settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OrderingConfig {
    pub(super) follow_to_dlq: bool,
}

/// Builds a [`Consumer`]; start one with [`Broker::consumer`](crate::broker::Broker::consumer).
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use event_retry_core::prelude::*;
///
/// let broker = Broker::memory();
/// let consumer = broker
///     .consumer("orders")
///     .group("billing")                                   // default: "<topic>-consumers"
///     .policy(RetryPolicy::parse("1s x3, 1m x5")?)        // deferred retries through the broker
///     .in_place(RetryPolicy::parse("50ms x2")?)           // transient errors, inside the consumer
///     .concurrency(8)
///     .ordered_by_key(ParkedAfterDead::FollowToDlq)       // per-key order while a key's head retries
///     .shutdown_grace(Duration::from_secs(5))
///     .build()?;                                          // a policy the broker cannot honour fails here
/// assert_eq!(consumer.topic(), "orders");
/// let handle = consumer.start(handler_fn(|_event: Event, _ctx: Context| async { Ok(()) })).await?;
/// handle.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct ConsumerBuilder {
    pub(super) transport: Arc<dyn Transport>,
    pub(super) spec: SubscriptionSpec,
    pub(super) policies: Policies,
    pub(super) classifier: Classifier,
    pub(super) idempotency: Option<Arc<dyn IdempotencyStore>>,
    pub(super) ordering: Option<OrderingConfig>,
    pub(super) shutdown_grace: Duration,
    pub(super) settle_backoff: Duration,
    pub(super) give_up: GiveUp,
    pub(super) seed: Option<u64>,
    /// The most events a batch handler is given at once.
    pub(super) batch_size: usize,
    pub(super) probes: super::probe::Probes,
    #[cfg(feature = "tower")]
    pub(super) layers: super::tower::Layers,
}

impl std::fmt::Debug for ConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("broker", &self.transport.name())
            .field("spec", &self.spec)
            .field("policies", &self.policies)
            .finish_non_exhaustive()
    }
}

impl ConsumerBuilder {
    pub(crate) fn new(transport: Arc<dyn Transport>, topic: String) -> Self {
        let consumer = format!(
            "consumer-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Self {
            transport,
            spec: SubscriptionSpec::new(topic.clone(), default_group(&topic), consumer)
                .with_max_in_flight(16),
            policies: Policies::default(),
            classifier: Classifier::new(),
            idempotency: None,
            ordering: None,
            shutdown_grace: Duration::from_secs(10),
            settle_backoff: Duration::from_secs(1),
            give_up: GiveUp::default(),
            seed: None,
            batch_size: DEFAULT_BATCH_SIZE,
            probes: super::probe::Probes::default(),
            #[cfg(feature = "tower")]
            layers: super::tower::Layers::default(),
        }
    }

    /// Sets the consumer group (default: `<topic>-consumers`).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.spec.group = group.into();
        self
    }

    /// Sets this consumer's name, recorded on DLQ entries (default: a random `consumer-…`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.spec.consumer = name.into();
        self
    }

    /// Sets all three policies.
    pub fn policies(mut self, policies: Policies) -> Self {
        self.policies = policies;
        self
    }

    /// Sets the deferred retry policy (retries through the broker).
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policies.deferred = policy;
        self
    }

    /// Sets the in-place retry policy for transient errors.
    pub fn in_place(mut self, policy: RetryPolicy) -> Self {
        self.policies.in_place = policy;
        self
    }

    /// Sets the backoff while a blocking error holds consumption.
    pub fn blocking(mut self, policy: RetryPolicy) -> Self {
        self.policies.blocking = policy;
        self
    }

    /// Probes the dependency behind every blocking error: while an event is held, `probe` is called on
    /// the blocking backoff instead of the handler, and the held event runs again once it returns `Ok`
    /// (see [`super::probe`]). Probes registered with [`ConsumerBuilder::blocking_probe_when`] before it
    /// take precedence for the errors they accept.
    ///
    /// ```
    /// # use event_retry_core::broker::Broker;
    /// # async fn ping() -> Result<(), std::io::Error> { Ok(()) }
    /// let consumer = Broker::memory().consumer("orders").blocking_probe(|| async { ping().await });
    /// ```
    pub fn blocking_probe<F, Fut, E>(mut self, probe: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
        E: Into<crate::classify::BoxError>,
    {
        self.probes.push(None, probe);
        self
    }

    /// Probes the dependency behind the blocking errors `applies` accepts (by type, with
    /// [`HandlerError::as_error`](crate::classify::HandlerError::as_error)'s chain, or by message);
    /// rules are tried in the order they were added.
    pub fn blocking_probe_when<P, F, Fut, E>(mut self, applies: P, probe: F) -> Self
    where
        P: Fn(&crate::classify::HandlerError) -> bool + Send + Sync + 'static,
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
        E: Into<crate::classify::BoxError>,
    {
        self.probes.push_when(applies, probe);
        self
    }

    /// Sets the error classifier.
    pub fn classifier(mut self, classifier: Classifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// Takes the policies and classification rules for this consumer's topic from a config file; type
    /// rules already registered on the classifier keep precedence.
    pub fn config(mut self, config: &RetryConfig) -> Result<Self, ConsumerError> {
        self.policies = config.policies(&self.spec.topic);
        self.classifier = config.classifier(&self.spec.topic, self.classifier)?;
        Ok(self)
    }

    /// Handles at most `n` events at once (default 16; at least 1, at most 100 000).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.spec.max_in_flight = n.clamp(1, 100_000);
        self
    }

    /// The most events a batch handler ([`Consumer::start_batch`]) is given in one call (default 64, at
    /// least 1, at most 100 000). A consumer with a batch handler keeps at least this many events in
    /// flight, whatever [`ConsumerBuilder::concurrency`] says: every event of a batch is in flight. While
    /// fewer than half a batch of those slots are free and more events wait, the next batch waits for
    /// its slots rather than start small.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.clamp(1, 100_000);
        self
    }

    /// Skips event ids the store says were handled.
    pub fn idempotency(mut self, store: impl IdempotencyStore + 'static) -> Self {
        self.idempotency = Some(Arc::new(store));
        self
    }

    /// Keeps the order of events with the same key: while one waits in retry, later ones of its key are
    /// parked behind it and run in order once it resolves; `after_dead` says what they do if it is
    /// dead-lettered.
    pub fn ordered_by_key(mut self, after_dead: ParkedAfterDead) -> Self {
        self.ordering = Some(OrderingConfig {
            follow_to_dlq: after_dead == ParkedAfterDead::FollowToDlq,
        });
        self.spec.ordered = true;
        self
    }

    /// How long shutdown waits for in-flight handlers before releasing their events (default 10 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How long a delivery whose settle failed waits before the broker delivers it again (default 1 s, at
    /// least 10 ms so an unwritable DLQ cannot spin the handler).
    pub fn settle_backoff(mut self, backoff: Duration) -> Self {
        self.settle_backoff = backoff.max(Duration::from_millis(10));
        self
    }

    /// When a consumer whose receive keeps failing with a permanent error (one whose
    /// [`is_temporary`](crate::error::Error::is_temporary) is false: refused credentials, a deleted queue) stops: after
    /// `failures` such errors in a row spanning at least `over` (default 10 over 60 s), its handle returns
    /// [`ConsumerError::ReceiveFailed`]. A temporary error (a broken connection, a timeout) or a delivery
    /// starts the count again; temporary errors are retried with a backoff for as long as they last.
    pub fn give_up_receiving_after(mut self, failures: u32, over: Duration) -> Self {
        self.give_up = GiveUp {
            failures: failures.max(1),
            over,
        };
        self
    }

    /// Seeds the jitter's random source, for reproducible tests.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks the policy against the broker and builds the consumer; a delay the broker cannot honour
    /// is an error here, at start-up.
    pub fn build(mut self) -> Result<Consumer, ConsumerError> {
        let deferred = &self.policies.deferred;
        self.spec.max_deliveries = deferred.max_retries().map(|r| r.saturating_add(1));
        self.spec.longest_delay = Some(deferred.longest_delay());
        if self.spec.topic.is_empty() {
            return Err(ConsumerError::Invalid(
                "the topic name is empty".to_string(),
            ));
        }
        let capabilities = self.transport.capabilities_for(&self.spec.topic);
        let report = DelayReport::new(&self.policies.deferred, &capabilities.delay);
        if !report.is_ok() {
            return Err(ConsumerError::PolicyRefused {
                transport: self.transport.name(),
                report,
            });
        }
        if self.ordering.is_some() && !capabilities.per_key_order {
            return Err(ConsumerError::Unsupported {
                transport: self.transport.name(),
                what: "keep per-key order",
            });
        }
        Ok(Consumer {
            builder: self,
            report,
        })
    }

    /// Builds the consumer and starts it with `handler` (see [`Consumer::start`]).
    pub async fn start(self, handler: impl Handler) -> Result<ConsumerHandle, ConsumerError> {
        self.build()?.start(handler).await
    }

    /// Builds the consumer and starts it with a batch handler (see [`Consumer::start_batch`]).
    pub async fn start_batch(
        self,
        handler: impl BatchHandler,
    ) -> Result<ConsumerHandle, ConsumerError> {
        self.build()?.start_batch(handler).await
    }
}

/// A configured consumer, ready to start.
pub struct Consumer {
    pub(super) builder: ConsumerBuilder,
    pub(super) report: DelayReport,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("builder", &self.builder)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// How the broker honours each delay of the deferred policy (checked at build time).
    pub fn delay_report(&self) -> &DelayReport {
        &self.report
    }

    /// The topic this consumer reads.
    pub fn topic(&self) -> &str {
        &self.builder.spec.topic
    }

    /// Refuses the settings a batch handler cannot honour (see [`Consumer::start_batch`]).
    pub(super) fn check_batch(&self) -> Result<(), ConsumerError> {
        if self.builder.ordering.is_some() {
            return Err(ConsumerError::Invalid(
                "per-key ordering needs a per-event handler; a batch handler cannot keep it"
                    .to_string(),
            ));
        }
        #[cfg(feature = "tower")]
        if !self.builder.layers.is_empty() {
            return Err(ConsumerError::Invalid(
                "tower layers wrap a per-event handler; a batch handler cannot have them"
                    .to_string(),
            ));
        }
        Ok(())
    }
}

#[cfg(feature = "tower")]
impl ConsumerBuilder {
    /// Wraps the handler in a `tower` layer (a timeout, a concurrency or rate limit, tracing). Layers
    /// added first are outermost. Decoding, classification, idempotency and poison handling stay outside
    /// every layer.
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: ::tower::Layer<super::tower::Boxed> + Send + 'static,
        L::Service:
            ::tower::Service<super::tower::Request, Response = ()> + Clone + Send + Sync + 'static,
        <L::Service as ::tower::Service<super::tower::Request>>::Error:
            Into<crate::classify::BoxError>,
        <L::Service as ::tower::Service<super::tower::Request>>::Future: Send + 'static,
    {
        self.layers.push(layer);
        self
    }
}
