//! One order service, any broker: the broker is a URL, the handler never changes.
//!
//! ```text
//! cargo run --example orders                      # memory://orders-demo (in-process), 10 orders
//! cargo run --example orders -- memory://demo 12  # another URL, 12 orders
//! cargo run --example orders --features kafka -- kafka://127.0.0.1:19092
//! cargo run --example orders --features kafka -- kafka://127.0.0.1:19092 serve   # until SIGTERM/ctrl-c
//! cargo run --example orders --features kafka,prometheus -- kafka://127.0.0.1:19092 serve \
//!     --metrics 127.0.0.1:9464                    # Prometheus scrapes http://127.0.0.1:9464/metrics
//! cargo run --example orders --features kafka,health -- kafka://127.0.0.1:19092 serve \
//!     --health 127.0.0.1:8081                     # probes: http://127.0.0.1:8081/livez, /readyz
//! cargo run --example orders --features opentelemetry -- memory://demo trace target/orders-trace.jsonl
//! ```
//!
//! Each broker adapter adds its scheme to `event_retry::connect` behind its cargo feature; without the
//! feature, the URL is refused with an error that names it. Moving the service from one broker to another
//! is a change of URL (and feature), not of handler code. Adapter settings go in the URL's query
//! (`kafka://host:9092?granularity=100ms`) or in the config file's `[broker]` section.
//!
//! With a count, the example publishes that many orders, waits until each is acknowledged or
//! dead-lettered, drains and prints the DLQ. With `serve`, it runs as a service would: one [`App`] with
//! the orders consumer, stopped gracefully on SIGTERM or ctrl-c. With `trace FILE` (feature
//! `opentelemetry`), it exports one trace to FILE, a span per JSON line: an order with a negative
//! quantity published inside a span, its first attempt (stock not replicated yet), the retry's attempt
//! (refused: dead-lettered), the DLQ replay an operator would run, and the attempts after it
//! (`tests/orders_trace.rs` reads it back).

use std::time::Duration;

use event_retry::prelude::*;
use event_retry::{Broker, ConsumerBuilder};

#[derive(Debug, serde::Deserialize)]
struct Order {
    id: u64,
    quantity: i64,
}

/// The business logic: knows nothing about brokers.
async fn handle_order(order: Order, ctx: Context) -> Result<(), HandlerError> {
    // Every fifth order finds its stock not replicated yet on the first try.
    if order.id.is_multiple_of(5) && ctx.attempt == 1 {
        return Err(HandlerError::deferred("stock not replicated yet"));
    }
    if order.quantity <= 0 {
        return Err(HandlerError::non_retryable(format!(
            "order {} has quantity {}",
            order.id, order.quantity
        )));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("orders: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `FLAG ADDR`, taken out of `args`: `--metrics` (where to serve the SDK's metrics for Prometheus) or
/// `--health` (where to serve `/livez` and `/readyz`).
fn take_address_flag(args: &mut Vec<String>, flag: &str) -> Result<Option<String>, String> {
    let Some(at) = args.iter().position(|a| a == flag) else {
        return Ok(None);
    };
    args.remove(at);
    if at < args.len() {
        Ok(Some(args.remove(at)))
    } else {
        Err(format!("{flag} needs an address, e.g. 127.0.0.1:9464"))
    }
}

#[cfg(feature = "prometheus")]
fn serve_metrics(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    event_retry::prometheus::serve(addr.parse()?)?;
    println!("metrics on http://{addr}/metrics");
    Ok(())
}

#[cfg(not(feature = "prometheus"))]
fn serve_metrics(_addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    Err("--metrics needs the example built with --features prometheus".into())
}

#[cfg(feature = "health")]
async fn serve_health(addr: &str, app: &App) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("probes on http://{addr}/livez and http://{addr}/readyz");
    tokio::spawn(event_retry::health::serve(listener, app.health()));
    Ok(())
}

#[cfg(not(feature = "health"))]
async fn serve_health(_addr: &str, _app: &App) -> Result<(), Box<dyn std::error::Error>> {
    Err("--health needs the example built with --features health".into())
}

/// Exports finished spans to a file, one JSON object per line: the standard exporters write to a
/// collector (OTLP) or print text for people (stdout), and a test reads this one back.
#[cfg(feature = "opentelemetry")]
mod trace_file {
    use std::io::Write;
    use std::sync::Mutex;

    use opentelemetry::trace::Status;
    use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
    use opentelemetry_sdk::trace::{SpanData, SpanExporter};

    /// Appends each span to a file as a JSON line: name, trace, span and parent ids, kind, whether it
    /// ended in error, its start (ns since the epoch) and its attributes as text.
    #[derive(Debug)]
    pub(crate) struct JsonLines(pub(crate) Mutex<std::fs::File>);

    fn line(span: &SpanData) -> serde_json::Value {
        let attributes: serde_json::Map<String, serde_json::Value> = span
            .attributes
            .iter()
            .map(|kv| (kv.key.to_string(), kv.value.to_string().into()))
            .collect();
        let start = span
            .start_time
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        serde_json::json!({
            "name": span.name,
            "trace_id": span.span_context.trace_id().to_string(),
            "span_id": span.span_context.span_id().to_string(),
            "parent_span_id": span.parent_span_id.to_string(),
            "kind": format!("{:?}", span.span_kind),
            "error": matches!(span.status, Status::Error { .. }),
            "start_ns": start.to_string(),
            "attributes": attributes,
        })
    }

    impl SpanExporter for JsonLines {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let mut file = self.0.lock().unwrap_or_else(|p| p.into_inner());
            for span in &batch {
                writeln!(file, "{}", line(span))
                    .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
            }
            file.flush()
                .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))
        }
    }
}

