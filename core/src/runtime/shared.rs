//! What a receive lane's loop and the tasks handling its deliveries share: the consumer's settings,
//! the lane's counters, and the gate a blocking error holds consumption with.
//!
//! Separate from the receive loop because the handling of a delivery reads it as much as the loop does,
//! and the consumer's handle keeps a weak reference to it: each of them depends on this state, not on
//! the others.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use tokio::sync::watch;

use super::handler::Handler;
use super::health::HealthState;
use super::ordering::Parking;
use super::stats::LaneCounters;
use super::stop::StopSignal;
use crate::adapter::SubscriptionSpec;
use crate::classify::Classifier;
use crate::decide::Policies;
use crate::idempotency::IdempotencyStore;
use crate::telemetry::Telemetry;

/// State shared by a receive lane's loop and the tasks handling its deliveries; each lane has its own
/// (its counters and metric handles), over the consumer's settings.
pub(crate) struct Shared {
    /// The topic, shared with every handler context.
    pub(super) topic: Arc<str>,
    /// The transport's name, as the attempt spans' `messaging.system` gives it.
    pub(super) system: &'static str,
    pub(super) spec: SubscriptionSpec,
    pub(super) policies: Policies,
    pub(super) classifier: Classifier,
    pub(super) idempotency: Option<Arc<dyn IdempotencyStore>>,
    pub(super) parking: Option<Parking>,
    pub(super) handler: Arc<dyn Handler>,
    /// This lane's counters.
    pub(super) counters: LaneCounters,
    pub(super) telemetry: Telemetry,
    pub(super) pause: Arc<PauseGate>,
    /// What the consumer's health is made of.
    pub(super) health: Arc<HealthState>,
    pub(super) shutdown: StopSignal,
    /// Shared by the lanes: drawn from only when an event fails.
    pub(super) rng: Arc<Mutex<StdRng>>,
    pub(super) settle_backoff: Duration,
    /// Dependency probes for blocking errors.
    pub(super) probes: super::probe::Probes,
}

/// Counts blocking holds; the receive loop pauses while any is active, and the consumer's health says
/// since when and why.
pub(super) struct PauseGate {
    pub(super) holds: watch::Sender<usize>,
    pub(super) health: Arc<HealthState>,
}

/// One active hold; dropping it ends the hold.
pub(super) struct PauseGuard<'a>(&'a PauseGate);

impl PauseGate {
    /// Holds consumption for `reason` (the blocking error) until the guard is dropped.
    pub(super) fn hold(&self, reason: &str) -> PauseGuard<'_> {
        self.health.held(reason);
        self.holds.send_modify(|n| *n += 1);
        PauseGuard(self)
    }
}

impl Drop for PauseGuard<'_> {
    fn drop(&mut self) {
        let health = &self.0.health;
        self.0.holds.send_modify(|n| {
            *n = n.saturating_sub(1);
            if *n == 0 {
                health.released();
            }
        });
    }
}
