//! Dead-lettering: the event's dead-letter record written, and the DLQ copy handed to the broker until
//! it accepts it.
//!
//! Separate because an unwritable DLQ is a dependency outage, not a failed settle: the original stays
//! unsettled where the broker keeps it and consumption is held until the DLQ accepts the entry.

use std::time::Duration;

use tracing::warn;

use super::outage::outage_backoff;
use crate::adapter::Receipt;
use crate::dlq::Fingerprint;
use crate::error::Kind;
use crate::event::Event;
use crate::metadata::{DeadInfo, DeadReason};
use crate::runtime::shared::Shared;
use crate::time::Timestamp;

/// Dead-letters the event; `true` once the broker accepted the DLQ copy.
pub(super) async fn dead_letter(
    shared: &Shared,
    receipt: &mut dyn Receipt,
    event: &mut Event,
    reason: DeadReason,
) -> bool {
    event.meta.dead = Some(DeadInfo {
        reason,
        at: Timestamp::now(),
        consumer: shared.spec.consumer.clone(),
    });
    event.meta.due_at = None;
    warn!(%reason, error = ?event.meta.last_error, "dead-lettering");
    let mut hold = None;
    let mut failures: u32 = 0;
    loop {
        let error = match receipt.dead_letter(event).await {
            Ok(()) => {
                if hold.is_some() {
                    tracing::info!("the DLQ accepts again: resuming consumption");
                }
                shared.counters.bump(&shared.counters.dead_lettered);
                let meta = &event.meta;
                let fingerprint = Fingerprint::of(
                    meta.error_kind,
                    meta.last_error.as_deref().unwrap_or(""),
                    meta.origin.as_ref().map_or("", |o| &*o.topic),
                    Some(&shared.spec.group),
                );
                shared.telemetry.dead_letter(reason, fingerprint.as_str());
                return true;
            }
            Err(e) => e,
        };
        if matches!(error.kind(), Kind::AlreadySettled | Kind::Closed) {
            shared.counters.error(
                &shared.counters.settle_errors,
                format!("dead-letter failed: {error}"),
            );
            return false;
        }
        // An unwritable DLQ is a dependency outage: the original stays unsettled where the broker keeps
        // it (nothing is acknowledged, nothing goes through the retry route), consumption is held, and
        // the write is tried again with the blocking backoff until the DLQ accepts it.
        let message = format!("dead-letter failed: {error}");
        if hold.is_none() {
            tracing::error!(%message, "the DLQ does not accept the entry: holding consumption until it does");
            hold = Some(shared.pause.hold(&message));
        }
        shared.telemetry.settle_error();
        shared.telemetry.hold();
        shared
            .counters
            .error(&shared.counters.settle_errors, message);
        shared.counters.bump(&shared.counters.holds);
        let backoff = outage_backoff(shared, failures);
        failures = failures.saturating_add(1);
        if let Err(e) = receipt.keep_alive(backoff + Duration::from_secs(30)).await {
            shared
                .counters
                .error(&shared.counters.settle_errors, e.to_string());
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            // Shutdown: the delivery is left unsettled; dropping its receipt gives it back to the broker.
            () = shared.shutdown.triggered() => return false,
        }
    }
}
