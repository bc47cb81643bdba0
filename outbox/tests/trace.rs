//! The outbox's trace context (feature `opentelemetry`): an event enqueued inside a span of an
//! OpenTelemetry trace reaches its consumer in that trace, although the relay publishes it later, in a
//! task of its own, outside any trace.
//!
//! `cargo test -p event-retry-outbox --features opentelemetry --test trace` (the test command runs it):
//! embedded SQLite and the in-memory broker, the spans read back with the OpenTelemetry SDK's in-memory
//! exporter.

use std::time::Duration;

use event_retry_core::broker::Broker;
use event_retry_core::event::Event;
use event_retry_core::runtime::{Context, handler_fn};
use event_retry_core::trace_context::{TRACEPARENT, extract};
use event_retry_outbox::{Outbox, RowFilter};
use opentelemetry::trace::{SpanKind, TraceContextExt, TracerProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use sqlx::Connection;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_enqueued_inside_a_trace_reaches_its_consumer_in_that_trace()
-> Result<(), Box<dyn std::error::Error>> {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-test"))),
    )?;

    let dir = ScratchDir::new()?;
    let url = format!("sqlite:{}", dir.0.join("outbox.db").display());
    let outbox = Outbox::connect(&url).await?;
    let broker = Broker::memory();
    let relay = outbox.relay(broker.producer()).start()?;
    let consumer = broker
        .consumer("orders")
        .start(handler_fn(|_: Event, _: Context| async { Ok(()) }))
        .await?;

    // The service's transaction, inside a span of its own trace.
    let root = tracing::info_span!("place order");
    let trace_id = root.context().span().span_context().trace_id();
    let mut db = sqlx::SqliteConnection::connect(&url).await?;
    async {
        let mut tx = db.begin().await?;
        outbox
            .enqueue(&mut *tx, "orders", Event::new("order 7").with_id("o7"))
            .await?;
        tx.commit().await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    }
    .instrument(root.clone())
    .await?;

    // The row carries the context: its trace is the service's.
    let rows = outbox.list(&RowFilter::all()).await?;
    let row = rows.first().ok_or("no outbox row")?;
    let headers = row.event().headers.clone();
    assert!(
        headers.get(TRACEPARENT).is_some(),
        "the row has no traceparent: {headers:?}"
    );
    assert_eq!(extract(&headers).span().span_context().trace_id(), trace_id);

    tokio::time::timeout(
        Duration::from_secs(30),
        consumer.wait_until(|s| s.succeeded >= 1),
    )
    .await?;
    consumer.shutdown().await?;
    relay.shutdown().await?;
    drop(root);
    provider.force_flush()?;
    let spans: Vec<_> = exporter
        .get_finished_spans()?
        .into_iter()
        .filter(|s| s.span_context.trace_id() == trace_id)
        .collect();
    let names: Vec<String> = spans.iter().map(|s| s.name.to_string()).collect();
    let create = spans
        .iter()
        .find(|s| s.name == "create")
        .ok_or_else(|| format!("no create span in the trace: {names:?}"))?;
    let attempt = spans
        .iter()
        .find(|s| s.name == "event")
        .ok_or_else(|| format!("no attempt span in the trace: {names:?}"))?;
    assert_eq!(create.span_kind, SpanKind::Producer);
    assert_eq!(
        attempt.parent_span_id,
        create.span_context.span_id(),
        "the attempt is not the create span's child: {names:?}"
    );
    assert_eq!(attempt.span_kind, SpanKind::Consumer);
    db.close().await?;
    Ok(())
}

/// A directory of its own for the test's SQLite file, removed with everything in it when the test
/// ends, passed or failed: the file's `-wal` and `-shm` companions included, which outlived a removal
/// of the file alone while connections were still open.
struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    fn new() -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "event-retry-outbox-trace-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
