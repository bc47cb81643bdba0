//! The lateness part: retries due over a minute, each measured against its due time.

use std::sync::Arc;
use std::time::Duration;

use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{Context, handler_fn};
use event_retry_core::time::Timestamp;

use super::{Error, tidy};

/// The nearest-rank `p`th percentile of `sorted` (ascending, not empty).
pub fn percentile(sorted: &[i64], p: usize) -> i64 {
    sorted[(sorted.len() * p).div_ceil(100).clamp(1, sorted.len()) - 1]
}

/// The lateness part: `retries` events fail once and retry after delays spread uniformly over
/// 1.2–59.8 s; lateness is the retry's start minus its due time (wall clock). Prints p50, p99 and max
/// with `describe` (how the broker delays); an early retry, or retries not done within `deadline`, fail.
pub async fn lateness(
    broker: &Broker,
    topic: &str,
    retries: usize,
    deadline: Duration,
    describe: &str,
) -> Result<(), Error> {
    let late_ms: Arc<std::sync::Mutex<Vec<i64>>> = Arc::default();
    let record = late_ms.clone();
    let handler = handler_fn(move |_event: Event, ctx: Context| {
        let record = record.clone();
        async move {
            if ctx.attempt == 1 {
                return Err(HandlerError::deferred("fail once"));
            }
            if let Some(due) = ctx.due_at {
                let now = Timestamp::now().as_millis() as i64;
                record
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(now - due.as_millis() as i64);
            }
            Ok(())
        }
    });
    // Uniform delays over [1.2 s, 59.8 s].
    let consumer = broker
        .consumer(topic)
        .policy(RetryPolicy::parse("30500ms x1; jitter=±96%")?)
        .concurrency(32)
        .start(handler)
        .await?;
    let producer = broker.producer();
    for i in 0..retries {
        let id = format!("late-{i}");
        producer
            .publish(topic, Event::new(id.clone()).with_id(id))
            .await?;
    }
    let finished = tokio::time::timeout(
        deadline,
        consumer.wait_until(|s| s.succeeded_after_retry >= retries as u64),
    )
    .await;
    if finished.is_err() {
        return Err(format!("retries did not finish: {:?}", consumer.stats()).into());
    }
    consumer.shutdown().await?;
    tidy(broker.admin(), topic).await;
    let mut late = late_ms.lock().unwrap_or_else(|p| p.into_inner()).clone();
    late.sort_unstable();
    let Some(&max) = late.last() else {
        return Err("no retry was measured".into());
    };
    let early = late.iter().filter(|&&l| l < 0).count();
    let pct = |p: usize| late[(late.len() * p / 100).min(late.len() - 1)];
    println!(
        "retry lateness over {} retries with delays of 1.2-59.8 s ({describe}): p50 {} ms, p99 {} ms, max {max} ms, early {early}",
        late.len(),
        pct(50),
        pct(99),
    );
    if early > 0 {
        return Err(format!("{early} retries ran before their due time").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(
            (percentile(&v, 50), percentile(&v, 99), percentile(&v, 100)),
            (50, 99, 100)
        );
        assert_eq!(
            (percentile(&[-5, 10], 50), percentile(&[-5, 10], 99)),
            (-5, 10)
        );
        assert_eq!(percentile(&[7], 0), 7);
    }
}
