//! What the scenarios share: the consumer every scenario starts from, publishing, reading the DLQ, and
//! the never-early check.

use std::sync::Arc;
use std::time::Duration;

use event_retry_core::classify::HandlerError;
use event_retry_core::dlq::{DeadLetter, DlqFilter};
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{
    BatchHandler, BatchItem, ConsumerBuilder, ConsumerHandle, Handler,
};

use crate::fixture::Fixture;
use crate::probe::{Act, Probe, ensure, percentile};

pub(super) fn unit(f: &Arc<Fixture>) -> Duration {
    f.delay_unit()
}

/// How long a scenario waits for something that should happen within `units` delay units.
pub(super) fn patience(f: &Arc<Fixture>, units: u32) -> Duration {
    unit(f) * units + Duration::from_secs(15)
}

pub(super) fn policy(text: &str) -> RetryPolicy {
    RetryPolicy::parse(text).unwrap_or_else(|e| unreachable!("scenario policy {text}: {e}"))
}

pub(super) fn ms(d: Duration) -> u128 {
    d.as_millis()
}

pub(super) fn builder(f: &Arc<Fixture>, topic: &str, name: &str) -> ConsumerBuilder {
    f.broker()
        .consumer(topic)
        .name(name)
        .seed(7)
        .in_place(policy("1ms x1"))
        .blocking(policy(&format!(
            "exp({}ms, {}ms, 2)",
            ms(unit(f)),
            ms(unit(f) * 4)
        )))
        .settle_backoff(unit(f) * 2)
}

/// Starts the consumer `b` builds with `probe`'s handler — or, on a fixture that says so, with a batch
/// handler running it on each event of a batch ([`Fixture::with_batch_handler`]).
pub(super) async fn start(
    f: &Arc<Fixture>,
    b: ConsumerBuilder,
    probe: &Arc<Probe>,
) -> Result<ConsumerHandle, String> {
    start_with(f, b, probe.handler()).await
}

/// Starts the consumer `b` builds with `handler`, or with `handler` run on each event of a batch on a
/// fixture that says so.
pub(super) async fn start_with(
    f: &Arc<Fixture>,
    b: ConsumerBuilder,
    handler: impl Handler,
) -> Result<ConsumerHandle, String> {
    let consumer = b.build().map_err(|e| e.to_string())?;
    let started = if f.batch_handler() {
        consumer.start_batch(EachInBatch(handler)).await
    } else {
        consumer.start(handler).await
    };
    started.map_err(|e| e.to_string())
}

/// A per-event handler run on every event of a batch, concurrently, one result each.
struct EachInBatch<H>(H);

