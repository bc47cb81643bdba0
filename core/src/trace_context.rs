//! W3C trace context across every hop (feature `opentelemetry`).
//!
//! A service's trace must not break at a retry. The SDK writes the [W3C trace context] (`traceparent`,
//! `tracestate`) into an event's headers where a trace starts on the publishing side, and continues it
//! wherever the event is handled:
//!
//! - [`Producer::publish`](crate::producer::Producer::publish), called inside a span that belongs to an
//!   OpenTelemetry trace, opens a `publish` span (kind producer, `messaging.*` attributes) as that span's
//!   child and writes the `publish` span's context into the event; an event that already carries a
//!   `traceparent` (an outbox row, a forwarded event) keeps it. Outside a trace nothing is written, so
//!   events of services that do not trace stay byte for byte what they published.
//! - Each delivery the consumer runtime handles — each attempt — runs in an `event` span (kind
//!   consumer) whose parent is the context the event carries, with the `messaging.*` attributes of the
//!   OpenTelemetry messaging conventions, the attempt, the retry delay and the outcome.
//! - An event written into the transactional outbox inside a trace gets a `create` span's context in
//!   its row; the relay publishes the row with it, later and in another task.
//! - Retry copies and DLQ entries keep the producer's headers, so every attempt, in whatever process and
//!   after however many hops, is a child of the same `publish` span.
//! - A DLQ replay of an entry that carries a context opens a `replay` span as that context's child. The
//!   replayed event keeps every header byte for byte (the SDK's promise to every consumer, in any
//!   language), its `traceparent` too, so the attempts after the replay are children of the `publish`
//!   span like the ones before it, with `replays` counting the replays.
//!
//! So one trace shows, in time order under the `publish` span: attempt 1 (outcome `retry`), attempt 2
//! (outcome `dead`), the `replay`, and attempt 1 again (outcome `ack`, `replays` 1). The spans are `tracing` spans: a service exports them with
//! `tracing-opentelemetry`'s layer over its OpenTelemetry tracer provider, and its handlers' own spans
//! nest inside the attempt's. The wire format is W3C's whatever global propagator the service set, so
//! every consumer of the topic, in any language, reads the same headers.
//!
//! [W3C trace context]: https://www.w3.org/TR/trace-context/

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::headers::Headers;

/// The W3C header naming the trace and the parent span.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header carrying vendors' trace state.
pub const TRACESTATE: &str = "tracestate";

/// Writes into event headers, replacing a header of the same name.
struct HeaderInjector<'a>(&'a mut Headers);

impl Injector for HeaderInjector<'_> {
    /// Replaces the value of the first header named `key` where it stands (and drops any later ones),
    /// else appends it; an empty `tracestate` is not written.
    fn set(&mut self, key: &str, value: String) {
        let mut replaced = false;
        let mut value = Some(bytes::Bytes::from(value.into_bytes()));
        self.0.retain_mut(|name, v| {
            if name != key {
                return true;
            }
            if replaced {
                return false;
            }
            replaced = true;
            if let Some(new) = value.take() {
                *v = new;
            }
            true
        });
        if let Some(value) = value
            && !(key == TRACESTATE && value.is_empty())
        {
            self.0.push(key.to_string(), value);
        }
    }
}

/// Reads event headers (values that are not UTF-8 read as absent).
struct HeaderExtractor<'a>(&'a Headers);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| std::str::from_utf8(v).ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name).collect()
    }
}

/// The trace context `headers` carry: an empty context when they carry none, or one that does not parse
/// (never the caller's current context, which the propagator's plain `extract` would fall back to).
pub fn extract(headers: &Headers) -> Context {
    TraceContextPropagator::new().extract_with_context(&Context::new(), &HeaderExtractor(headers))
}

/// Writes the span of `cx` into `headers` as `traceparent` (and `tracestate`), replacing what was there;
/// writes nothing when `cx` has no valid span.
pub fn inject(cx: &Context, headers: &mut Headers) {
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
}

/// Whether `headers` carry a trace context that parses.
pub fn carries_context(headers: &Headers) -> bool {
    extract(headers).span().span_context().is_valid()
}

/// Whether the current `tracing` span belongs to an OpenTelemetry trace: a subscriber with the
/// OpenTelemetry layer is installed and the caller runs inside one of its spans.
pub fn current_is_traced() -> bool {
    tracing::Span::current()
        .context()
        .span()
        .span_context()
        .is_valid()
}

/// Makes `span` a child of the context `headers` carry, when they carry one.
pub(crate) fn continue_from(span: &tracing::Span, headers: &Headers) {
    // No subscriber records the span (the common case without tracing): nothing to continue.
    if span.is_disabled() {
        return;
    }
    let cx = extract(headers);
    if cx.span().span_context().is_valid() {
        // Fails only without the OpenTelemetry layer, where there is nothing to continue.
        let _ = span.set_parent(cx);
    }
}

