//! What an orchestrator asks of a consumer: is it alive, and is it doing its work?
//!
//! A consumer's health is one of four states, kept by the parts of the runtime that know them: the
//! receive loop (receiving fails: the broker does not answer), the blocking holds (a dependency is down
//! and consumption is paused on purpose), and the consumer's task (stopped, and why). Kubernetes'
//! conventions map onto them: a consumer is *live* unless it stopped by failing (restarting the
//! process is then the cure), and *ready* only while it runs unhindered.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How long after its last receive error a consumer still counts as unreachable when no delivery came
/// since: an adapter that reconnected has nothing to say until an event arrives, and its retries of a
/// broker that is still down fail more often than this (the receive backoff is at most 10 s).
pub const UNREACHABLE_AFTER_LAST_ERROR: Duration = Duration::from_secs(30);

/// A consumer's health ([`ConsumerHandle::health`](super::ConsumerHandle::health)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Receiving and handling events.
    Running,
    /// A blocking error holds consumption (a dependency is down): since when, and the error.
    Held {
        /// When the hold began.
        since: SystemTime,
        /// The blocking error (or the idempotency store's failure) that holds it.
        reason: String,
    },
    /// Receiving fails (the broker does not answer, or refuses): since when, and the last error. It
    /// ends with the next delivery, or [`UNREACHABLE_AFTER_LAST_ERROR`] after the last error.
    Unreachable {
        /// When receiving began to fail.
        since: SystemTime,
        /// The last receive error.
        error: String,
    },
    /// The consumer has stopped: after a shutdown (`failure` is `None`) or because it failed.
    Stopped {
        /// Why it stopped, when it failed.
        failure: Option<String>,
    },
}

impl Health {
    /// Liveness: false only for a consumer that stopped by failing — the process should be restarted.
    pub fn is_live(&self) -> bool {
        !matches!(self, Health::Stopped { failure: Some(_) })
    }

    /// Readiness: true only while the consumer runs unhindered.
    pub fn is_ready(&self) -> bool {
        matches!(self, Health::Running)
    }

    /// A short name of the state: `running`, `held`, `unreachable`, `stopped`.
    pub fn name(&self) -> &'static str {
        match self {
            Health::Running => "running",
            Health::Held { .. } => "held",
            Health::Unreachable { .. } => "unreachable",
            Health::Stopped { .. } => "stopped",
        }
    }
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let age = |since: &SystemTime| {
            SystemTime::now()
                .duration_since(*since)
                .unwrap_or_default()
                .as_secs()
        };
        match self {
            Health::Running => f.write_str("running"),
            Health::Held { since, reason } => {
                write!(f, "held for {} s by a blocking error: {reason}", age(since))
            }
            Health::Unreachable { since, error } => {
                write!(f, "receiving has failed for {} s: {error}", age(since))
            }
            Health::Stopped { failure: None } => f.write_str("stopped"),
            Health::Stopped {
                failure: Some(failure),
            } => write!(f, "stopped by a failure: {failure}"),
        }
    }
}

/// The facts a consumer's health is made of, written by the runtime and read by its handle.
#[derive(Debug, Default)]
pub(crate) struct HealthState {
    inner: Mutex<Facts>,
}

#[derive(Debug, Default)]
struct Facts {
    held: Option<(SystemTime, String)>,
    /// Since when, the last error, and when it came.
    unreachable: Option<(SystemTime, String, SystemTime)>,
    stopped: Option<Option<String>>,
}

impl HealthState {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn facts(&self) -> std::sync::MutexGuard<'_, Facts> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A hold began (the first of possibly several at once).
    pub(crate) fn held(&self, reason: &str) {
        let mut facts = self.facts();
        if facts.held.is_none() {
            facts.held = Some((SystemTime::now(), reason.to_string()));
        }
    }

    /// The last hold ended.
    pub(crate) fn released(&self) {
        self.facts().held = None;
    }

    /// A receive failed; the first of a run sets the time.
    pub(crate) fn receive_failed(&self, error: &str) {
        let mut facts = self.facts();
        let now = SystemTime::now();
        match &mut facts.unreachable {
            Some((_, last, at)) => (*last, *at) = (error.to_string(), now),
            None => facts.unreachable = Some((now, error.to_string(), now)),
        }
    }

    /// A receive succeeded (a delivery, or nothing to deliver).
    pub(crate) fn received(&self) {
        self.facts().unreachable = None;
    }

    /// The consumer stopped, with its failure if it failed.
    pub(crate) fn stopped(&self, failure: Option<String>) {
        let mut facts = self.facts();
        if facts.stopped.is_none() {
            facts.stopped = Some(failure);
        }
    }

    /// The health these facts make: stopped first, then unreachable (a held consumer whose broker is
    /// also gone cannot resume either), then held.
    pub(crate) fn health(&self) -> Health {
        let facts = self.facts();
        if let Some(failure) = &facts.stopped {
            return Health::Stopped {
                failure: failure.clone(),
            };
        }
        if let Some((since, error, at)) = &facts.unreachable {
            // (A clock that went back counts the error as recent.)
            let recent = !SystemTime::now()
                .duration_since(*at)
                .is_ok_and(|age| age >= UNREACHABLE_AFTER_LAST_ERROR);
            if recent {
                return Health::Unreachable {
                    since: *since,
                    error: error.clone(),
                };
            }
        }
        if let Some((since, reason)) = &facts.held {
            return Health::Held {
                since: *since,
                reason: reason.clone(),
            };
        }
        Health::Running
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_facts_make_the_state_and_its_probes() {
        let state = HealthState::new();
        assert_eq!(state.health(), Health::Running);
        assert!(state.health().is_live() && state.health().is_ready());

        state.held("database down");
        state.held("a second hold keeps the first reason");
        let Health::Held { reason, .. } = state.health() else {
            panic!("want held, got {}", state.health());
        };
        assert_eq!(reason, "database down");
        assert!(state.health().is_live() && !state.health().is_ready());

        state.receive_failed("connection refused");
        state.receive_failed("connection reset");
        let Health::Unreachable { error, .. } = state.health() else {
            panic!("want unreachable, got {}", state.health());
        };
        assert_eq!(error, "connection reset");
        // An old last error no longer counts (a reconnected consumer with nothing to receive).
        if let Some((_, _, at)) = &mut state.facts().unreachable {
            *at -= UNREACHABLE_AFTER_LAST_ERROR;
        }
        assert_eq!(state.health().name(), "held");
        state.receive_failed("connection refused again");
        assert_eq!(state.health().name(), "unreachable");
        state.received();
        assert_eq!(state.health().name(), "held");
        state.released();
        assert_eq!(state.health(), Health::Running);

        state.stopped(Some("credentials refused".into()));
        state.stopped(None);
        assert_eq!(
            state.health(),
            Health::Stopped {
                failure: Some("credentials refused".into())
            }
        );
        assert!(!state.health().is_live() && !state.health().is_ready());
        assert!(
            Health::Stopped { failure: None }.is_live(),
            "a consumer shut down on purpose is not a failed one"
        );
    }
}
