//! The consumer runtime: receive, handle with bounded concurrency, decide, settle.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use retry_core::prelude::*;
//!
//! let transport = Arc::new(MemoryTransport::new());
//! let handle = Consumer::builder(transport, "orders")
//!     .policy(RetryPolicy::parse("5s x3, 10s x5")?)
//!     .concurrency(8)
//!     .build()?
//!     .start(handler_fn(|event: Event, ctx: Context| async move {
//!         println!("attempt {} of {:?}", ctx.attempt, event.payload);
//!         Ok(())
//!     }))
//!     .await?;
//! // ... later
//! handle.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! The receive loop never sleeps on a message: retries wait in the broker, in-place retries and blocking
//! holds wait inside the task that handles the event. A blocking error pauses the subscription (the loop
//! stops taking deliveries) until the held event gets past it. Shutdown stops receiving, lets in-flight
//! handlers finish within a grace period and releases whatever is left to the broker — nothing is lost.

mod handler;
mod ordering;
mod process;
mod stats;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use handler::{Context, FnHandler, Handler, UndecodablePayload, decode_json, handler_fn};
pub use stats::Stats;

use crate::check::DelayReport;
use crate::classify::Classifier;
use crate::config::{ConfigError, RetryConfig};
use crate::decide::Policies;
use crate::idempotency::IdempotencyStore;
use crate::policy::RetryPolicy;
use crate::transport::{Delivery, Subscription, SubscriptionSpec, Transport, TransportError};
use ordering::{KeyQueues, Parking};
use stats::Counters;

/// Why a consumer could not be built or stopped cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// The transport cannot honour a delay of the policy.
    #[error("the {transport} transport cannot honour this retry policy:\n{report}")]
    PolicyRefused {
        /// The transport's name.
        transport: &'static str,
        /// The full report.
        report: DelayReport,
    },
    /// The configuration is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// The transport failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The receive loop ended abnormally.
    #[error("the consumer task failed: {0}")]
    Task(String),
}

impl From<ConfigError> for ConsumerError {
    fn from(e: ConfigError) -> Self {
        ConsumerError::Config(e.to_string())
    }
}

/// Per-key ordering settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct OrderingConfig {
    follow_to_dlq: bool,
}

/// Builds a [`Consumer`].
pub struct ConsumerBuilder {
    transport: Arc<dyn Transport>,
    spec: SubscriptionSpec,
    policies: Policies,
    classifier: Classifier,
    idempotency: Option<Arc<dyn IdempotencyStore>>,
    ordering: Option<OrderingConfig>,
    shutdown_grace: Duration,
    settle_backoff: Duration,
    seed: Option<u64>,
}

impl ConsumerBuilder {
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

    /// Skips event ids the store says were handled.
    pub fn idempotency(mut self, store: Arc<dyn IdempotencyStore>) -> Self {
        self.idempotency = Some(store);
        self
    }

    /// Keeps the order of events with the same key: while one waits in retry, later ones of its key are
    /// parked behind it; if it is dead-lettered they follow it (`follow_to_dlq`) or go on.
    pub fn ordered_by_key(mut self, follow_to_dlq: bool) -> Self {
        self.ordering = Some(OrderingConfig { follow_to_dlq });
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

    /// Seeds the jitter's random source, for reproducible tests.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks the policy against the transport and builds the consumer; a delay the transport cannot
    /// honour is an error here, at start-up.
    pub fn build(mut self) -> Result<Consumer, ConsumerError> {
        let deferred = &self.policies.deferred;
        self.spec.max_deliveries = deferred.max_retries().map(|r| r.saturating_add(1));
        self.spec.longest_delay = Some(deferred.longest_delay());
        if self.spec.topic.is_empty() {
            return Err(ConsumerError::Config("the topic name is empty".to_string()));
        }
        let capabilities = self.transport.capabilities();
        let report = DelayReport::new(&self.policies.deferred, &capabilities.delay);
        if !report.is_ok() {
            return Err(ConsumerError::PolicyRefused {
                transport: self.transport.name(),
                report,
            });
        }
        if self.ordering.is_some() && !capabilities.per_key_order {
            return Err(ConsumerError::Config(format!(
                "the {} transport cannot keep per-key order",
                self.transport.name()
            )));
        }
        Ok(Consumer {
            builder: self,
            report,
        })
    }
}

/// A configured consumer, ready to start.
pub struct Consumer {
    builder: ConsumerBuilder,
    report: DelayReport,
}

impl Consumer {
    /// Starts building a consumer of `topic` on `transport`.
    pub fn builder(transport: Arc<dyn Transport>, topic: impl Into<String>) -> ConsumerBuilder {
        let topic = topic.into();
        ConsumerBuilder {
            transport,
            spec: SubscriptionSpec {
                group: format!("{topic}-consumers"),
                topic,
                consumer: format!(
                    "consumer-{}",
                    &uuid::Uuid::new_v4().simple().to_string()[..8]
                ),
                ordered: false,
                max_in_flight: 16,
                max_deliveries: None,
                longest_delay: None,
            },
            policies: Policies::default(),
            classifier: Classifier::new(),
            idempotency: None,
            ordering: None,
            shutdown_grace: Duration::from_secs(10),
            settle_backoff: Duration::from_secs(1),
            seed: None,
        }
    }

