//! Decoding a delivery: its metadata read from the headers and completed from the broker's facts,
//! the event ready to handle — or, when the metadata does not parse, the poison event it becomes.
//!
//! Separate from the handling because it is the one step that needs no handling yet: it runs before
//! the delivery's future is made, so that the future holds the decoded event once.

use std::sync::Arc;
use std::time::SystemTime;

use tracing::{info_span, warn};

use crate::adapter::DeliveryInfo;
use crate::classify::FailureKind;
use crate::event::Event;
use crate::metadata;
use crate::runtime::shared::Shared;
use crate::time::Timestamp;

/// A delivery decoded: ready to handle, or poison (its metadata does not parse).
pub(super) enum Prepared {
    /// Decoded: to handle.
    Ready(Ready),
    /// Its metadata does not parse: to dead-letter.
    Poison(Event),
}

/// A delivery decoded and ready to handle.
pub(super) struct Ready {
    pub(super) event: Event,
    pub(super) id: Arc<str>,
    pub(super) span: tracing::Span,
    /// When the delivery was taken, to the millisecond: one clock reading serves first-seen, lateness
    /// and the start of the first call's time (`taken`, the same reading). In a stream of deliveries
    /// settled in the receive loop, the reading that ended the previous one's call (see [`Reading`]).
    pub(super) received: Timestamp,
    /// The same reading, whole.
    pub(super) taken: SystemTime,
}

/// Decodes a delivery's metadata and completes it from the broker's facts; it was `taken` then.
pub(super) fn prepare(
    shared: &Shared,
    message: crate::event::RawMessage,
    info: DeliveryInfo,
    taken: SystemTime,
) -> Prepared {
    shared.counters.bump(&shared.counters.received);
    let now = Timestamp::from_system_time(taken);
    // Decoded from the headers into the event where it stays: the message itself is needed again only
    // for a poison event.
    let crate::event::RawMessage {
        payload,
        key,
        headers: raw_headers,
    } = message;
    let mut event = Event {
        payload,
        key,
        headers: crate::headers::Headers::new(),
        meta: metadata::RetryMetadata::default(),
    };
    let decoded = metadata::decode_into(&raw_headers, &mut event.meta, &mut event.headers);
    if let Err(err) = decoded {
        return Prepared::Poison(poison(event, &raw_headers, &info, now, &err));
    }
    drop(raw_headers);
    let meta = &mut event.meta;
    let id = meta
        .event_id
        .get_or_insert_with(|| info.message_id().into())
        .clone();
    // The delivery's facts are moved in, not copied: each is needed once.
    let DeliveryInfo {
        origin,
        broker_attempts,
        broker_retries,
        ..
    } = info;
    meta.first_seen.get_or_insert(now);
    meta.origin.get_or_insert(origin);
    if let Some(counted) = broker_attempts {
        meta.attempts = meta.attempts.max(counted);
    }
    if let Some(counted) = broker_retries {
        meta.retries = meta.retries.max(counted);
    }
    // One span per attempt, named and attributed after the OpenTelemetry messaging conventions (so an
    // exporter shows it as a consumer span); `topic`, `event_id` and `attempt` are kept for logs.
    let span = info_span!(
        "event",
        topic = %shared.spec.topic,
        event_id = %id,
        attempt = meta.attempts.saturating_add(1),
        replays = meta.replay_count,
        next_delay_ms = tracing::field::Empty,
        chosen_delay_ms = tracing::field::Empty,
        outcome = tracing::field::Empty,
        otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        messaging.system = shared.system,
        messaging.operation.type = "process",
        messaging.destination.name = %shared.spec.topic,
        messaging.consumer.group.name = %shared.spec.group,
        messaging.message.id = %id,
    );
    #[cfg(feature = "opentelemetry")]
    crate::trace_context::continue_from(&span, &event.headers);
    Prepared::Ready(Ready {
        event,
        id,
        span,
        received: now,
        taken,
    })
}

/// The poison event a delivery whose metadata does not parse (`err`) becomes: what did parse (event
/// id, origin, history) kept for whoever triages its DLQ entry, completed from the broker's facts, its
/// kind non-retryable and the reasons as its last error.
fn poison(
    event: Event,
    raw_headers: &crate::headers::Headers,
    info: &DeliveryInfo,
    now: Timestamp,
    err: &metadata::MetadataError,
) -> Event {
    let (meta, headers, problems) = metadata::decode_lenient(raw_headers);
    let mut poison = Event {
        headers,
        meta,
        ..event
    };
    poison
        .meta
        .event_id
        .get_or_insert_with(|| info.message_id().into());
    poison
        .meta
        .origin
        .get_or_insert_with(|| info.origin.clone());
    poison.meta.first_seen.get_or_insert(now);
    poison.meta.error_kind = Some(FailureKind::NonRetryable);
    let reasons: Vec<String> = problems.iter().map(ToString::to_string).collect();
    let reasons = if reasons.is_empty() {
        err.to_string()
    } else {
        reasons.join("; ")
    };
    poison.meta.set_last_error(&format!("poison: {reasons}"));
    warn!(event_id = %info.message_id(), error = %err, "poison message: malformed metadata");
    poison
}
