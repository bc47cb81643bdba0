//! Trace context across every hop: one trace from the publish through a retry, the DLQ and a replay.
//!
//! The spans are read back with the OpenTelemetry SDK's in-memory exporter behind
//! `tracing-opentelemetry`'s layer, installed once per test process as the global `tracing` subscriber
//! (spans only, no events, so other scenarios running beside it pay little).
//!
//! The unit test at the end reads a held attempt's `outcome` (`hold`) the same way, on the in-memory
//! transport: no scenario holds an event inside a trace.

use std::sync::{Arc, OnceLock};

use event_retry_core::event::Event;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, TraceId, TracerProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;

use super::support::*;
use super::{ScenarioResult, Verdict};
use crate::fixture::Fixture;
use crate::probe::{Act, Probe, ensure, wait_for};

/// The exporter every span of this process goes to, and its provider (flushed before reading).
struct Capture {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
}

static CAPTURE: OnceLock<Result<Capture, String>> = OnceLock::new();

/// Installs the capture once: the global subscriber is the registry with the OpenTelemetry layer over a
/// tracer provider exporting to memory.
fn capture() -> Result<&'static Capture, String> {
    CAPTURE
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("event-retry-testkit"))
                .with_filter(tracing_subscriber::filter::filter_fn(|meta| meta.is_span()));
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
                .map_err(|_| {
                    "another global tracing subscriber is installed in this test process; the trace \
                     scenario installs its own (the OpenTelemetry layer over an in-memory exporter)"
                        .to_string()
                })?;
            Ok(Capture { exporter, provider })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The value of attribute `key` of `span`, as text.
fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// A line naming a span for a failure message.
fn describe(span: &SpanData) -> String {
    format!(
        "{} (span {}, parent {}, kind {:?}, outcome {:?}, attempt {:?}, replays {:?})",
        span.name,
        span.span_context.span_id(),
        span.parent_span_id,
        span.span_kind,
        attribute(span, "outcome"),
        attribute(span, "attempt"),
        attribute(span, "replays"),
    )
}

