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
//! drains.

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

/// Runs the part on `topic` (fresh) and prints the lateness of the retries under the backlog and how
/// many ran before it drained. `describe` says how the broker delays.
pub async fn run(broker: &Broker, topic: &str, name: &str, describe: &str) -> Result<(), Error> {
    let backlog = count_from_env("RETRY_BENCH_BUSY", BACKLOG, 1)?;
    broker
        .admin()
        .declare(
            topic,
            Some(&event_retry_core::adapter::default_group(topic)),
        )
        .await?;
    let producer = broker.producer();
    for i in 0..RETRIES {
        let id = format!("r-{i}");
        producer
            .publish(topic, Event::new(id.clone()).with_id(id))
            .await?;
    }
    let producer = &producer;
    futures::stream::iter(0..backlog)
        .map(|i| async move {
            producer
                .publish(topic, Event::new("h").with_id(format!("h-{i}")))
                .await
                .map(drop)
        })
        .buffer_unordered(256)
        .try_collect::<Vec<()>>()
        .await?;
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
        return Err(format!("busy: {} retries measured, want {RETRIES}", late.len()).into());
    }
    let before_drain = retry_starts.iter().filter(|&&t| t < last_healthy).count();
    let early = late.iter().filter(|&&l| l < 0).count();
    println!(
        "busy {name}: retry lateness under a backlog of {backlog} healthy events ({describe}): p50 {} ms, p99 {} ms, max {} ms; {before_drain} of {RETRIES} retries ran before the backlog drained ({:.1} s after the consumer started); early {early}",
        percentile(&late, 50),
        percentile(&late, 99),
        late[late.len() - 1],
        last_healthy.saturating_sub(started) as f64 / 1000.0,
    );
    if early > 0 {
        return Err(format!("busy: {early} retries ran before their due time").into());
    }
    broker.admin().delete(topic).await.ok();
    Ok(())
}
