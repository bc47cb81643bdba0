//! The relay's run loop: claiming due rows under a lease, publishing them, recording what the broker
//! said, backing off while the broker is down, sweeping published rows — and the handle that stops it.
//!
//! Separate from the builder because this is the part that runs: everything here happens after the
//! settings were checked, on the relay's own task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::builder::{RelayBuilder, RelayConfig, Retention};
use super::stats::RelayStats;
use crate::classify::{PublishFailure, classify};
use crate::dialect::Dialect;
use crate::error::OutboxError;
use crate::lifecycle::Input;
use crate::metrics;
use crate::row::{OutboxRow, bounded};
use crate::store::Store;
use crate::wake::Wake;
use event_retry_core::producer::Producer;
use event_retry_core::time::Timestamp;

/// The longest `last_error` kept, in bytes.
const MAX_ERROR_BYTES: usize = 1024;

impl RelayBuilder {
    /// Starts the relay on the current tokio runtime.
    pub fn start(self) -> Result<RelayHandle, OutboxError> {
        self.check()?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let stats = Arc::new(Mutex::new(RelayStats::default()));
        let relay = Relay {
            store: self.store,
            wake: self.wake,
            producer: self.producer,
            config: self.config,
            stats: stats.clone(),
            stop: stop_rx,
            claims: AtomicU64::new(0),
        };
        let task = tokio::spawn(relay.run());
        Ok(RelayHandle {
            stop: stop_tx,
            stats,
            task,
        })
    }

    /// Runs the relay until `shutdown` completes, then drains it; returns what it did.
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<RelayStats, OutboxError> {
        let handle = self.start()?;
        shutdown.await;
        handle.shutdown().await
    }
}

/// A running relay.
#[derive(Debug)]
pub struct RelayHandle {
    stop: watch::Sender<bool>,
    stats: Arc<Mutex<RelayStats>>,
    task: JoinHandle<()>,
}

