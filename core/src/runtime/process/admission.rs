//! Admission: everything before a delivery's first call — its lateness, per-key parking, the
//! idempotency claim (waiting out a store that is down) and the lifecycle's claim.
//!
//! Separate from the call and its settle: a consumer without per-key ordering or an idempotency store
//! skips all of this but the claim, and the batch path admits each delivery alone through it.

use std::time::Duration;

use tracing::{debug, warn};

use super::Handling;
use super::dead_letter::dead_letter;
use super::outage::outage_backoff;
use crate::idempotency::Begin;
use crate::lifecycle::Input;
use crate::metadata::DeadReason;
use crate::runtime::ordering::Verdict;

/// Where an event's handling stands after [`Handling::admit`].
pub(super) enum Admission {
    /// The handler is to run, with this retry lateness.
    Run(Option<Duration>),
    /// Another delivery of the same id holds its idempotency key; claim again once it is settled.
    Busy(Option<Duration>),
    /// Settled or given back already (parked, a duplicate, refused).
    Ended,
}

/// What an idempotency claim found.
pub(super) enum Claim {
    /// The id is this delivery's to handle.
    Fresh,
    /// The delivery was settled (a duplicate) or released.
    Ended,
    /// Another delivery holds the id.
    Busy,
}

impl Handling<'_> {
    /// Everything before the handler's first call: lateness, per-key parking, the idempotency claim and
    /// the claim transition (see [`Handling::claim`]).
    pub(super) async fn admit(&mut self, wait_for_owner: bool) -> Admission {
        let shared = self.shared;
        let now = self.received;
        let lateness = self.lateness();
        if let (Some(parking), Some(key)) = (&shared.parking, self.ordered_key()) {
            match parking.verdict(&key, self.id, now) {
                Verdict::Run => self.event.meta.parked_behind = None,
                Verdict::Park { head, delay } => {
                    Box::pin(self.park(head, delay)).await;
                    return Admission::Ended;
                }
                Verdict::FollowToDlq { head } => {
                    self.event
                        .meta
                        .set_last_error(&format!("parked behind {head}, which was dead-lettered"));
                    let dead = if self.step(Input::Claim) {
                        self.permit(Input::Die)
                    } else {
                        None
                    };
                    let Some(dead) = dead else {
                        self.release(Duration::ZERO).await;
                        return Admission::Ended;
                    };
                    self.state = dead;
                    Box::pin(dead_letter(
                        shared,
                        &mut *self.receipt,
                        self.event,
                        DeadReason::ParkedBehindDead,
                    ))
                    .await;
                    return Admission::Ended;
                }
            }
        }
        self.claim(lateness, wait_for_owner).await
    }

    /// How late this retry started, received when it was (recorded in the lateness metric); `None` for
    /// a first delivery, and for a parked event coming back (lateness is a property of retries).
    pub(super) fn lateness(&self) -> Option<Duration> {
        let lateness = match self.event.meta.parked_behind {
            None => self.event.meta.due_at.map(|due| self.received.since(due)),
            Some(_) => None,
        };
        if let Some(late) = lateness {
            self.shared.telemetry.lateness(late);
        }
        lateness
    }

    /// Claims the event: its idempotency key (where the consumer has a store) and the lifecycle's claim.
    /// `Run` when the handler is to run; `Ended` when the event's handling ended here (a duplicate,
    /// given back); `Busy` — only unless `wait_for_owner` — when another delivery of the same id holds
    /// the key (a batch cannot wait for it: it may be the batch's own).
    pub(super) async fn claim(
        &mut self,
        lateness: Option<Duration>,
        wait_for_owner: bool,
    ) -> Admission {
        if self.shared.idempotency.is_some() {
            match Box::pin(self.claim_idempotency(wait_for_owner)).await {
                Claim::Fresh => {}
                Claim::Ended => return Admission::Ended,
                Claim::Busy => return Admission::Busy(lateness),
            }
        }
        if !self.step(Input::Claim) {
            self.release(Duration::ZERO).await;
            return Admission::Ended;
        }
        Admission::Run(lateness)
    }

    /// Claims the event id in the idempotency store: `Ended` when the delivery was settled as a
    /// duplicate or released; `Busy`, without waiting, when another delivery holds the id and
    /// `wait_for_owner` is false.
    ///
    /// A store that fails (its database is down) is a dependency outage, as a blocking error is:
    /// consumption pauses and the claim is asked again on the blocking backoff until the store answers —
    /// the event is neither handled unguarded nor dead-lettered for it.
    pub(super) async fn claim_idempotency(&mut self, wait_for_owner: bool) -> Claim {
        let shared = self.shared;
        let Some(store) = &shared.idempotency else {
            return Claim::Fresh;
        };
        let mut waited = Duration::ZERO;
        let mut outage = None;
        let mut holds = 0;
        loop {
            match store.begin(self.id).await {
                Ok(Begin::Fresh) => return Claim::Fresh,
                Ok(Begin::Done) => {
                    self.shared
                        .counters
                        .bump(&self.shared.counters.duplicates_skipped);
                    self.shared.telemetry.duplicate_skipped();
                    debug!("duplicate delivery skipped");
                    self.settle_ack().await;
                    return Claim::Ended;
                }
                Ok(Begin::InProgress) if !wait_for_owner => return Claim::Busy,
                Ok(Begin::InProgress) if waited < Duration::from_secs(30) => {
                    let step = Duration::from_millis(50);
                    if !self.wait(step).await {
                        self.release(Duration::ZERO).await;
                        return Claim::Ended;
                    }
                    waited += step;
                }
                Ok(Begin::InProgress) => {
                    self.release(Duration::from_secs(1)).await;
                    return Claim::Ended;
                }
                Err(e) => {
                    shared
                        .counters
                        .error(&shared.counters.settle_errors, e.to_string());
                    if outage.is_none() {
                        warn!(error = %e, "idempotency store unavailable: pausing consumption");
                        outage = Some(
                            shared
                                .pause
                                .hold(&format!("idempotency store unavailable: {e}")),
                        );
                    }
                    let backoff = outage_backoff(shared, holds);
                    holds = holds.saturating_add(1);
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
                        self.release(Duration::ZERO).await;
                        return Claim::Ended;
                    }
                }
            }
        }
    }

    pub(super) async fn abandon_idempotency(&mut self) {
        if let Some(store) = &self.shared.idempotency
            && let Err(e) = store.abandon(self.id).await
        {
            warn!(error = %e, "idempotency store: abandon failed");
        }
    }
}
