//! A running consumer: awaitable, stoppable from anywhere, observable without polling.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Weak};

use super::error::ConsumerError;
use super::health::{Health, HealthState};
use super::shared::Shared;
use super::stats::{Counters, Stats};
use super::stop::StopSignal;

/// A running consumer.
///
/// Await it (`handle.await`) to wait until it stops — after [`ConsumerHandle::shutdown`], a
/// [`Shutdown::trigger`] from elsewhere, or a failure of its own — with the reason it stopped.
#[must_use = "a consumer stops when asked to; keep the handle to stop it or wait for it"]
pub struct ConsumerHandle {
    task: tokio::task::JoinHandle<Result<(), ConsumerError>>,
    shutdown: StopSignal,
    counters: Arc<Counters>,
    health: Arc<HealthState>,
    /// The state every task of the consumer holds, a lane's each: gone once none of them can run.
    alive: Vec<Weak<Shared>>,
}

impl std::fmt::Debug for ConsumerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerHandle")
            .field("stats", &self.stats())
            .field("finished", &self.is_finished())
            .finish()
    }
}

/// Asks a consumer (or an [`App`](super::App)) to stop gracefully; cheap to clone and to send anywhere.
#[derive(Clone, Debug)]
pub struct Shutdown(StopSignal);

impl Shutdown {
    /// Starts the graceful shutdown: receiving stops, in-flight handlers finish within the grace period,
    /// the rest is released to the broker.
    pub fn trigger(&self) {
        self.0.trigger();
    }

    /// Whether shutdown was asked for.
    pub fn is_triggered(&self) -> bool {
        self.0.is_triggered()
    }
}

impl ConsumerHandle {
    pub(super) fn new(
        task: tokio::task::JoinHandle<Result<(), ConsumerError>>,
        shutdown: StopSignal,
        counters: Arc<Counters>,
        health: Arc<HealthState>,
        alive: Vec<Weak<Shared>>,
    ) -> Self {
        Self {
            alive,
            task,
            shutdown,
            counters,
            health,
        }
    }

    /// The consumer's health now: running, held by a blocking error, unable to receive, or stopped
    /// (and why) — what a liveness or readiness probe reports ([`Health::is_live`], [`Health::is_ready`]).
    pub fn health(&self) -> Health {
        self.health.health()
    }

    /// A cheap, cloneable reader of this consumer's health, for a probe endpoint that outlives a
    /// borrow of the handle.
    pub fn health_watch(&self) -> HealthWatch {
        HealthWatch(self.health.clone())
    }

    /// How many receive lanes the consumer runs: one per worker thread of a multi-threaded runtime where
    /// its transport splits its subscription (the in-memory broker does), never more than its
    /// concurrency, and one with per-key ordering, on a current-thread runtime, or where the transport
    /// keeps its subscription whole. Each lane is a receive loop of its own with its share of the
    /// concurrency; [`ConsumerHandle::stats`] sums them.
    pub fn lanes(&self) -> usize {
        self.alive.len()
    }

    /// A snapshot of the consumer's counters, summed over its lanes.
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    /// Waits until `done` holds for the consumer's counters, re-checking each time they change (no
    /// polling); returns the counters that satisfied it. Returns early, with the last counters, if the
    /// consumer stops first.
    ///
    /// ```
    /// # async fn demo(handle: event_retry_core::runtime::ConsumerHandle) {
    /// // Wait until 10 events were acknowledged or dead-lettered.
    /// let stats = handle.wait_until(|s| s.succeeded + s.dead_lettered >= 10).await;
    /// # }
    /// ```
    pub async fn wait_until(&self, mut done: impl FnMut(&Stats) -> bool) -> Stats {
        let mut last = None;
        self.counters
            .wait_for(|| {
                let stats = self.stats();
                let finished = done(&stats) || self.counters.is_stopped();
                last = Some(stats);
                finished
            })
            .await;
        last.unwrap_or_else(|| self.stats())
    }

    /// Whether the consumer has stopped.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// A value that stops this consumer gracefully from anywhere (a signal handler, another task).
    pub fn shutdown_trigger(&self) -> Shutdown {
        Shutdown(self.shutdown.clone())
    }

    /// Stops receiving, lets in-flight handlers finish within the grace period, releases the rest to the
    /// broker, leaves the subscription, and returns how the consumer ended.
    pub async fn shutdown(self) -> Result<(), ConsumerError> {
        self.shutdown.trigger();
        self.await
    }

    /// Stops at once, as a crash would: nothing more is settled, and the broker delivers whatever was in
    /// flight again. For tests of crash safety.
    ///
    /// The tasks the consumer spawned for deliveries are aborted with it, but one running on another
    /// worker thread at that moment finishes the poll it is in — and may end a handler call and settle
    /// its event. So this also waits (at most 30 s) until every task has let go of the consumer's state:
    /// once it returns, nothing of the consumer runs.
    pub async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.alive.iter().any(|lane| lane.strong_count() > 0)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

/// Reads one consumer's health from anywhere ([`ConsumerHandle::health_watch`]).
#[derive(Clone, Debug)]
pub struct HealthWatch(Arc<HealthState>);

impl HealthWatch {
    /// The consumer's health now.
    pub fn health(&self) -> Health {
        self.0.health()
    }
}

impl IntoFuture for ConsumerHandle {
    type Output = Result<(), ConsumerError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.task.await? })
    }
}
