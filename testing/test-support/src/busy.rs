//! The busy part of an adapter's bench: does a due retry run on time while a backlog of healthy events
//! waits in the same topic?
//!
//! After an outage a topic's backlog can last hours; a user who wrote "1s" still expects the retry about
//! a second later. The part publishes [`RETRIES`] events that fail once under `1s x2`, then a backlog of
//! healthy events (`RETRY_BENCH_BUSY`, 50,000 by default; each handled in a millisecond of waiting, as
//! for I/O) behind them, and only then starts the consumer
//! (defaults but the policy): it fails the retrying events first, and their retries fall due while the
//! healthy backlog is being consumed. Each retry's lateness is its second attempt's start minus its due
//! time; the report also counts the retries that ran before the last healthy event — a consumer that
//! gives the retry route no share while the source has records runs none of them before the backlog
//! drains. A first round without the backlog gives the idle lateness the busy one is compared with
//! (`ratio backlog/idle retry lateness p99 <broker>`).
//!
//! [`a_due_retry_overtakes_the_backlog`] is the same question asked as a broker test: it counts where
//! each retry ran in the backlog instead of timing it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{Context, handler_fn};
use event_retry_core::time::Timestamp;
use futures::{StreamExt, TryStreamExt};

use crate::bench::{Error, count_from_env, percentile};

/// Events that fail once and retry after 1 s.
pub const RETRIES: usize = 300;
/// Healthy events behind them when `RETRY_BENCH_BUSY` is unset.
const BACKLOG: usize = 50_000;
/// What a healthy event's handler waits (its I/O).
const HEALTHY_WORK: Duration = Duration::from_millis(1);

/// What the handler saw: each retry's lateness (ms) and start, and when the last healthy event ran.
#[derive(Default)]
struct Seen {
    late_ms: Vec<i64>,
    retry_starts: Vec<u64>,
    last_healthy: u64,
}

/// Runs the part on `topic` (fresh): a round without a backlog, then one with it; prints each round's
/// retry lateness, how many retries ran before the backlog drained, and the ratio of the two rounds' p99
/// (`ratio backlog/idle retry lateness p99 <name>: …`). `describe` says how the broker delays.
pub async fn run(broker: &Broker, topic: &str, name: &str, describe: &str) -> Result<(), Error> {
    let backlog = count_from_env("RETRY_BENCH_BUSY", BACKLOG, 1)?;
    let idle = round(broker, &format!("{topic}-idle"), 0).await?;
    println!(
        "busy {name}: retry lateness without a backlog ({describe}): p50 {} ms, p99 {} ms, max {} ms",
        idle.p(50),
        idle.p(99),
        idle.max(),
    );
    let busy = round(broker, topic, backlog).await?;
    println!(
        "busy {name}: retry lateness under a backlog of {backlog} healthy events ({describe}): p50 {} ms, p99 {} ms, max {} ms; {} of {RETRIES} retries ran before the backlog drained ({:.1} s after the consumer started)",
        busy.p(50),
        busy.p(99),
        busy.max(),
        busy.before_drain,
        busy.drained_after_ms as f64 / 1000.0,
    );
    // A p99 of 0 ms (a retry exactly on time) counts as 1 ms: the ratio stays finite.
    println!(
        "ratio backlog/idle retry lateness p99 {name}: {:.2}",
        busy.p(99).max(1) as f64 / idle.p(99).max(1) as f64
    );
    Ok(())
}

/// Publishes `retrying` events `r-0`, `r-1`, … one by one (the handlers fail them once), then `healthy`
/// events `h-0`, `h-1`, … behind them, 256 at a time.
pub async fn publish_retrying_then_healthy(
    broker: &Broker,
    topic: &str,
    retrying: usize,
    healthy: usize,
) -> Result<(), event_retry_core::error::Error> {
    let producer = broker.producer();
    for i in 0..retrying {
        let id = format!("r-{i}");
        producer
            .publish(topic, Event::new(id.clone()).with_id(id))
            .await?;
    }
    let producer = &producer;
    futures::stream::iter(0..healthy)
        .map(|i| async move {
            producer
                .publish(topic, Event::new("h").with_id(format!("h-{i}")))
                .await
                .map(drop)
        })
        .buffer_unordered(256)
        .try_collect::<Vec<()>>()
        .await
        .map(drop)
}

/// One round's figures.
struct Round {
    /// Each retry's lateness in ms, sorted.
    late: Vec<i64>,
    /// Retries that ran before the last healthy event.
    before_drain: usize,
    /// When the last healthy event ran, after the consumer started.
    drained_after_ms: u64,
}

