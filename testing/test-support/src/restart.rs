//! The broker-restart test the adapters share: retries waiting in the broker survive a restart of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{Context, Stats, handler_fn};

/// How long the test waits, for a broker's own pace.
#[derive(Clone, Copy, Debug)]
pub struct Waits {
    /// For every event's first failure to be scheduled for retry.
    pub scheduled: Duration,
    /// After the retries are due, for all of them to have run.
    pub after_due: Duration,
}

/// `events` events on `topic` fail once and retry after `delay`. While the retries wait in the broker,
/// `scripts/brokers restart <broker>` stops and starts it on the same data; afterwards every event must
/// have run exactly twice, its retry no earlier than `delay` after its failure. Returns the consumer's
/// statistics (taken before it shuts down), for checks of the broker's own.
pub async fn delayed_retries_survive_restart(
    under_test: &Broker,
    broker: &str,
    topic: &str,
    events: usize,
    delay: Duration,
    waits: Waits,
) -> Result<Stats, String> {
    let calls: Arc<Mutex<HashMap<String, Vec<Instant>>>> = Arc::default();
    let seen = calls.clone();
    let handler = handler_fn(move |event: Event, _ctx: Context| {
        let seen = seen.clone();
        async move {
            let id = event.id().unwrap_or_default().to_string();
            let mut calls = seen.lock().unwrap_or_else(|p| p.into_inner());
            let mine = calls.entry(id).or_default();
            mine.push(Instant::now());
            if mine.len() == 1 {
                Err(HandlerError::deferred("first try fails"))
            } else {
                Ok(())
            }
        }
    });
    let policy =
        RetryPolicy::parse(&format!("{}ms x1", delay.as_millis())).map_err(|e| e.to_string())?;
    let consumer = under_test
        .consumer(topic)
        .policy(policy)
        .concurrency(8)
        .start(handler)
        .await
        .map_err(|e| e.to_string())?;
    let producer = under_test.producer();
    for i in 0..events {
        let id = format!("e{i:02}");
        producer
            .publish(topic, Event::new(id.clone()).with_id(id))
            .await
            .map_err(|e| e.to_string())?;
    }
    let scheduled = tokio::time::timeout(
        waits.scheduled,
        consumer.wait_until(|s| s.retries_scheduled >= events as u64),
    )
    .await;
    if scheduled.is_err() {
        return Err(format!("retries not scheduled: {:?}", consumer.stats()));
    }
    let restarted_at = Instant::now();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/brokers");
    let out = tokio::process::Command::new("bash")
        .args([script, "restart", broker])
        .output()
        .await
        .map_err(|e| format!("run {script}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/brokers restart {broker} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    eprintln!(
        "{broker} restarted in {:?}; the retries are due {delay:?} after their failures",
        restarted_at.elapsed()
    );
    let deadline = Instant::now() + delay + waits.after_due;
    loop {
        let done = calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|c| c.len() >= 2)
            .count();
        if done == events {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{done} of {events} retries ran after the restart: {:?}",
                consumer.stats()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let any duplicate show up before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (id, at) in &calls {
        if at.len() != 2 {
            return Err(format!("{id} was handled {} times, want 2", at.len()));
        }
        let gap = at[1] - at[0];
        if gap < delay {
            return Err(format!(
                "{id}: the retry ran after {gap:?}, before its delay"
            ));
        }
    }
    let stats = consumer.stats();
    consumer.shutdown().await.map_err(|e| e.to_string())?;
    Ok(stats)
}
