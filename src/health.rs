//! `/livez` and `/readyz` for an orchestrator (feature `health`), following Kubernetes' conventions.
//!
//! `/livez` answers 200 while no consumer has stopped by failing, 503 once one has (restarting the
//! process is the cure). `/readyz` answers 200 while every consumer runs unhindered, and 503 while one
//! is held by a blocking error, cannot reach its broker, has not started or has stopped. Each body lists
//! the consumers, `[+]` or `[-]` and the state, then `livez check passed` or `… failed`, as the
//! Kubernetes API server's own `?verbose` endpoints do.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use event_retry::prelude::*;
//!
//! let broker = event_retry::connect("memory://shop").await?;
//! let app = App::new().consumer(
//!     broker.consumer("orders"),
//!     handler_fn(|_event: Event, _ctx: Context| async { Ok(()) }),
//! );
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:8081").await?;
//! tokio::spawn(event_retry::health::serve(listener, app.health()));
//! app.run().await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use event_retry_core::runtime::{AppHealth, Health, HealthWatch};

/// What the endpoints report on: an [`App`](crate::App)'s consumers ([`App::health`](crate::App::health))
/// or one consumer's ([`ConsumerHandle::health_watch`](crate::consumer::ConsumerHandle::health_watch)).
pub trait Probe: Send + Sync + 'static {
    /// Each consumer's name (its topic) and health.
    fn consumers(&self) -> Vec<(String, Health)>;

    /// Whether the consumers have been started (an app not yet running is not ready).
    fn started(&self) -> bool {
        true
    }
}

impl Probe for AppHealth {
    fn consumers(&self) -> Vec<(String, Health)> {
        AppHealth::consumers(self)
    }

    fn started(&self) -> bool {
        AppHealth::started(self)
    }
}

impl Probe for HealthWatch {
    fn consumers(&self) -> Vec<(String, Health)> {
        vec![("consumer".to_string(), self.health())]
    }
}

/// The router with `/livez` and `/readyz`, to serve on a listener of one's own or merge into one.
pub fn router(probe: impl Probe) -> Router {
    let probe: Arc<dyn Probe> = Arc::new(probe);
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(probe)
}

/// Serves [`router`] on `listener` until the task is dropped or the listener fails.
pub async fn serve(listener: tokio::net::TcpListener, probe: impl Probe) -> std::io::Result<()> {
    axum::serve(listener, router(probe)).await
}

async fn livez(State(probe): State<Arc<dyn Probe>>) -> (StatusCode, String) {
    answer("livez", &probe.consumers(), true, Health::is_live)
}

async fn readyz(State(probe): State<Arc<dyn Probe>>) -> (StatusCode, String) {
    answer(
        "readyz",
        &probe.consumers(),
        probe.started(),
        Health::is_ready,
    )
}

/// The status and body of one check: passed when `started` and `check` holds for every consumer.
fn answer(
    name: &str,
    consumers: &[(String, Health)],
    started: bool,
    check: fn(&Health) -> bool,
) -> (StatusCode, String) {
    let mut body = String::new();
    if !started {
        body.push_str("[-]consumers not started yet\n");
    }
    let mut passed = started;
    for (consumer, health) in consumers {
        let ok = check(health);
        passed &= ok;
        body.push_str(&format!(
            "[{}]{consumer} {health}\n",
            if ok { '+' } else { '-' }
        ));
    }
    if passed {
        body.push_str(&format!("{name} check passed\n"));
        (StatusCode::OK, body)
    } else {
        body.push_str(&format!("{name} check failed\n"));
        (StatusCode::SERVICE_UNAVAILABLE, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_consumer_is_live_but_not_ready() {
        let held = Health::Held {
            since: std::time::SystemTime::now(),
            reason: "database down".into(),
        };
        let consumers = vec![
            ("orders".to_string(), Health::Running),
            ("refunds".to_string(), held),
        ];
        let (status, body) = answer("readyz", &consumers, true, Health::is_ready);
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("[+]orders running\n"), "{body}");
        assert!(body.contains("[-]refunds held for 0 s by a blocking error: database down"));
        assert!(body.ends_with("readyz check failed\n"), "{body}");
        let (status, body) = answer("livez", &consumers, true, Health::is_live);
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, _) = answer("readyz", &[], false, Health::is_ready);
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "not started: not ready"
        );
    }
}
