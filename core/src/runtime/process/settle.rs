//! Settling: an acknowledgement, a retry handed to the broker's delay mechanism, a park behind a key's
//! retrying event, a release — and what is done when the broker does not accept one.
//!
//! Separate from the decision that picks the settle: these steps only carry it out, and a settle the
//! broker refuses is counted, surfaced and released for redelivery, never dropped.

use std::time::Duration;

use tracing::{debug, warn};

use super::Handling;
use crate::adapter::Receipt;
use crate::lifecycle::{Input, State};
use crate::runtime::shared::Shared;
use crate::time::Timestamp;

impl Handling<'_> {
    /// Acknowledges the event and moves it to `succeeded` (the decision's next state).
    pub(super) async fn ack(&mut self, succeeded: State) {
        let shared = self.shared;
        // The handler succeeded: record it before acknowledging, so a redelivery after a failed ack (or a
        // crash in between) is skipped as a duplicate instead of repeating the side effects.
        if let Some(store) = &shared.idempotency
            && let Err(e) = store.complete(self.id).await
        {
            warn!(error = %e, "idempotency store: complete failed");
        }
        if self.settle_ack().await {
            self.acked(succeeded);
        }
    }

    /// The acknowledgement was accepted: the event moves to `succeeded` and is counted.
    pub(super) fn acked(&mut self, succeeded: State) {
        let shared = self.shared;
        self.state = succeeded;
        // `succeeded` last: whoever waits on it sees the success complete, its retry count included.
        if self.event.meta.attempts > 0 {
            shared.counters.bump(&shared.counters.succeeded_after_retry);
            shared.telemetry.success_after_retry();
        }
        shared.counters.bump(&shared.counters.succeeded);
        if let (Some(parking), Some(key)) = (&shared.parking, self.ordered_key()) {
            parking.resolved(&key, self.id, false, Timestamp::now());
        }
    }

    pub(super) async fn settle_ack(&mut self) -> bool {
        match self.receipt.ack().await {
            Ok(()) => true,
            Err(e) => {
                Box::pin(settle_failed(self.shared, self.receipt, "ack", e)).await;
                false
            }
        }
    }

    /// Hands the event to the broker's delay mechanism and moves it to `scheduled` (the decision's
    /// next state, whose `available_at` is the due time recorded in the metadata).
    pub(super) async fn retry_later(&mut self, delay: Duration, scheduled: State) {
        let shared = self.shared;
        let due = match scheduled {
            State::RetryScheduled { available_at } => available_at,
            _ => Timestamp::now().plus(delay),
        };
        tracing::Span::current().record("next_delay_ms", crate::time::duration_ms(delay));
        self.state = scheduled;
        let meta = &mut self.event.meta;
        meta.retries = meta.retries.saturating_add(1);
        meta.due_at = Some(due);
        meta.last_delay = Some(delay);
        self.abandon_idempotency().await;
        match self.receipt.retry(self.event, delay).await {
            Ok(()) => {
                shared.counters.bump(&shared.counters.retries_scheduled);
                shared.telemetry.retry_scheduled();
                if let (Some(parking), Some(key)) = (&shared.parking, self.ordered_key()) {
                    parking.head_retrying(&key, self.id, due, Timestamp::now());
                }
            }
            Err(e) => settle_failed(shared, &mut *self.receipt, "retry", e).await,
        }
    }

    pub(super) async fn park(&mut self, head: String, delay: Duration) {
        let shared = self.shared;
        debug!(%head, ?delay, "parked behind the key's retrying event");
        self.event.meta.parked_behind = Some(head);
        self.event.meta.due_at = Some(Timestamp::now().plus(delay));
        match self.receipt.retry(self.event, delay).await {
            Ok(()) => shared.counters.bump(&shared.counters.parked),
            Err(e) => settle_failed(shared, &mut *self.receipt, "park", e).await,
        }
    }

    pub(super) async fn release(&mut self, after: Duration) {
        self.shared.counters.bump(&self.shared.counters.released);
        if let Err(e) = self.receipt.release(after).await {
            self.shared
                .counters
                .error(&self.shared.counters.settle_errors, e.to_string());
        }
    }

    pub(super) async fn release_on_shutdown(&mut self) {
        self.step(Input::LeaseLost);
        self.give_back().await;
    }

    /// Gives the delivery back to the broker unsettled, so it is delivered again: on shutdown, and
    /// after the lifecycle refused the action the runtime was about to take (see [`Handling::permit`]).
    pub(super) async fn give_back(&mut self) {
        self.abandon_idempotency().await;
        self.release(Duration::ZERO).await;
    }
}

/// A settle the broker did not accept: count it, surface it, and release the delivery so the broker
/// delivers it again after the settle backoff. Nothing is acknowledged and nothing is dropped.
pub(super) async fn settle_failed(
    shared: &Shared,
    receipt: &mut dyn Receipt,
    what: &str,
    error: crate::error::Error,
) {
    let message = format!("{what} failed: {error}");
    tracing::error!(%message, "settle failed; the delivery is released for redelivery");
    shared.telemetry.settle_error();
    shared
        .counters
        .error(&shared.counters.settle_errors, message);
    shared.counters.bump(&shared.counters.released);
    if let Err(e) = receipt.release(shared.settle_backoff).await {
        shared.counters.error(
            &shared.counters.settle_errors,
            format!("release after a failed {what} failed: {e}"),
        );
    }
}