impl Round {
    fn p(&self, q: usize) -> i64 {
        percentile(&self.late, q)
    }

    fn max(&self) -> i64 {
        self.late.last().copied().unwrap_or_default()
    }
}

/// [`RETRIES`] events failing once, then `backlog` healthy events, consumed with defaults on `topic`.
async fn round(broker: &Broker, topic: &str, backlog: usize) -> Result<Round, Error> {
    broker
        .admin()
        .declare(
            topic,
            Some(&event_retry_core::adapter::default_group(topic)),
        )
        .await?;
    publish_retrying_then_healthy(broker, topic, RETRIES, backlog).await?;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let record = seen.clone();
    let handler = handler_fn(move |event: Event, ctx: Context| {
        let record = record.clone();
        async move {
            let now = Timestamp::now().as_millis();
            let retrying = event.id().is_some_and(|id| id.starts_with("r-"));
            let mut seen = record.lock().unwrap_or_else(|p| p.into_inner());
            if !retrying {
                drop(seen);
                // A millisecond of I/O per event, as a handler that writes somewhere spends: the
                // backlog then lasts seconds, past the retries' due time.
                tokio::time::sleep(HEALTHY_WORK).await;
                let mut seen = record.lock().unwrap_or_else(|p| p.into_inner());
                seen.last_healthy = seen.last_healthy.max(Timestamp::now().as_millis());
                return Ok(());
            }
            if ctx.attempt == 1 {
                return Err(HandlerError::deferred("fails once"));
            }
            if let Some(due) = ctx.due_at {
                seen.late_ms.push(now as i64 - due.as_millis() as i64);
                seen.retry_starts.push(now);
            }
            Ok(())
        }
    });
    let started = Timestamp::now().as_millis();
    let consumer = broker
        .consumer(topic)
        .policy(RetryPolicy::parse("1s x2")?)
        .start(handler)
        .await?;
    let finished = tokio::time::timeout(
        Duration::from_secs(600),
        consumer.wait_until(|s| {
            s.succeeded_after_retry >= RETRIES as u64 && s.succeeded >= (RETRIES + backlog) as u64
        }),
    )
    .await;
    if finished.is_err() {
        return Err(format!(
            "busy: not every event finished within 600 s: {:?}",
            consumer.stats()
        )
        .into());
    }
    let stats = consumer.stats();
    consumer.shutdown().await?;
    let (mut late, retry_starts, last_healthy) = {
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        (
            seen.late_ms.clone(),
            seen.retry_starts.clone(),
            seen.last_healthy,
        )
    };
    late.sort_unstable();
    if late.len() != RETRIES {
        return Err(format!(
            "busy: {} retries measured, want {RETRIES}; consumer {stats:?}",
            late.len()
        )
        .into());
    }
    let early = late.iter().filter(|&&l| l < 0).count();
    if early > 0 {
        return Err(format!("busy: {early} retries ran before their due time").into());
    }
    crate::bench::tidy(broker.admin(), topic).await;
    Ok(Round {
        late,
        before_drain: retry_starts.iter().filter(|&&t| t < last_healthy).count(),
        drained_after_ms: last_healthy.saturating_sub(started),
    })
}

/// Events that fail once in [`overtaking_retries`].
pub const OVERTAKING: usize = 20;
/// Healthy events behind them.
pub const OVERTAKEN: usize = 3_000;
/// How many handler calls run at once there (the consumer's default, pinned).
pub const OVERTAKING_CONCURRENCY: usize = 16;
/// What a healthy event's handler waits there: 16 at a time, the backlog lasts about 3.75 s, three
/// times the retries' delay.
pub const OVERTAKEN_WORK: Duration = Duration::from_millis(20);

/// One retry's second attempt in [`overtaking_retries`].
#[derive(Clone, Debug)]
pub struct Overtaking {
    /// The event's id (`r-<n>`).
    pub id: String,
    /// How late the attempt started, in ms (negative if early); `None` if it was told no due time.
    pub late_ms: Option<i64>,
    /// The healthy events done when it started.
    pub healthy_done: usize,
}