    /// How the transport honours each delay of the deferred policy (checked at build time).
    pub fn delay_report(&self) -> &DelayReport {
        &self.report
    }

    /// Subscribes and starts consuming in the background.
    pub async fn start(self, handler: impl Handler) -> Result<ConsumerHandle, ConsumerError> {
        let b = self.builder;
        let subscription = b.transport.subscribe(&b.spec).await?;
        info!(
            topic = %b.spec.topic,
            transport = b.transport.name(),
            policy = %b.policies.deferred,
            "consumer started\n{}",
            self.report
        );
        let shutdown = CancellationToken::new();
        let counters = Arc::new(Counters::default());
        let (pause_tx, pause_rx) = watch::channel(0usize);
        let shared = Arc::new(Shared {
            spec: b.spec.clone(),
            policies: b.policies,
            classifier: b.classifier,
            idempotency: b.idempotency,
            parking: b.ordering.map(|o| {
                Parking::new(
                    o.follow_to_dlq,
                    Duration::from_millis(50),
                    Duration::from_secs(300),
                )
            }),
            handler: Arc::new(handler),
            counters: counters.clone(),
            pause: PauseGate { holds: pause_tx },
            shutdown: shutdown.clone(),
            rng: Mutex::new(
                b.seed
                    .map_or_else(|| StdRng::from_rng(&mut rand::rng()), StdRng::seed_from_u64),
            ),
            settle_backoff: b.settle_backoff,
        });
        let run = ReceiveLoop {
            shared,
            subscription,
            pause: pause_rx,
            tasks: JoinSet::new(),
            slots: Arc::new(Semaphore::new(b.spec.max_in_flight)),
            queue_slots: Arc::new(Semaphore::new(b.spec.max_in_flight.saturating_mul(4))),
            keys: Arc::new(KeyQueues::default()),
            grace: b.shutdown_grace,
        };
        Ok(ConsumerHandle {
            task: tokio::spawn(run.run()),
            shutdown,
            counters,
        })
    }
}

/// A running consumer.
pub struct ConsumerHandle {
    task: tokio::task::JoinHandle<Result<(), ConsumerError>>,
    shutdown: CancellationToken,
    counters: Arc<Counters>,
}

impl ConsumerHandle {
    /// A snapshot of the consumer's counters.
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    /// Whether the receive loop has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops receiving, lets in-flight handlers finish within the grace period, releases the rest to the
    /// broker, and leaves the subscription.
    pub async fn shutdown(self) -> Result<(), ConsumerError> {
        self.shutdown.cancel();
        self.task
            .await
            .map_err(|e| ConsumerError::Task(e.to_string()))?
    }

