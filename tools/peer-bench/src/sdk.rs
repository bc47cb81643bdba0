//! The event-retry side of a round, run as its own process: `event_retry::connect` and a consumer with
//! its defaults (plus the workload's retry policy), reporting in the [`protocol`](crate::protocol)
//! lines. The bench binary runs itself again with [`CHILD_ENV`] set to get this process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use event_retry::prelude::*;
use event_retry_core::time::Timestamp;

use crate::Error;
use crate::protocol::Line;

/// Set (to any value) in the environment of the SDK consumer's process.
pub const CHILD_ENV: &str = "PEER_BENCH_SDK_CONSUMER";

/// What the SDK consumer process is told, through its environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Orders {
    /// The broker URL.
    pub url: String,
    /// The topic to consume (already filled).
    pub topic: String,
    /// Events to see succeed before reporting done.
    pub events: u64,
    /// Failures per event before it succeeds.
    pub failures: u32,
    /// The retry policy, if not the default.
    pub policy: Option<String>,
}

impl Orders {
    /// The environment variables that carry these orders.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (CHILD_ENV, "1".to_string()),
            ("PEER_URL", self.url.clone()),
            ("PEER_TOPIC", self.topic.clone()),
            ("PEER_EVENTS", self.events.to_string()),
            ("PEER_FAILURES", self.failures.to_string()),
        ];
        if let Some(p) = &self.policy {
            env.push(("PEER_POLICY", p.clone()));
        }
        env
    }

    /// Reads the orders from this process's environment (`None` when it is not the SDK consumer).
    pub fn from_env() -> Result<Option<Orders>, Error> {
        if std::env::var_os(CHILD_ENV).is_none() {
            return Ok(None);
        }
        let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
        Ok(Some(Orders {
            url: var("PEER_URL")?,
            topic: var("PEER_TOPIC")?,
            events: var("PEER_EVENTS")?.parse()?,
            failures: var("PEER_FAILURES")?.parse()?,
            policy: std::env::var("PEER_POLICY").ok(),
        }))
    }
}

/// Consumes `orders.topic` until `orders.events` events succeeded; prints a `PEER late` line per retry
/// and `PEER done` at the end.
pub async fn consume(orders: Orders) -> Result<(), Error> {
    let broker = event_retry::connect(&orders.url).await?;
    let first: Arc<std::sync::OnceLock<Instant>> = Arc::default();
    let succeeded = Arc::new(AtomicU64::new(0));
    let (events, failures) = (orders.events, orders.failures);
    let (first_seen, done) = (first.clone(), succeeded.clone());
    let handler = handler_fn(move |_event: Event, ctx: Context| {
        let first_seen = first_seen.clone();
        let done = done.clone();
        async move {
            first_seen.get_or_init(Instant::now);
            if let Some(due) = ctx.due_at {
                let late = Timestamp::now().as_millis() as i64 - due.as_millis() as i64;
                println!("{}", Line::Late(late).render());
            }
            if ctx.attempt <= failures {
                return Err(HandlerError::deferred("fails on purpose"));
            }
            if done.fetch_add(1, Ordering::Relaxed) + 1 == events {
                let millis = first_seen
                    .get()
                    .map_or(0, |t| t.elapsed().as_millis() as u64);
                println!("{}", Line::Done { events, millis }.render());
            }
            Ok::<(), HandlerError>(())
        }
    });
    let mut consumer = broker.consumer(&orders.topic);
    if let Some(policy) = &orders.policy {
        consumer = consumer.policy(RetryPolicy::parse(policy)?);
    }
    let handle = consumer.start(handler).await?;
    // The bench kills this process once it has read `PEER done`.
    handle.await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_travel_through_the_environment() {
        let orders = Orders {
            url: "kafka://127.0.0.1:19092".into(),
            topic: "peer-x".into(),
            events: 171,
            failures: 7,
            policy: Some("1000ms,2000ms".into()),
        };
        let env = orders.to_env();
        assert!(env.contains(&(CHILD_ENV, "1".to_string())));
        assert!(env.contains(&("PEER_POLICY", "1000ms,2000ms".to_string())));
        assert!(env.contains(&("PEER_EVENTS", "171".to_string())));
    }
}
