//! One order service, any broker: the broker is a URL, the handler never changes.
//!
//! ```text
//! cargo run --example orders                      # memory://orders-demo (in-process)
//! cargo run --example orders -- memory://demo 12  # another URL, 12 orders
//! cargo run --example orders --features kafka -- kafka://127.0.0.1:19092
//! ```
//!
//! Each broker adapter adds its scheme to `event_retry::connect` behind its cargo feature; without the
//! feature, the URL is refused with an error that names it. Moving the service from one broker to another
//! is a change of URL (and feature), not of handler code: that is the migration story in code.

use std::time::{Duration, Instant};

use event_retry::prelude::*;

/// The business logic: knows nothing about brokers.
async fn handle_order(event: Event, ctx: Context) -> Result<(), HandlerError> {
    let order: serde_json::Value = decode_json(&event)?;
    let quantity = order["quantity"].as_i64().unwrap_or(0);
    if quantity <= 0 {
        return Err(HandlerError::non_retryable(format!(
            "order {} has quantity {quantity}",
            order["id"]
        )));
    }
    // Every fifth order finds its stock not replicated yet on the first try.
    if order["id"].as_u64().unwrap_or(0).is_multiple_of(5) && ctx.attempt == 1 {
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

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "memory://orders-demo".to_string());
    let count: u64 = args.next().map(|n| n.parse()).transpose()?.unwrap_or(10);
    let topic = "orders";

    let broker = event_retry::connect(&url).await?;
    println!("broker: {url} ({} transport)", broker.name());
    let consumer = Consumer::builder(broker.clone(), topic)
        .name("order-service")
        .policy(RetryPolicy::parse("500ms x3")?)
        .build()?;
    print!("{}", consumer.delay_report());
    let handle = consumer.start(handler_fn(handle_order)).await?;

    for id in 1..=count {
        let quantity = if id == 3 { -1 } else { 1 };
        let body = serde_json::json!({ "id": id, "quantity": quantity }).to_string();
        broker
            .publish(
                topic,
                &Event::new(body)
                    .with_id(format!("order-{id}"))
                    .with_key(format!("customer-{}", id % 3)),
            )
            .await?;
    }

    let deadline = Instant::now() + Duration::from_secs(30);
    while handle.stats().succeeded + handle.stats().dead_lettered < count {
        if Instant::now() > deadline {
            return Err("orders did not settle within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = handle.stats();
    handle.shutdown().await?;
    println!(
        "{} orders: {} succeeded ({} after a retry), {} dead-lettered",
        count, stats.succeeded, stats.succeeded_after_retry, stats.dead_lettered
    );
    for entry in broker.dead_letters().list(topic, &DlqFilter::all()).await? {
        println!(
            "  DLQ {}: {:?}",
            entry.event.id().unwrap_or("?"),
            entry.event.meta.last_error.as_deref().unwrap_or("")
        );
    }
    Ok(())
}