    /// Stops at once, as a crash would: nothing more is settled, and the broker delivers whatever was in
    /// flight again. For tests of crash safety.
    pub async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// State shared by the receive loop and the tasks handling deliveries.
pub(crate) struct Shared {
    spec: SubscriptionSpec,
    policies: Policies,
    classifier: Classifier,
    idempotency: Option<Arc<dyn IdempotencyStore>>,
    parking: Option<Parking>,
    handler: Arc<dyn Handler>,
    counters: Arc<Counters>,
    pause: PauseGate,
    shutdown: CancellationToken,
    rng: Mutex<StdRng>,
    settle_backoff: Duration,
}

/// Counts blocking holds; the receive loop pauses while any is active.
struct PauseGate {
    holds: watch::Sender<usize>,
}

/// One active hold; dropping it ends the hold.
struct PauseGuard<'a>(&'a PauseGate);

impl PauseGate {
    fn hold(&self) -> PauseGuard<'_> {
        self.holds.send_modify(|n| *n += 1);
        PauseGuard(self)
    }
}

impl Drop for PauseGuard<'_> {
    fn drop(&mut self) {
        self.0.holds.send_modify(|n| *n = n.saturating_sub(1));
    }
}

struct ReceiveLoop {
    shared: Arc<Shared>,
    subscription: Box<dyn Subscription>,
    pause: watch::Receiver<usize>,
    tasks: JoinSet<()>,
    slots: Arc<Semaphore>,
    /// Deliveries waiting behind their key (per-key ordering) hold one of these instead of a work permit,
    /// so one busy key cannot take every slot from the others; 4 × concurrency of them.
    queue_slots: Arc<Semaphore>,
    keys: Arc<KeyQueues>,
    grace: Duration,
}

