//! Dependency probes for blocking errors: while an event is held, ask the dependency, not the handler.
//!
//! A blocking error says a dependency is down (a database, a downstream service). Without a probe, the
//! runtime finds out whether it healed by running the held event's handler again on the blocking
//! backoff — a handler with side effects before the failing call repeats them on every try. A probe is
//! a cheap check of the dependency itself (`db.ping()`); while it fails, the handler is not re-run, and
//! the held event runs again once it succeeds. Probes are chosen per error: rules registered with a
//! predicate are tried in order, and one registered without applies to every blocking error.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::classify::{BoxError, HandlerError};

/// A probe's answer: `Ok` once the dependency answers.
pub type ProbeResult = Result<(), BoxError>;

/// A probe, boxed.
pub(crate) type ProbeFn =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ProbeResult> + Send>> + Send + Sync>;

/// Which blocking errors a probe is for.
type Applies = Arc<dyn Fn(&HandlerError) -> bool + Send + Sync>;

/// A consumer's probes, in registration order.
#[derive(Clone, Default)]
pub(crate) struct Probes(Vec<(Option<Applies>, ProbeFn)>);

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Probes({})", self.0.len())
    }
}

impl Probes {
    /// Adds `probe` for the blocking errors `applies` accepts (every one without).
    pub(crate) fn push<F, Fut, E>(&mut self, applies: Option<Applies>, probe: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let probe: ProbeFn = Arc::new(move || {
            let answer = probe();
            Box::pin(async move { answer.await.map_err(Into::into) })
        });
        self.0.push((applies, probe));
    }

    /// Adds `probe` for the blocking errors `applies` accepts.
    pub(crate) fn push_when<P, F, Fut, E>(&mut self, applies: P, probe: F)
    where
        P: Fn(&HandlerError) -> bool + Send + Sync + 'static,
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.push(Some(Arc::new(applies)), probe);
    }

    /// The probe for `error`: the first registered whose rule accepts it (a probe without a rule
    /// accepts every error).
    pub(crate) fn for_error(&self, error: &HandlerError) -> Option<ProbeFn> {
        self.0
            .iter()
            .find(|(applies, _)| applies.as_ref().is_none_or(|a| a(error)))
            .map(|(_, probe)| probe.clone())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_probe_whose_rule_accepts_the_error_is_chosen() {
        let mut probes = Probes::default();
        probes.push_when(
            |e: &HandlerError| e.message().contains("database"),
            || async { Err::<(), _>("database still down") },
        );
        probes.push(None, || async { Ok::<(), BoxError>(()) });
        let database = HandlerError::blocking("database unreachable");
        let other = HandlerError::blocking("the cache is down");
        let answer = probes.for_error(&database).unwrap()().await;
        assert_eq!(answer.unwrap_err().to_string(), "database still down");
        assert!(probes.for_error(&other).unwrap()().await.is_ok());
        assert!(Probes::default().for_error(&other).is_none());
    }
}