impl RelayHandle {
    /// What the relay has done so far.
    pub fn stats(&self) -> RelayStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops claiming, finishes the batch in hand and records it, then returns what the relay did.
    pub async fn shutdown(self) -> Result<RelayStats, OutboxError> {
        let _ = self.stop.send(true);
        self.task
            .await
            .map_err(|e| OutboxError::Config(format!("the relay task failed: {e}")))?;
        Ok(*self.stats.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A relay's run loop and what it holds while it runs.
struct Relay {
    store: Store,
    wake: Wake,
    producer: Producer,
    config: RelayConfig,
    stats: Arc<Mutex<RelayStats>>,
    stop: watch::Receiver<bool>,
    claims: AtomicU64,
}

/// The relay-wide pause while the broker is down.
#[derive(Debug, Default)]
struct BrokerBackoff {
    failures: u32,
    until: Option<Instant>,
}

impl BrokerBackoff {
    fn trip(&mut self, initial: Duration, max: Duration) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let exp = initial.saturating_mul(1u32 << self.failures.saturating_sub(1).min(16));
        let cap = exp.min(max);
        // Equal jitter: half fixed, half random, so relays that failed together do not retry together.
        let half = cap / 2;
        let pause = half + rand::rng().random_range(Duration::ZERO..=half);
        self.until = Some(Instant::now() + pause);
        pause
    }

    fn reset(&mut self) {
        self.failures = 0;
        self.until = None;
    }

    fn probing(&self) -> bool {
        self.failures > 0
    }
}

/// The outcome of one row's publish.
enum Outcome {
    Published,
    Failed(event_retry_core::error::Error),
    NotStarted,
}

impl Relay {
    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    fn count(&self, f: impl FnOnce(&mut RelayStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|p| p.into_inner()));
    }

    async fn run(mut self) {
        let mut wakes = self.wake.subscribe();
        let mut listener = self.listen().await;
        let mut backoff = BrokerBackoff::default();
        let mut db_trouble = 0u32;
        let mut last_sweep: Option<Instant> = None;
        let mut last_gauges: Option<Instant> = None;
        tracing::info!(relay = %self.config.name, "outbox relay started");
        while !self.stopping() {
            if last_sweep.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                last_sweep = Some(Instant::now());
                self.sweep().await;
            }
            if last_gauges.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                last_gauges = Some(Instant::now());
                if let Ok(counts) = self.store.counts().await {
                    metrics::gauges(&counts, Timestamp::now());
                }
            }
            if let Some(until) = backoff.until.take() {
                tokio::select! {
                    _ = tokio::time::sleep_until(until.into()) => {}
                    _ = stopped(self.stop.clone()) => break,
                }
            }
            let limit = if backoff.probing() {
                1
            } else {
                self.config.batch_size
            };
            let claim = format!(
                "{}-{}",
                self.config.name,
                self.claims.fetch_add(1, Ordering::Relaxed)
            );
            let now = Timestamp::now();
            let claimed = self
                .store
                .claim(
                    &claim,
                    now,
                    now.plus(self.config.lease),
                    limit,
                    self.config.ordered,
                )
                .await;
            let (mut rows, mut unreadable) = match claimed {
                Ok(found) => {
                    db_trouble = 0;
                    found
                }
                Err(e) => {
                    db_trouble = db_trouble.saturating_add(1);
                    let pause = Duration::from_millis(100 << db_trouble.min(5));
                    tracing::warn!(relay = %self.config.name, error = %e, ?pause, "outbox claim failed");
                    self.pause(pause).await;
                    continue;
                }
            };
            rows.retain(|row| match &row.headers_error {
                Some(reason) => {
                    unreadable.push(crate::store::Unreadable {
                        id: row.id,
                        reason: reason.clone(),
                    });
                    false
                }
                None => true,
            });
            for row in &unreadable {
                let reason = format!("the row does not read back: {}", row.reason);
                tracing::error!(relay = %self.config.name, id = row.id, %reason, "outbox row is poison");
                if self
                    .record(|s| {
                        let (claim, reason, id) = (claim.clone(), reason.clone(), row.id);
                        async move {
                            s.fail(&claim, id, Input::Die, now, &reason, Timestamp::now())
                                .await
                        }
                    })
                    .await
                {
                    self.count(|s| s.dead += 1);
                    metrics::dead("(unreadable)");
                }
            }
            if rows.is_empty() {
                if unreadable.is_empty() {
                    self.idle(&mut wakes, &mut listener).await;
                }
                continue;
            }
            self.count(|s| s.batches += 1);
            match self.publish_batch(&claim, rows).await {
                BatchResult::BrokerDown => {
                    let pause = backoff.trip(self.config.backoff_initial, self.config.backoff_max);
                    self.count(|s| s.broker_backoffs += 1);
                    tracing::warn!(relay = %self.config.name, ?pause, "the broker is down; the relay backs off");
                }
                BatchResult::Moved => backoff.reset(),
                BatchResult::Nothing => {}
            }
        }
        tracing::info!(relay = %self.config.name, "outbox relay stopped");
    }

    async fn listen(&self) -> Option<Listener> {
        if !self.config.notifications || self.store.dialect() != Dialect::Postgres {
            return None;
        }
        #[cfg(feature = "postgres")]
        match self.store.db().listen(crate::store::CHANNEL).await? {
            Ok(listener) => Some(listener),
            Err(e) => {
                tracing::warn!(error = %e, "no notification connection (LISTEN); the relay polls");
                None
            }
        }
        #[cfg(not(feature = "postgres"))]
        None
    }

    /// Sleeps until something may be due: a notification, the next row's time, the fallback poll, or
    /// shutdown.
    async fn idle(&mut self, wakes: &mut watch::Receiver<u64>, listener: &mut Option<Listener>) {
        let now = Timestamp::now();
        let mut wait = self.config.poll_interval;
        if let Ok(Some(due)) = self.store.next_due().await {
            // A due row nothing could claim (another relay holds it, or its key's head does) is not a
            // reason to spin: the fallback poll covers it.
            if due > now {
                wait = wait.min(due.since(now) + Duration::from_millis(1));
            }
        }
        let notified = self.config.notifications;
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopped(self.stop.clone()) => {}
            changed = wakes.changed(), if notified => {
                if changed.is_err() {
                    tokio::time::sleep(wait).await;
                }
            }
            got = recv(listener) => {
                if got.is_err() {
                    // The notification connection broke: poll until it is back.
                    *listener = None;
                    *listener = self.listen().await;
                }
            }
        }
    }

    async fn pause(&self, pause: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stopped(self.stop.clone()) => {}
        }
    }

    /// Runs a store write, retried while the claim's lease lasts (a database restart mid-batch must not
    /// turn published rows into duplicates); false if it never went through.
    async fn record<F, Fut, T>(&self, write: F) -> bool
    where
        F: Fn(Store) -> Fut,
        Fut: std::future::Future<Output = Result<T, OutboxError>>,
    {
        let deadline = Instant::now() + self.config.lease;
        let mut pause = Duration::from_millis(100);
        loop {
            match write(self.store.clone()).await {
                Ok(_) => return true,
                Err(e) if Instant::now() + pause < deadline => {
                    tracing::warn!(relay = %self.config.name, error = %e, "recording an outcome failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::error!(relay = %self.config.name, error = %e, "recording an outcome failed; the lease will return the rows");
                    return false;
                }
            }
        }
    }

    async fn publish_batch(&self, claim: &str, rows: Vec<OutboxRow>) -> BatchResult {
        let started = Instant::now();
        // A publish starts only while the lease still covers it whole.
        let last_start = started
            + self
                .config
                .lease
                .saturating_sub(self.config.publish_timeout);
        let timeout = self.config.publish_timeout;
        let producer = &self.producer;
        let outcomes: Vec<(OutboxRow, Outcome)> = futures::stream::iter(rows)
            .map(|row| async move {
                if Instant::now() >= last_start {
                    return (row, Outcome::NotStarted);
                }
                let sent = tokio::time::timeout(timeout, producer.publish(&row.topic, row.event()));
                let outcome = match sent.await {
                    Ok(Ok(_)) => Outcome::Published,
                    Ok(Err(e)) => Outcome::Failed(e),
                    Err(_) => Outcome::Failed(
                        event_retry_core::error::Error::new(
                            event_retry_core::error::Kind::Timeout,
                            format!("the broker did not confirm within {timeout:?}"),
                        )
                        .with_operation(format!("publish to {}", row.topic)),
                    ),
                };
                (row, outcome)
            })
            .buffer_unordered(self.config.in_flight)
            .collect()
            .await;

        let now = Timestamp::now();
        let mut published = Vec::new();
        let mut not_started = Vec::new();
        let mut broker_down = false;
        let mut moved = false;
        for (row, outcome) in outcomes {
            match outcome {
                Outcome::Published => published.push(row),
                Outcome::NotStarted => not_started.push(row.id),
                Outcome::Failed(error) => {
                    let failure = classify(&error);
                    broker_down |= failure == PublishFailure::BrokerDown;
                    self.failed(claim, &row, &error, failure, now).await;
                    moved |= failure != PublishFailure::BrokerDown;
                }
            }
        }
        if !published.is_empty() {
            moved = true;
            let ids: Vec<i64> = published.iter().map(|r| r.id).collect();
            let keep = matches!(self.config.retention, Retention::Keep(_));
            let confirmed = Arc::new(AtomicU64::new(0));
            let recorded = {
                let claim = claim.to_string();
                let confirmed = confirmed.clone();
                self.record(move |s| {
                    let (claim, ids, confirmed) = (claim.clone(), ids.clone(), confirmed.clone());
                    async move {
                        let n = s.confirm(&claim, &ids, now, keep).await?;
                        confirmed.store(n, Ordering::Relaxed);
                        Ok(())
                    }
                })
                .await
            };
            if recorded {
                let n = confirmed.load(Ordering::Relaxed);
                let lost = (published.len() as u64).saturating_sub(n);
                self.count(|s| {
                    s.published += n;
                    s.lease_lost += lost;
                });
                if lost > 0 {
                    tracing::warn!(relay = %self.config.name, lost, "rows published after their lease passed to another claim: duplicates");
                }
                for row in &published {
                    metrics::published(&row.topic, now.since(row.created_at));
                }
                if self.config.ordered {
                    // The next row of each key is claimable now.
                    self.wake.bump();
                    if self.store.dialect() == Dialect::Postgres {
                        let _ = self.store.notify().await;
                    }
                }
            }
        }
        if !not_started.is_empty() {
            let n = not_started.len() as u64;
            let ids = not_started;
            if self
                .record(|s| {
                    let ids = ids.clone();
                    let claim = claim.to_string();
                    async move { s.release(&claim, &ids).await }
                })
                .await
            {
                self.count(|s| s.released += n);
            }
        }
        if broker_down && published.is_empty() {
            BatchResult::BrokerDown
        } else if moved {
            BatchResult::Moved
        } else {
            BatchResult::Nothing
        }
    }

    async fn failed(
        &self,
        claim: &str,
        row: &OutboxRow,
        error: &event_retry_core::error::Error,
        failure: PublishFailure,
        now: Timestamp,
    ) {
        let attempts = row.attempts.saturating_add(1);
        let (input, available_at, text) = match failure {
            PublishFailure::Permanent => (Input::Die, now, format!("permanent: {error}")),
            PublishFailure::BrokerDown | PublishFailure::Retry => {
                match self
                    .config
                    .policy
                    .delay(row.attempts, None, &mut rand::rng())
                {
                    Some(delay) => (Input::Retry, now.plus(delay), error.to_string()),
                    None => (
                        Input::Die,
                        now,
                        format!(
                            "retry policy {} spent after {attempts} attempts: {error}",
                            self.config.policy
                        ),
                    ),
                }
            }
        };
        let text = bounded(&text, MAX_ERROR_BYTES);
        tracing::debug!(relay = %self.config.name, id = row.id, error = %text, "publish failed");
        metrics::failed_attempt(&row.topic, failure.as_str());
        let written = self
            .record(|s| {
                let (claim, text) = (claim.to_string(), text.clone());
                let id = row.id;
                async move { s.fail(&claim, id, input, available_at, &text, now).await }
            })
            .await;
        if written {
            if input == Input::Die {
                self.count(|s| s.dead += 1);
                metrics::dead(&row.topic);
            } else {
                self.count(|s| s.retried += 1);
            }
        }
    }

    async fn sweep(&self) {
        let Retention::Keep(keep) = self.config.retention else {
            return;
        };
        let before = Timestamp::now().minus(keep);
        loop {
            match self.store.sweep_published(before, 1000).await {
                Ok(n) if n >= 1000 => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "deleting old published rows failed");
                    break;
                }
            }
        }
    }
}