impl ReceiveLoop {
    async fn run(mut self) -> Result<(), ConsumerError> {
        let shutdown = self.shared.shutdown.clone();
        let mut receive_backoff = Duration::from_millis(100);
        loop {
            self.reap_finished_tasks();
            if shutdown.is_cancelled() {
                break;
            }
            if *self.pause.borrow_and_update() > 0 {
                self.hold_consumption().await;
                continue;
            }
            // `biased`: once shutdown is asked for, no new delivery is taken.
            let permit = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                _ = self.pause.changed() => continue,
                permit = self.slots.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let next = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                _ = self.pause.changed() => continue,
                next = self.subscription.next() => next,
            };
            match next {
                Ok(Some(delivery)) => {
                    receive_backoff = Duration::from_millis(100);
                    self.dispatch(delivery, permit);
                }
                Ok(None) => break,
                Err(TransportError::Closed) => break,
                Err(e) => {
                    warn!(error = %e, "receive failed; retrying");
                    self.shared
                        .counters
                        .error(&self.shared.counters.receive_errors, e.to_string());
                    tokio::select! {
                        () = tokio::time::sleep(receive_backoff) => {}
                        () = shutdown.cancelled() => break,
                    }
                    receive_backoff = (receive_backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        self.drain().await
    }

    /// Logs tasks that ended by panicking (a panicking handler is caught in `process`; this catches the
    /// rest, e.g. a panicking idempotency store).
    fn reap_finished_tasks(&mut self) {
        while let Some(result) = self.tasks.try_join_next() {
            if let Err(e) = result
                && e.is_panic()
            {
                tracing::error!(error = %e, "a delivery task panicked; its delivery was released");
            }
        }
    }

    /// Pauses the subscription until no blocking hold is active (or shutdown). A broker error pausing or
    /// resuming is counted and logged; consumption stays held by the loop either way.
    async fn hold_consumption(&mut self) {
        if let Err(e) = self.subscription.pause().await {
            warn!(error = %e, "pausing the subscription failed");
            self.shared
                .counters
                .error(&self.shared.counters.receive_errors, e.to_string());
        }
        loop {
            tokio::select! {
                changed = self.pause.changed() => {
                    if changed.is_err() || *self.pause.borrow_and_update() == 0 {
                        break;
                    }
                }
                () = self.shared.shutdown.cancelled() => break,
            }
        }
        if let Err(e) = self.subscription.resume().await {
            warn!(error = %e, "resuming the subscription failed");
            self.shared
                .counters
                .error(&self.shared.counters.receive_errors, e.to_string());
        }
    }

    fn dispatch(&mut self, delivery: Delivery, permit: tokio::sync::OwnedSemaphorePermit) {
        let shared = self.shared.clone();
        let ordered_key = shared.parking.as_ref().and(delivery.message.key.clone());
        match ordered_key {
            None => {
                self.tasks.spawn(async move {
                    process::process(shared, delivery).await;
                    drop(permit);
                });
            }
            Some(key) => {
                let queue_slots = self.queue_slots.clone();
                let claimed = self.keys.claim_or_queue(&key, delivery, permit, || {
                    queue_slots.try_acquire_owned().ok()
                });
                let Some((mut delivery, task_permit)) = claimed else {
                    return;
                };
                // Frees the key (releasing whatever queued behind it) even if processing panics.
                let mut key_guard = ordering::KeyGuard::new(self.keys.clone(), key);
                self.tasks.spawn(async move {
                    // The task holds one work permit for its whole life: one key, one event at a time.
                    let _task_permit = task_permit;
                    loop {
                        if shared.shutdown.is_cancelled() {
                            drop(delivery); // released to the broker unsettled
                        } else {
                            process::process(shared.clone(), delivery).await;
                        }
                        match key_guard.next() {
                            // The queued delivery's own permit (a queue slot) is no longer needed.
                            Some((next, _queued_permit)) => delivery = next,
                            None => break,
                        }
                    }
                });
            }
        }
    }

    /// Waits for in-flight work within the grace period, then releases what is left and leaves.
    async fn drain(mut self) -> Result<(), ConsumerError> {
        let finished = tokio::time::timeout(self.grace, async {
            while let Some(result) = self.tasks.join_next().await {
                if let Err(e) = result
                    && e.is_panic()
                {
                    tracing::error!(error = %e, "a delivery task panicked; its delivery was released");
                }
            }
        })
        .await;
        if finished.is_err() {
            warn!(
                remaining = self.tasks.len(),
                "shutdown grace elapsed; releasing in-flight events to the broker"
            );
            self.tasks.shutdown().await;
        }
        self.subscription.close().await?;
        info!(topic = %self.shared.spec.topic, "consumer stopped");
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::dlq::DeadLetterQueue;
    use crate::event::Event;
    use crate::memory::MemoryTransport;
    use crate::policy::RetryPolicy;
    use crate::transport::{Capabilities, Subscription, TransportError};

    /// A memory transport that records the spec it was subscribed with.
    #[derive(Default)]
    struct Recording {
        inner: MemoryTransport,
        spec: std::sync::Mutex<Option<SubscriptionSpec>>,
    }

    #[async_trait::async_trait]
    impl Transport for Recording {
        fn name(&self) -> &'static str {
            "recording"
        }
        fn capabilities(&self) -> Capabilities {
            MemoryTransport::CAPABILITIES
        }
        async fn publish(&self, topic: &str, event: &Event) -> Result<(), TransportError> {
            self.inner.publish(topic, event).await
        }
        async fn subscribe(
            &self,
            spec: &SubscriptionSpec,
        ) -> Result<Box<dyn Subscription>, TransportError> {
            *self.spec.lock().unwrap() = Some(spec.clone());
            self.inner.subscribe(spec).await
        }
        fn dead_letters(&self) -> Arc<dyn DeadLetterQueue> {
            self.inner.dead_letters()
        }
    }

    #[tokio::test]
    async fn the_spec_carries_the_deliveries_and_longest_delay_the_policy_needs() {
        let transport = Arc::new(Recording::default());
        let handle = Consumer::builder(transport.clone(), "t")
            .policy(RetryPolicy::parse("1s x2, 5s x3").unwrap())
            .build()
            .unwrap()
            .start(crate::runtime::handler_fn(|_e: Event, _c: Context| async {
                Ok::<(), crate::classify::HandlerError>(())
            }))
            .await
            .unwrap();
        let spec = transport.spec.lock().unwrap().clone().unwrap();
        assert_eq!(
            spec.max_deliveries,
            Some(6),
            "the first delivery and 5 retries"
        );
        assert_eq!(spec.longest_delay, Some(Duration::from_secs(5)));
        handle.shutdown().await.unwrap();
    }
}
