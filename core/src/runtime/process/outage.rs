//! Waiting out a dependency that is down: the backoff between asks of the DLQ or the idempotency
//! store, and the probe a blocking error's dependency is asked with until it heals.
//!
//! Separate because an outage is waited out, never given up on, by rules of its own: the blocking
//! policy's delays with its retries spent or not, consumption held meanwhile.

use std::time::Duration;

use rand::RngCore;
use tracing::debug;

use super::Handling;
use crate::runtime::probe::ProbeFn;
use crate::runtime::shared::Shared;

/// The wait before asking a dependency that is down again (the DLQ, the idempotency store), after
/// `failures` failed asks: the blocking policy's delay, its retries spent or not, since an outage is
/// waited out, never given up on.
pub(super) fn outage_backoff(shared: &Shared, failures: u32) -> Duration {
    shared
        .policies
        .blocking
        .nominal_delay(failures)
        .unwrap_or(shared.settle_backoff)
        .max(Duration::from_millis(10))
}

impl Handling<'_> {
    /// Calls the dependency's probe on the blocking backoff until it answers `Ok` (the held event then
    /// runs again) or its backoff is spent (the handler runs again, and the decision falls through as
    /// without a probe); the handler is not run meanwhile. `false` on shutdown.
    pub(super) async fn probe_until_healed(&mut self, probe: &ProbeFn, holds: &mut u32) -> bool {
        let shared = self.shared;
        loop {
            match probe().await {
                Ok(()) => return true,
                Err(e) => debug!(error = %e, "the blocking dependency's probe failed"),
            }
            let backoff = {
                let mut rng = shared.rng.lock().unwrap_or_else(|p| p.into_inner());
                shared
                    .policies
                    .blocking
                    .delay(*holds, None, &mut *rng as &mut dyn RngCore)
            };
            let Some(backoff) = backoff else {
                return true;
            };
            *holds += 1;
            shared.counters.bump(&shared.counters.holds);
            shared.telemetry.hold();
            if let Err(e) = self
                .receipt
                .keep_alive(backoff + Duration::from_secs(30))
                .await
            {
                shared
                    .counters
                    .error(&shared.counters.settle_errors, e.to_string());
            }
            if !self.wait(backoff).await {
                return false;
            }
        }
    }
}