/// The scenario of the broker checks of a due retry under a backlog: [`OVERTAKING`] events fail once
/// under `1s x2`, [`OVERTAKEN`] healthy events ([`OVERTAKEN_WORK`] each) wait behind them, and the
/// consumer starts with its defaults but [`OVERTAKING_CONCURRENCY`]. Returns each retry's second attempt,
/// the least late first; an error unless every event finished within 120 s and each retry ran once
/// (no fault is injected). Declares `topic`, and leaves its deletion to the caller.
pub async fn overtaking_retries(broker: &Broker, topic: &str) -> Result<Vec<Overtaking>, String> {
    broker
        .admin()
        .declare(
            topic,
            Some(&event_retry_core::adapter::default_group(topic)),
        )
        .await
        .map_err(|e| e.to_string())?;
    publish_retrying_then_healthy(broker, topic, OVERTAKING, OVERTAKEN)
        .await
        .map_err(|e| e.to_string())?;
    let healthy_done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen: Arc<Mutex<Vec<Overtaking>>> = Arc::default();
    let (done, record) = (healthy_done.clone(), seen.clone());
    let handler = handler_fn(move |event: Event, ctx: Context| {
        let (done, record) = (done.clone(), record.clone());
        async move {
            let id = event.id().unwrap_or_default().to_string();
            if !id.starts_with("r-") {
                tokio::time::sleep(OVERTAKEN_WORK).await;
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                return Ok(());
            }
            if ctx.attempt == 1 {
                return Err(HandlerError::deferred("fails once"));
            }
            let now = Timestamp::now().as_millis() as i64;
            let healthy_done = done.load(std::sync::atomic::Ordering::SeqCst);
            record
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Overtaking {
                    id,
                    late_ms: ctx.due_at.map(|due| now - due.as_millis() as i64),
                    healthy_done,
                });
            Ok(())
        }
    });
    let consumer = broker
        .consumer(topic)
        .policy(RetryPolicy::parse("1s x2").map_err(|e| e.to_string())?)
        .concurrency(OVERTAKING_CONCURRENCY)
        .start(handler)
        .await
        .map_err(|e| e.to_string())?;
    let finished = tokio::time::timeout(
        Duration::from_secs(120),
        consumer.wait_until(|s| {
            s.succeeded_after_retry >= OVERTAKING as u64
                && s.succeeded >= (OVERTAKING + OVERTAKEN) as u64
        }),
    )
    .await;
    let stats = consumer.stats();
    consumer.shutdown().await.map_err(|e| e.to_string())?;
    if finished.is_err() {
        return Err(format!("not every event finished within 120 s: {stats:?}"));
    }
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    seen.sort_by_key(|s| s.late_ms);
    let mut retried: Vec<&str> = seen.iter().map(|s| s.id.as_str()).collect();
    retried.sort_unstable();
    if retried.len() != OVERTAKING {
        return Err(format!(
            "{} retries ran for {OVERTAKING} events that fail once (no fault was injected, so each \
             runs once): {retried:?}; consumer {stats:?}",
            retried.len()
        ));
    }
    Ok(seen)
}

/// A broker test (not a bench: it counts, it does not time), over [`overtaking_retries`]: a due retry
/// must run while the backlog is still being consumed — each retry's second attempt sees fewer than
/// three quarters of the healthy events done — and never before its due time. A retry that came back
/// behind the backlog (the tail of the source queue, or a retry route read only when the source has
/// nothing) sees all of them done and fails the check.
pub async fn a_due_retry_overtakes_the_backlog(broker: &Broker, topic: &str) -> Result<(), String> {
    let seen = overtaking_retries(broker, topic).await?;
    let untold: Vec<&str> = seen
        .iter()
        .filter(|s| s.late_ms.is_none())
        .map(|s| s.id.as_str())
        .collect();
    if !untold.is_empty() {
        return Err(format!(
            "retries told no due time, so none can be checked for running early: {untold:?}"
        ));
    }
    let early: Vec<&str> = seen
        .iter()
        .filter(|s| s.late_ms.is_some_and(|late| late < 0))
        .map(|s| s.id.as_str())
        .collect();
    if !early.is_empty() {
        return Err(format!("retries ran before their due time: {early:?}"));
    }
    let bound = OVERTAKEN * 3 / 4;
    let behind: Vec<(&str, usize)> = seen
        .iter()
        .filter(|s| s.healthy_done >= bound)
        .map(|s| (s.id.as_str(), s.healthy_done))
        .collect();
    if !behind.is_empty() {
        return Err(format!(
            "{} of {OVERTAKING} retries waited behind the backlog: each ran after {bound} or more of the \
             {OVERTAKEN} healthy events behind it were done (id, healthy events done): {behind:?}",
            behind.len()
        ));
    }
    crate::bench::tidy(broker.admin(), topic).await;
    Ok(())
}
