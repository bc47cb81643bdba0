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
//! ```
//!
//! Each broker adapter adds its scheme to `event_retry::connect` behind its cargo feature; without the
//! feature, the URL is refused with an error that names it. Moving the service from one broker to another
//! is a change of URL (and feature), not of handler code. Adapter settings go in the URL's query
//! (`kafka://host:9092?granularity=100ms`) or in the config file's `[broker]` section.
//!
//! With a count, the example publishes that many orders, waits until each is acknowledged or
//! dead-lettered, drains and prints the DLQ. With `serve`, it runs as a service would: one [`App`] with
//! the orders consumer, stopped gracefully on SIGTERM or ctrl-c.

use std::time::Duration;

use event_retry::prelude::*;

#[derive(Debug, serde::Deserialize)]
struct Order {
    id: u64,
    quantity: i64,
}

/// The business logic: knows nothing about brokers.
async fn handle_order(order: Order, ctx: Context) -> Result<(), HandlerError> {
    if order.quantity <= 0 {
        return Err(HandlerError::non_retryable(format!(
            "order {} has quantity {}",
            order.id, order.quantity
        )));
    }
    // Every fifth order finds its stock not replicated yet on the first try.
    if order.id.is_multiple_of(5) && ctx.attempt == 1 {
        return Err(HandlerError::deferred("stock not replicated yet"));
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
        event_retry::options::redact_url(&url),
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