/// The `publish` span of an event about to be sent to `topic` from inside a trace, its context written
/// into `headers`; `None` outside a trace or when the event already carries a context.
pub(crate) fn publish_span(
    system: &'static str,
    topic: &str,
    event_id: &str,
    headers: &mut Headers,
) -> Option<tracing::Span> {
    start_trace_hop(headers, || {
        tracing::info_span!(
            "publish",
            otel.kind = "producer",
            messaging.system = system,
            messaging.destination.name = %topic,
            messaging.operation.type = "send",
            messaging.message.id = %event_id,
        )
    })
}

/// The `create` span of an event written into a transactional outbox for `topic` from inside a trace,
/// its context written into `headers` (the relay publishes the row with them later); `None` outside a
/// trace or when the event already carries a context.
pub fn create_span(topic: &str, event_id: &str, headers: &mut Headers) -> Option<tracing::Span> {
    start_trace_hop(headers, || {
        tracing::info_span!(
            "create",
            otel.kind = "producer",
            messaging.destination.name = %topic,
            messaging.operation.type = "create",
            messaging.message.id = %event_id,
        )
    })
}

/// Inside a trace, for an event that carries no context yet: the span `open` makes (a child of the
/// current span), its context written into `headers`. `None` otherwise.
fn start_trace_hop(
    headers: &mut Headers,
    open: impl FnOnce() -> tracing::Span,
) -> Option<tracing::Span> {
    if !current_is_traced() || carries_context(headers) {
        return None;
    }
    let span = open();
    inject(&span.context(), headers);
    Some(span)
}

/// The `replay` span of a dead letter sent back to `origin`, a child of the context the entry carries;
/// `None` when the entry carries none. The replayed event keeps its headers byte for byte — the
/// producer's `traceparent` among them — so the attempts after a replay are children of the `publish`
/// span, as every attempt is, and the `replay` span is their sibling in the same trace.
pub(crate) fn replay_span(
    origin: &str,
    event_id: Option<&str>,
    headers: &Headers,
) -> Option<tracing::Span> {
    let cx = extract(headers);
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let span = tracing::info_span!(
        "replay",
        otel.kind = "producer",
        messaging.destination.name = %origin,
        messaging.operation.type = "send",
        messaging.message.id = event_id.unwrap_or_default(),
    );
    let _ = span.set_parent(cx);
    Some(span)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    fn context(trace: u128, span: u64) -> Context {
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        ))
    }

    #[test]
    fn a_context_round_trips_through_headers_and_replaces_the_old_one_in_place() {
        let mut headers = Headers::new().with("own", "kept");
        inject(&context(0x1234, 0x42), &mut headers);
        assert!(
            headers.get(TRACESTATE).is_none(),
            "an empty tracestate is not written"
        );
        let mut headers = headers.with("after", "it");
        assert_eq!(
            headers.get(TRACEPARENT).unwrap().as_ref(),
            b"00-00000000000000000000000000001234-0000000000000042-01"
        );
        inject(&context(0x1234, 0x43), &mut headers);
        let parents: Vec<_> = headers
            .iter()
            .filter(|(name, _)| *name == TRACEPARENT)
            .collect();
        assert_eq!(parents.len(), 1, "one traceparent after a second inject");
        let names: Vec<&str> = headers.iter().map(|(name, _)| name).collect();
        assert_eq!(
            names,
            ["own", TRACEPARENT, "after"],
            "replaced where it stood"
        );
        let back = extract(&headers);
        let span = back.span();
        assert_eq!(span.span_context().trace_id(), TraceId::from(0x1234));
        assert_eq!(span.span_context().span_id(), SpanId::from(0x43));
        assert_eq!(headers.get("own").unwrap().as_ref(), b"kept");
    }

    #[test]
    fn headers_without_a_valid_context_carry_none() {
        assert!(!carries_context(&Headers::new()));
        assert!(!carries_context(
            &Headers::new().with(TRACEPARENT, "00-not-a-trace-01")
        ));
        assert!(!carries_context(
            &Headers::new().with(TRACEPARENT, vec![0xff, 0xfe])
        ));
        let mut headers = Headers::new();
        inject(&Context::new(), &mut headers);
        assert!(headers.is_empty(), "an empty context writes nothing");
    }

    #[test]
    fn outside_a_trace_nothing_is_written() {
        let mut headers = Headers::new();
        assert!(publish_span("kafka", "orders", "e1", &mut headers).is_none());
        assert!(replay_span("orders", Some("e1"), &headers).is_none());
        assert!(headers.is_empty());
    }
}
