//! A service: several consumers with their handlers, started together and stopped together.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use event_retry_core::prelude::*;
//! use event_retry_core::runtime::shutdown_signal;
//!
//! #[derive(serde::Deserialize)]
//! struct Order { id: u64 }
//!
//! let broker = Broker::memory();
//! App::new()
//!     .consumer(
//!         broker.consumer("orders").policy(RetryPolicy::parse("5s x3")?),
//!         json_handler(|order: Order, _ctx: Context| async move {
//!             println!("order {}", order.id);
//!             Ok(())
//!         }),
//!     )
//!     .consumer(
//!         broker.consumer("refunds"),
//!         handler_fn(|_event: Event, _ctx: Context| async { Ok(()) }),
//!     )
//!     .run_until(shutdown_signal()) // SIGTERM or ctrl-c, then a graceful drain of every consumer
//!     .await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::Arc;

use futures::future::{FutureExt, select_all};

use super::batch::BatchHandler;
use super::builder::ConsumerBuilder;
use super::error::ConsumerError;
use super::handle::{ConsumerHandle, HealthWatch};
use super::handler::Handler;
use super::health::Health;
use super::launch::Started;

/// Why an [`App`] stopped with an error: which consumer, and what happened to it.
#[derive(Debug, thiserror::Error)]
#[error("consumer of {topic}: {error}")]
pub struct AppError {
    /// The topic of the consumer that failed.
    pub topic: String,
    /// What happened.
    #[source]
    pub error: ConsumerError,
}

/// Several consumers run as one service, with one shutdown.
#[derive(Default)]
#[must_use = "an app does nothing until it runs"]
pub struct App {
    consumers: Vec<(ConsumerBuilder, Started)>,
    health: AppHealth,
}

/// The health of an [`App`]'s consumers, readable from anywhere while it runs ([`App::health`]): what a
/// liveness and a readiness endpoint report for the whole service.
#[derive(Clone, Debug, Default)]
pub struct AppHealth(Arc<std::sync::Mutex<Option<Vec<Watched>>>>);

/// A consumer's topic and its health.
type Watched = (String, HealthWatch);

impl AppHealth {
    /// Each consumer's topic and health, once the app started them (empty before).
    pub fn consumers(&self) -> Vec<(String, Health)> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flatten()
            .map(|(topic, watch)| (topic.clone(), watch.health()))
            .collect()
    }

    /// Whether the app started its consumers.
    pub fn started(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Liveness: no consumer stopped by failing ([`Health::is_live`]).
    pub fn is_live(&self) -> bool {
        self.consumers().iter().all(|(_, h)| h.is_live())
    }

    /// Readiness: started, and every consumer runs unhindered ([`Health::is_ready`]).
    pub fn is_ready(&self) -> bool {
        self.started() && self.consumers().iter().all(|(_, h)| h.is_ready())
    }

    fn set(&self, consumers: Vec<Watched>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(consumers);
    }
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let topics: Vec<&str> = self
            .consumers
            .iter()
            .map(|(b, _)| b.spec.topic.as_str())
            .collect();
        f.debug_struct("App").field("topics", &topics).finish()
    }
}

impl App {
    /// An app with no consumers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A reader of the app's health (each consumer's, once started), to serve from a probe endpoint
    /// while [`App::run`] runs.
    pub fn health(&self) -> AppHealth {
        self.health.clone()
    }

    /// Adds a consumer and the handler for its events.
    pub fn consumer(mut self, consumer: ConsumerBuilder, handler: impl Handler) -> Self {
        self.consumers
            .push((consumer, Started::PerEvent(Arc::new(handler))));
        self
    }

    /// Adds a consumer and a batch handler for its events (see
    /// [`Consumer::start_batch`](super::Consumer::start_batch)).
    pub fn batch_consumer(mut self, consumer: ConsumerBuilder, handler: impl BatchHandler) -> Self {
        self.consumers
            .push((consumer, Started::Batch(Arc::new(handler))));
        self
    }