enum BatchResult {
    /// Rows were published or settled for good: the broker is up.
    Moved,
    /// Every attempt met a broker-down failure.
    BrokerDown,
    /// Nothing happened (all released).
    Nothing,
}

/// Completes when shutdown is asked for.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// PostgreSQL's notification connection (none without the `postgres` feature).
#[cfg(feature = "postgres")]
type Listener = sqlx::postgres::PgListener;
/// PostgreSQL's notification connection (none without the `postgres` feature).
#[cfg(not(feature = "postgres"))]
type Listener = std::convert::Infallible;

async fn recv(listener: &mut Option<Listener>) -> Result<(), ()> {
    match listener {
        #[cfg(feature = "postgres")]
        Some(l) => match l.try_recv().await {
            Ok(Some(_)) => Ok(()),
            Ok(None) | Err(_) => Err(()),
        },
        #[cfg(not(feature = "postgres"))]
        Some(never) => match *never {},
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn broker_backoff_grows_to_its_cap_and_resets() {
        let mut b = BrokerBackoff::default();
        assert!(!b.probing());
        let initial = Duration::from_millis(100);
        let max = Duration::from_millis(400);
        let pauses: Vec<Duration> = (0..5).map(|_| b.trip(initial, max)).collect();
        assert!(b.probing());
        for (i, p) in pauses.iter().enumerate() {
            let cap = (initial * (1 << i)).min(max);
            assert!(
                *p >= cap / 2 && *p <= cap,
                "pause {i}: {p:?} not in [{:?}, {cap:?}]",
                cap / 2
            );
        }
        b.reset();
        assert!(!b.probing() && b.until.is_none());
    }
}