#[async_trait::async_trait]
impl<H: Handler> BatchHandler for EachInBatch<H> {
    async fn handle_batch(&self, batch: &[BatchItem<'_>]) -> Vec<Result<(), HandlerError>> {
        futures::future::join_all(
            batch
                .iter()
                .map(|item| self.0.handle(item.event, &item.ctx)),
        )
        .await
    }
}

pub(super) async fn publish(f: &Arc<Fixture>, topic: &str, event: Event) -> Result<(), String> {
    f.broker()
        .producer()
        .publish(topic, event)
        .await
        .map(drop)
        .map_err(|e| format!("publish to {topic}: {e}"))
}

/// Publishes through the adapter contract, bypassing the producer's checks: for messages no producer may
/// send (metadata headers that are malformed on purpose).
pub(super) async fn publish_raw(f: &Arc<Fixture>, topic: &str, event: Event) -> Result<(), String> {
    f.broker()
        .transport()
        .publish(topic, &event)
        .await
        .map(drop)
        .map_err(|e| format!("publish to {topic}: {e}"))
}

pub(super) async fn publish_ids(f: &Arc<Fixture>, topic: &str, ids: &[&str]) -> Result<(), String> {
    for id in ids {
        publish(f, topic, Event::new(id.to_string()).with_id(*id)).await?;
    }
    Ok(())
}

pub(super) async fn dlq(f: &Arc<Fixture>, topic: &str) -> Result<Vec<DeadLetter>, String> {
    f.broker()
        .dead_letters()
        .list(topic, &DlqFilter::all())
        .await
        .map_err(|e| format!("list DLQ of {topic}: {e}"))
}

/// Replays every entry of `topic`'s DLQ and checks that `n` were replayed.
pub(super) async fn replay_all(f: &Arc<Fixture>, topic: &str, n: usize) -> Result<(), String> {
    let report = f
        .broker()
        .dead_letters()
        .replay(topic, &DlqFilter::all())
        .await
        .map_err(|e| format!("replay: {e}"))?;
    ensure(report.replayed == n, || {
        format!("replayed {} entries, want {n}", report.replayed)
    })
}

pub(super) async fn wait_dlq(
    f: &Arc<Fixture>,
    topic: &str,
    n: usize,
    timeout: Duration,
) -> Result<Vec<DeadLetter>, String> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let entries = dlq(f, topic).await?;
        if entries.len() >= n {
            return Ok(entries);
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "timed out after {timeout:?} waiting for {n} DLQ entries (have {})",
                entries.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) fn deferred(msg: &str) -> Act {
    Act::Fail(HandlerError::deferred(msg.to_string()))
}

pub(super) async fn finish(
    f: &Arc<Fixture>,
    topic: &str,
    handles: Vec<ConsumerHandle>,
) -> Result<(), String> {
    for h in handles {
        h.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
    }
    f.cleanup(topic).await;
    Ok(())
}

pub(super) fn lateness_note(late: &mut [Duration]) -> String {
    late.sort();
    format!(
        "lateness p50 {} ms, p99 {} ms (n={})",
        ms(percentile(late, 50)),
        ms(percentile(late, 99)),
        late.len()
    )
}

/// Every retry in `calls` that went through the broker (a new due time) carries the delay the policy
/// gives it, `want`: "never early" is measured against the policy, not only against what the SDK
/// recorded. Returns how many such retries there were.
pub(super) fn check_policy_delays(
    calls: &[crate::probe::Call],
    want: Duration,
) -> Result<usize, String> {
    let mut scheduled = 0;
    for pair in calls.windows(2) {
        let (prev, next) = (&pair[0], &pair[1]);
        if next.due_at == prev.due_at {
            continue;
        }
        scheduled += 1;
        ensure(next.last_delay == Some(want), || {
            format!(
                "retry of {} (attempt {}) recorded the delay {:?}, the policy's is {} ms",
                next.id,
                next.attempt,
                next.last_delay,
                ms(want)
            )
        })?;
    }
    Ok(scheduled)
}

/// Checks that every retry call of `calls` started no earlier than its delay after the previous call
/// returned (monotonic clock), and not before its recorded due time (wall clock); returns how late each was.
pub(super) fn check_never_early(calls: &[crate::probe::Call]) -> Result<Vec<Duration>, String> {
    let mut late = Vec::new();
    for pair in calls.windows(2) {
        let (prev, next) = (&pair[0], &pair[1]);
        // Only a new delivery scheduled through the broker has a delay to honour (an in-place retry keeps
        // the delivery's due time).
        let Some(delay) = next.last_delay.filter(|_| next.due_at != prev.due_at) else {
            continue;
        };
        let failed_at = prev.ended.unwrap_or(prev.at);
        let gap = next.at.saturating_duration_since(failed_at);
        ensure(gap >= delay, || {
            format!(
                "retry of {} ran {} ms after the failure, before its delay of {} ms",
                next.id,
                ms(gap),
                ms(delay)
            )
        })?;
        if let Some(due) = next.due_at {
            ensure(next.wall >= due, || {
                format!(
                    "retry of {} ran at {} before its due time {}",
                    next.id, next.wall, due
                )
            })?;
        }
        late.push(gap - delay);
    }
    Ok(late)
}

/// Reads, with the broker's own view, how many messages of `topic` the broker holds for `group` until
/// `enough` says so or `within` passed; returns the last count, `Err` with it when time ran out.
pub(super) async fn wait_held(
    inspect: &dyn crate::fixture::Inspect,
    topic: &str,
    group: &str,
    within: Duration,
    enough: impl Fn(u64) -> bool,
) -> Result<Result<u64, u64>, String> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let held = inspect
            .held_in_source(topic, group)
            .await
            .map_err(|e| format!("read the broker's view: {e}"))?;
        if enough(held) {
            return Ok(Ok(held));
        }
        if std::time::Instant::now() > deadline {
            return Ok(Err(held));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