/// Scenario 18: an event published inside a trace fails twice (a retry, then the DLQ), is replayed and
/// succeeds. Every span the SDK made for it is in the publisher's trace, under one `publish` span (kind
/// producer) that is the publisher's span's child: the three attempts' `event` spans (kind consumer;
/// outcomes `retry`, `dead` with an error status, `ack`; attempts 1, 2 and 1 again with `replays` 1) and
/// the `replay` span, which starts after the second attempt and before the third. The spans name the
/// topic (`messaging.destination.name`), the broker (`messaging.system`) and the operation (`send`,
/// `process`); each attempt names the consumer's group (`messaging.consumer.group.name`) and the
/// event's id (`messaging.message.id`), and the first, which retries, the delay it chose
/// (`next_delay_ms`), which the others do not have.
pub async fn trace_context_every_hop(f: Arc<Fixture>) -> ScenarioResult {
    let capture = capture()?;
    let topic = f.fresh_topic("s18").await.map_err(|e| e.to_string())?;
    let u = unit(&f);
    // Two failures, then success: the retry and the dead letter, then the replayed attempt.
    let probe = Probe::new(|_, calls| {
        if calls < 2 {
            deferred("fails before the replay")
        } else {
            Act::Ok
        }
    });
    let c = start(
        &f,
        builder(&f, &topic, "c1").policy(policy(&format!("{}ms x1", ms(u)))),
        &probe,
    )
    .await?;
    let root = tracing::info_span!("scenario 18 publisher");
    let trace_id = root.context().span().span_context().trace_id();
    let root_id = root.context().span().span_context().span_id();
    ensure(trace_id != TraceId::INVALID, || {
        "the publisher's span has no OpenTelemetry context: the layer is not installed".into()
    })?;
    publish(&f, &topic, Event::new("traced").with_id("t1"))
        .instrument(root.clone())
        .await?;
    wait_dlq(&f, &topic, 1, patience(&f, 10)).await?;
    replay_all(&f, &topic, 1).await?;
    wait_for("the replayed event to succeed", patience(&f, 10), || {
        probe.successes().len() == 1
    })
    .await?;
    finish(&f, &topic, vec![c]).await?;
    drop(root);
    capture
        .provider
        .force_flush()
        .map_err(|e| format!("flush the spans: {e}"))?;
    let spans: Vec<SpanData> = capture
        .exporter
        .get_finished_spans()
        .map_err(|e| format!("read the spans: {e}"))?
        .into_iter()
        .filter(|s| s.span_context.trace_id() == trace_id)
        .collect();
    let all = || spans.iter().map(describe).collect::<Vec<_>>().join("; ");
    let named = |name: &str| spans.iter().filter(|s| s.name == name).collect::<Vec<_>>();
    // The OpenTelemetry messaging conventions' names.
    let group = event_retry_core::adapter::default_group(&topic);
    let system = match f.broker().transport().name() {
        "sqs" => "aws_sqs",
        other => other,
    };

    let publishes = named("publish");
    ensure(publishes.len() == 1, || {
        format!("want one publish span in the trace: {}", all())
    })?;
    let publish = publishes[0];
    let publish_id = publish.span_context.span_id();
    ensure(
        publish.parent_span_id == root_id && publish.span_kind == SpanKind::Producer,
        || {
            format!(
                "the publish span is not a producer span under the publisher's: {}",
                describe(publish)
            )
        },
    )?;
    ensure(
        attribute(publish, "messaging.destination.name").as_deref() == Some(topic.as_str())
            && attribute(publish, "messaging.system").as_deref() == Some(system)
            && attribute(publish, "messaging.operation.type").as_deref() == Some("send"),
        || format!("the publish span's attributes: {:?}", publish.attributes),
    )?;

    let mut attempts = named("event");
    attempts.sort_by_key(|s| s.start_time);
    ensure(attempts.len() == 3, || {
        format!(
            "want 3 attempt spans in the trace (retry, dead, after the replay): {}",
            all()
        )
    })?;
    let replays = named("replay");
    ensure(replays.len() == 1, || {
        format!("want one replay span in the trace: {}", all())
    })?;
    let replay = replays[0];
    ensure(replay.parent_span_id == publish_id, || {
        format!(
            "the replay span is not the publish span's child: {}",
            describe(replay)
        )
    })?;
    ensure(
        attempts[1].start_time <= replay.start_time && replay.start_time <= attempts[2].start_time,
        || {
            format!(
                "the replay span does not start between the second and the third attempt: {}",
                all()
            )
        },
    )?;
    let want = [("retry", "1", "0"), ("dead", "2", "0"), ("ack", "1", "1")];
    for (attempt, (outcome, number, replays)) in attempts.iter().zip(want) {
        ensure(
            attempt.parent_span_id == publish_id
                && attempt.span_kind == SpanKind::Consumer
                && attribute(attempt, "outcome").as_deref() == Some(outcome)
                && attribute(attempt, "attempt").as_deref() == Some(number)
                && attribute(attempt, "replays").as_deref() == Some(replays),
            || {
                format!(
                    "want attempt {number} (replays {replays}) with outcome {outcome} under the \
                     publish span {publish_id}, got {}",
                    describe(attempt)
                )
            },
        )?;
        ensure(
            attribute(attempt, "messaging.destination.name").as_deref() == Some(topic.as_str())
                && attribute(attempt, "messaging.system").as_deref() == Some(system)
                && attribute(attempt, "messaging.operation.type").as_deref() == Some("process")
                && attribute(attempt, "messaging.consumer.group.name").as_deref()
                    == Some(group.as_str())
                && attribute(attempt, "messaging.message.id").as_deref() == Some("t1"),
            || format!("an attempt span's attributes: {:?}", attempt.attributes),
        )?;
        let want_delay = (outcome == "retry").then(|| ms(u).to_string());
        ensure(attribute(attempt, "next_delay_ms") == want_delay, || {
            format!(
                "attempt {number} ({outcome}): next_delay_ms {:?}, want {want_delay:?}",
                attribute(attempt, "next_delay_ms")
            )
        })?;
    }
    ensure(matches!(attempts[1].status, Status::Error { .. }), || {
        format!(
            "the dead-lettered attempt's status is {:?}, want an error",
            attempts[1].status
        )
    })?;
    Ok(Verdict::Pass(None))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use event_retry_core::broker::Broker;
    use event_retry_core::classify::HandlerError;
    use event_retry_core::event::Event;
    use event_retry_core::runtime::{Context, handler_fn};
    use opentelemetry_sdk::trace::SpanData;

    use super::{capture, describe};

    /// Every value the attribute `outcome` of `span` has, as text (one if it was recorded once).
    fn outcomes(span: &SpanData) -> Vec<String> {
        span.attributes
            .iter()
            .filter(|kv| kv.key.as_str() == "outcome")
            .map(|kv| kv.value.to_string())
            .collect()
    }

    /// A blocking error holds the event in place, in its attempt span, and pauses consumption; shut down
    /// while it is held, that span ends with outcome `hold` (the runtime records the outcome of each
    /// held call on it). On the in-memory transport: the outcome is the runtime's, not the broker's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_attempt_ends_with_outcome_hold() -> Result<(), String> {
        let capture = capture()?;
        let broker = Broker::memory();
        let topic = "trace-holds";
        let handle = broker
            .consumer(topic)
            .start(handler_fn(|_event: Event, _ctx: Context| async {
                Err(HandlerError::blocking("database unreachable"))
            }))
            .await
            .map_err(|e| e.to_string())?;
        broker
            .producer()
            .publish(topic, Event::new("held").with_id("h1"))
            .await
            .map_err(|e| e.to_string())?;
        let stats =
            tokio::time::timeout(Duration::from_secs(10), handle.wait_until(|s| s.holds >= 2))
                .await
                .map_err(|_| {
                    format!(
                        "the event was not held twice within 10 s: {:?}",
                        handle.stats()
                    )
                })?;
        handle.shutdown().await.map_err(|e| e.to_string())?;
        capture
            .provider
            .force_flush()
            .map_err(|e| format!("flush the spans: {e}"))?;
        let attempts: Vec<SpanData> = capture
            .exporter
            .get_finished_spans()
            .map_err(|e| format!("read the spans: {e}"))?
            .into_iter()
            .filter(|s| {
                s.name == "event"
                    && s.attributes.iter().any(|kv| {
                        kv.key.as_str() == "messaging.destination.name"
                            && kv.value.to_string() == topic
                    })
            })
            .collect();
        let all = attempts.iter().map(describe).collect::<Vec<_>>().join("; ");
        assert_eq!(
            attempts.len(),
            1,
            "want one attempt span (the holds are in place), got: {all}"
        );
        let recorded = outcomes(&attempts[0]);
        assert!(
            !recorded.is_empty() && recorded.iter().all(|o| o == "hold"),
            "the held attempt's outcome: {recorded:?}, want hold (after {} holds): {all}",
            stats.holds
        );
        Ok(())
    }
}