    /// Builds every consumer (refusing them all if one is misconfigured, before any starts), starts
    /// them, and runs until `signal` completes or a consumer stops on its own; then stops every consumer
    /// gracefully and waits for all of them. Returns the first consumer's error, if any.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> Result<(), AppError> {
        let mut built = Vec::new();
        for (builder, handler) in self.consumers {
            let topic = builder.spec.topic.clone();
            let consumer = builder
                .build()
                .and_then(|consumer| match &handler {
                    Started::Batch(_) => consumer.check_batch().map(|()| consumer),
                    Started::PerEvent(_) => Ok(consumer),
                })
                .map_err(|error| AppError {
                    topic: topic.clone(),
                    error,
                })?;
            built.push((topic, consumer, handler));
        }
        let mut running: Vec<(String, ConsumerHandle)> = Vec::new();
        for (topic, consumer, handler) in built {
            match consumer.start_with(handler).await {
                Ok(handle) => running.push((topic, handle)),
                Err(error) => {
                    stop_all(running).await;
                    return Err(AppError { topic, error });
                }
            }
        }
        self.health.set(
            running
                .iter()
                .map(|(topic, handle)| (topic.clone(), handle.health_watch()))
                .collect(),
        );
        if running.is_empty() {
            signal.await;
            return Ok(());
        }
        let triggers: Vec<_> = running.iter().map(|(_, h)| h.shutdown_trigger()).collect();
        let topics: Vec<String> = running.iter().map(|(t, _)| t.clone()).collect();
        let mut waiting: Vec<_> = running
            .into_iter()
            .map(|(_, handle)| handle.into_future_boxed())
            .collect();
        let mut first_error = None;
        tokio::select! {
            () = signal => {}
            (result, index, rest) = select_all(waiting.iter_mut()) => {
                // A consumer stopped by itself: the service stops as a whole.
                if let Err(error) = result {
                    first_error = Some(AppError { topic: topics[index].clone(), error });
                }
                drop(rest);
                drop(waiting.remove(index));
            }
        }
        for trigger in &triggers {
            trigger.trigger();
        }
        for (topic, result) in topics.iter().zip(futures::future::join_all(waiting).await) {
            if let (Err(error), None) = (result, &first_error) {
                first_error = Some(AppError {
                    topic: topic.clone(),
                    error,
                });
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Runs until the process is asked to stop (SIGTERM or ctrl-c), then drains gracefully.
    pub async fn run(self) -> Result<(), AppError> {
        self.run_until(shutdown_signal()).await
    }
}

async fn stop_all(running: Vec<(String, ConsumerHandle)>) {
    for (_, handle) in running {
        let _ = handle.shutdown().await;
    }
}

impl ConsumerHandle {
    fn into_future_boxed(
        self,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), ConsumerError>> + Send>> {
        std::future::IntoFuture::into_future(self).boxed()
    }
}

/// Completes when the process is asked to stop: ctrl-c (SIGINT) or, on Unix, SIGTERM — what a
/// container orchestrator sends. A signal that cannot be listened for is logged and ignored.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutdown requested");
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::broker::Broker;
    use crate::event::Event;
    use crate::runtime::{Context, handler_fn};

    #[tokio::test]
    async fn one_app_runs_several_topics_and_stops_them_together() {
        let broker = Broker::memory();
        let seen = Arc::new(AtomicUsize::new(0));
        let (a, b) = (seen.clone(), seen.clone());
        let app = App::new()
            .consumer(
                broker.consumer("a"),
                handler_fn(move |_e: Event, _c: Context| {
                    let a = a.clone();
                    async move {
                        a.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }
                }),
            )
            .consumer(
                broker.consumer("b"),
                handler_fn(move |_e: Event, _c: Context| {
                    let b = b.clone();
                    async move {
                        b.fetch_add(10, Ordering::SeqCst);
                        Ok(())
                    }
                }),
            );
        let producer = broker.producer();
        producer.publish("a", Event::new("1")).await.unwrap();
        producer.publish("b", Event::new("2")).await.unwrap();
        run_until_seen(app, &seen, 11).await;
    }

    /// Runs `app` until `seen` reaches `want` (within 5 s), then stops it and checks it ended cleanly.
    async fn run_until_seen(app: App, seen: &AtomicUsize, want: usize) {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(app.run_until(async {
            let _ = stop_rx.await;
        }));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while seen.load(Ordering::SeqCst) < want {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{want} handled within 5 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_misconfigured_consumer_stops_the_app_before_anything_starts() {
        let broker = Broker::memory();
        let err = App::new()
            .consumer(
                broker.consumer(""),
                handler_fn(|_e: Event, _c: Context| async { Ok(()) }),
            )
            .run_until(std::future::pending())
            .await
            .unwrap_err();
        assert!(matches!(err.error, ConsumerError::Invalid(_)), "{err}");
    }

    #[tokio::test]
    async fn an_app_runs_a_batch_consumer_and_refuses_one_it_cannot_honour_before_any_starts() {
        let broker = Broker::memory();
        let producer = broker.producer();
        for i in 0..5 {
            producer
                .publish("batched", Event::new(format!("{i}")))
                .await
                .unwrap();
        }
        let seen = Arc::new(AtomicUsize::new(0));
        let counted = seen.clone();
        let batch = crate::runtime::batch_handler_fn(move |events: Vec<(Event, Context)>| {
            counted.fetch_add(events.len(), Ordering::SeqCst);
            async move { events.iter().map(|_| Ok(())).collect() }
        });
        run_until_seen(
            App::new().batch_consumer(broker.consumer("batched"), batch),
            &seen,
            5,
        )
        .await;

        // Ordering with a batch handler: refused when the app builds its consumers.
        let err = App::new()
            .consumer(
                broker.consumer("first"),
                handler_fn(|_e: Event, _c: Context| async { Ok(()) }),
            )
            .batch_consumer(
                broker
                    .consumer("ordered")
                    .ordered_by_key(crate::runtime::ParkedAfterDead::Run),
                crate::runtime::batch_handler_fn(|events: Vec<(Event, Context)>| async move {
                    events.iter().map(|_| Ok(())).collect()
                }),
            )
            .run_until(std::future::pending())
            .await
            .unwrap_err();
        assert!(matches!(err.error, ConsumerError::Invalid(_)), "{err}");
        assert_eq!(err.topic, "ordered");
    }
}