/// `trace FILE`: one order's whole journey as one trace, exported to FILE.
#[cfg(feature = "opentelemetry")]
async fn trace_one_order(
    broker: &Broker,
    orders: ConsumerBuilder,
    topic: &str,
    file: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    use opentelemetry::trace::{TraceContextExt, TracerProvider};
    use tracing::Instrument;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;

    let exporter = trace_file::JsonLines(std::sync::Mutex::new(std::fs::File::create(file)?));
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(exporter)
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("orders-example"))
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| meta.is_span()));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))?;

    let handle = orders.build()?.start(json_handler(handle_order)).await?;
    let checkout = tracing::info_span!("checkout");
    let trace_id = checkout.context().span().span_context().trace_id();
    // Not replicated yet on its first try, refused on the retry: dead-lettered after two attempts.
    let order = Event::json(&serde_json::json!({ "id": 5, "quantity": -1 }))?
        .with_id("order-traced")
        .with_key("customer-2");
    broker
        .producer()
        .publish(topic, order)
        .instrument(checkout.clone())
        .await?;
    let settle = |n| {
        tokio::time::timeout(
            Duration::from_secs(30),
            handle.wait_until(move |s| s.dead_lettered >= n),
        )
    };
    settle(1)
        .await
        .map_err(|_| "the order was not dead-lettered within 30 s")?;
    // An operator replays it (as `retryctl dlq replay` would): it runs again, and is refused again.
    let replayed = broker
        .dead_letters()
        .replay(topic, &DlqFilter::all())
        .await?;
    settle(2)
        .await
        .map_err(|_| "the replayed order did not settle within 30 s")?;
    handle.shutdown().await?;
    drop(checkout);
    provider.force_flush()?;
    println!(
        "trace {trace_id}: publish, 2 attempts, DLQ, {} replayed, 2 attempts, DLQ; spans in {file}",
        replayed.replayed
    );
    Ok(())
}

#[cfg(not(feature = "opentelemetry"))]
async fn trace_one_order(
    _broker: &Broker,
    _orders: ConsumerBuilder,
    _topic: &str,
    _file: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    Err("trace needs the example built with --features opentelemetry".into())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if let Some(addr) = take_address_flag(&mut argv, "--metrics")? {
        serve_metrics(&addr)?;
    }
    let health = take_address_flag(&mut argv, "--health")?;
    let mut args = argv.into_iter();
    let url = args
        .next()
        .unwrap_or_else(|| "memory://orders-demo".to_string());
    let mode = args.next().unwrap_or_else(|| "10".to_string());
    let topic = "orders";

    let broker = event_retry::connect(&url).await?;
    println!(
        "broker: {} ({} transport)",
        event_retry_core::options::redact_url(&url),
        broker.name()
    );
    let orders = broker
        .consumer(topic)
        .name("order-service")
        .policy(RetryPolicy::parse("500ms x3")?);

    if mode == "serve" {
        println!("serving {topic} until SIGTERM or ctrl-c");
        let app = App::new().consumer(orders, json_handler(handle_order));
        if let Some(addr) = &health {
            serve_health(addr, &app).await?;
        }
        app.run_until(event_retry::shutdown_signal()).await?;
        println!("stopped");
        return Ok(());
    }

    if health.is_some() {
        return Err("--health is for `serve`".into());
    }
    if mode == "trace" {
        let file = args
            .next()
            .ok_or("trace needs a file to write the spans to")?;
        return trace_one_order(&broker, orders, topic, &file).await;
    }
    let count: u64 = mode.parse()?;
    let consumer = orders.build()?;
    print!("{}", consumer.delay_report());
    let handle = consumer.start(json_handler(handle_order)).await?;

    let producer = broker.producer();
    for id in 1..=count {
        let quantity = if id == 3 { -1 } else { 1 };
        let event = Event::json(&serde_json::json!({ "id": id, "quantity": quantity }))?
            .with_id(format!("order-{id}"))
            .with_key(format!("customer-{}", id % 3));
        producer.publish(topic, event).await?;
    }

    // Every order ends acknowledged or dead-lettered: wait for that (bounded), then drain and stop.
    let stats = tokio::time::timeout(
        Duration::from_secs(30),
        handle.wait_until(|s| s.succeeded + s.dead_lettered >= count),
    )
    .await
    .map_err(|_| "orders did not settle within 30 s")?;
    handle.shutdown().await?;
    println!(
        "{} orders: {} succeeded ({} after a retry), {} dead-lettered",
        count, stats.succeeded, stats.succeeded_after_retry, stats.dead_lettered
    );
    for entry in broker.dead_letters().list(topic, &DlqFilter::all()).await? {
        println!(
            "  DLQ {}: {}",
            entry.event.id().unwrap_or("?"),
            entry.event.metadata().last_error.as_deref().unwrap_or("")
        );
    }
    Ok(())
}
