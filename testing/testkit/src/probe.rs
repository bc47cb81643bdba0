//! A scripted handler that records every call, and small waiting helpers, for the scenarios.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::headers::Headers;
use event_retry_core::runtime::{Context, Handler};
use event_retry_core::time::Timestamp;

/// One handler call as the probe saw it.
#[derive(Clone, Debug)]
pub struct Call {
    /// The event id.
    pub id: String,
    /// The payload.
    pub payload: Bytes,
    /// The key.
    pub key: Option<Bytes>,
    /// The producer headers.
    pub headers: Headers,
    /// The attempt number the runtime reported (1-based).
    pub attempt: u32,
    /// The replay count.
    pub replay_count: u32,
    /// When the call started (monotonic).
    pub at: Instant,
    /// When the call returned (monotonic), once it has.
    pub ended: Option<Instant>,
    /// When the retry was due, for retries.
    pub due_at: Option<Timestamp>,
    /// The delay that was applied before this retry.
    pub last_delay: Option<Duration>,
    /// When the call started (wall clock).
    pub wall: Timestamp,
}

/// What the scripted handler does on a call.
pub enum Act {
    /// Succeed.
    Ok,
    /// Fail with this error.
    Fail(HandlerError),
    /// Wait, then succeed.
    SleepThenOk(Duration),
    /// Never return (for crash tests).
    Hang,
}

type Script = dyn Fn(&Event, usize) -> Act + Send + Sync;

/// Records calls and successes; `script(event, nth_call_of_this_event)` decides each call's outcome.
pub struct Probe {
    calls: Mutex<Vec<Call>>,
    successes: Mutex<Vec<(String, Instant)>>,
    script: Box<Script>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Probe {
    /// A probe running `script`.
    pub fn new(script: impl Fn(&Event, usize) -> Act + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::new(Vec::new()),
            successes: Mutex::new(Vec::new()),
            script: Box::new(script),
        })
    }

    /// A probe whose handler always succeeds.
    pub fn ok() -> Arc<Self> {
        Self::new(|_, _| Act::Ok)
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.calls).clone()
    }

    /// Calls for one event id, in order.
    pub fn calls_of(&self, id: &str) -> Vec<Call> {
        lock(&self.calls)
            .iter()
            .filter(|c| c.id == id)
            .cloned()
            .collect()
    }

    /// Number of calls.
    pub fn call_count(&self) -> usize {
        lock(&self.calls).len()
    }

    /// Event ids that succeeded, in order of success.
    pub fn successes(&self) -> Vec<String> {
        lock(&self.successes)
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// When `id` succeeded (its first success).
    pub fn success_time(&self, id: &str) -> Option<Instant> {
        lock(&self.successes)
            .iter()
            .find(|(s, _)| s == id)
            .map(|(_, t)| *t)
    }

    /// How many times each id succeeded.
    pub fn success_counts(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for (id, _) in lock(&self.successes).iter() {
            *counts.entry(id.clone()).or_insert(0) += 1;
        }
        counts
    }

    /// The probe as a handler (a cheap clone of the `Arc`).
    pub fn handler(self: &Arc<Self>) -> ProbeHandler {
        ProbeHandler(self.clone())
    }
}

/// The handler side of a [`Probe`].
pub struct ProbeHandler(Arc<Probe>);

#[async_trait]
impl Handler for ProbeHandler {
    async fn handle(&self, event: &Event, ctx: &Context) -> Result<(), HandlerError> {
        let probe = &self.0;
        let (index, nth) = {
            let mut calls = lock(&probe.calls);
            calls.push(Call {
                id: ctx.event_id.to_string(),
                payload: event.payload.clone(),
                key: event.key.clone(),
                headers: event.headers.clone(),
                attempt: ctx.attempt,
                replay_count: ctx.replay_count,
                at: Instant::now(),
                ended: None,
                due_at: ctx.due_at,
                last_delay: event.metadata().last_delay,
                wall: Timestamp::now(),
            });
            let nth = calls.iter().filter(|c| *c.id == *ctx.event_id).count() - 1;
            (calls.len() - 1, nth)
        };
        let result = match (probe.script)(event, nth) {
            Act::Ok => Ok(()),
            Act::Fail(e) => Err(e),
            Act::SleepThenOk(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Act::Hang => std::future::pending::<Result<(), HandlerError>>().await,
        };
        let now = Instant::now();
        lock(&probe.calls)[index].ended = Some(now);
        if result.is_ok() {
            lock(&probe.successes).push((ctx.event_id.to_string(), now));
        }
        result
    }
}

/// Polls `condition` every 20 ms until it holds or `timeout` passes; the error names what was awaited.
pub async fn wait_for(
    what: &str,
    timeout: Duration,
    mut condition: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Like [`wait_for`] with an async condition.
pub async fn wait_for_async<F, Fut>(
    what: &str,
    timeout: Duration,
    mut condition: F,
) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fails with `message` unless `condition` holds.
pub fn ensure(condition: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if condition { Ok(()) } else { Err(message()) }
}

/// The p-th percentile (0–100) of a sorted list.
pub fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = (sorted.len() * p).div_ceil(100).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<_> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50), Duration::from_millis(50));
        assert_eq!(percentile(&v, 99), Duration::from_millis(99));
        assert_eq!(percentile(&v[..1], 99), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }
}
