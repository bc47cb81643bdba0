//! Quickstart: a flaky order handler on the in-memory broker — no broker to install.
//!
//! Run it with `cargo run --example quickstart`. Five orders arrive; the handler fails some of them in
//! different ways, and the timeline shows what the SDK does with each failure: in-place retries for a
//! transient blip, deferred retries through the broker for an order whose stock is not replicated yet,
//! the DLQ at once for a malformed order, and the DLQ after the policy is spent for one that never heals.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use event_retry::prelude::*;

#[derive(Debug, thiserror::Error)]
#[error("payment gateway timed out")]
struct GatewayTimeout;

/// What the handler shares across calls: given once, received as `State<Shop>` by every call.
#[derive(Clone)]
struct Shop {
    started: Instant,
    stock_checks: Arc<AtomicU32>,
}

/// The order handler: fails some orders in different ways, and prints each attempt on the timeline.
async fn handle(State(shop): State<Shop>, event: Event, ctx: Context) -> Result<(), HandlerError> {
    let order = String::from_utf8_lossy(&event.payload).into_owned();
    let at = shop.started.elapsed().as_secs_f64();
    let result = match order.as_str() {
        "order-1 book" => Ok(()),
        "order-2 lamp" if ctx.attempt == 1 => Err(HandlerError::unclassified(GatewayTimeout)),
        "order-3 desk" if shop.stock_checks.fetch_add(1, Ordering::SeqCst) < 2 => {
            Err(HandlerError::deferred("stock not replicated yet"))
        }
        "order-4 quantity=-1" => Err(HandlerError::non_retryable("negative quantity")),
        "order-5 chair" => Err(HandlerError::deferred("warehouse says no")),
        _ => Ok(()),
    };
    let late = ctx.lateness.map_or(String::new(), |l| {
        format!(" ({} ms after due)", l.as_millis())
    });
    match &result {
        Ok(()) => println!("[{at:6.3}s] {order:<20} attempt {}{late}: ok", ctx.attempt),
        Err(e) => println!(
            "[{at:6.3}s] {order:<20} attempt {}{late}: failed: {e}",
            ctx.attempt
        ),
    }
    result
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = event_retry::connect("memory://").await?;
    let shop = Shop {
        started: Instant::now(),
        stock_checks: Arc::new(AtomicU32::new(0)),
    };

    // Classify a library error by type: a gateway timeout heals within seconds, so retry it in place.
    let classifier = Classifier::new().on_type::<GatewayTimeout>(FailureKind::Transient);
    let consumer = broker
        .consumer("orders")
        .name("quickstart")
        .policy(RetryPolicy::parse("200ms x2, 400ms")?)
        .in_place(RetryPolicy::parse("50ms x2")?)
        .classifier(classifier)
        .concurrency(4)
        .build()?;
    println!("retry policy: {}", consumer.delay_report().policy);
    print!("{}", consumer.delay_report());
    println!("\ntimeline:");

    let handle = consumer.start(handler_fn_with_state(shop, handle)).await?;

    let producer = broker.producer();
    for order in [
        "order-1 book",
        "order-2 lamp",
        "order-3 desk",
        "order-4 quantity=-1",
        "order-5 chair",
    ] {
        let id = order.split(' ').next().unwrap_or(order);
        producer
            .publish("orders", Event::new(order).with_id(id))
            .await?;
    }

    // Three orders succeed and two are dead-lettered: wait for that (with a safety limit), then stop.
    let settled = tokio::time::timeout(
        Duration::from_secs(20),
        handle.wait_until(|s| s.succeeded + s.dead_lettered >= 5),
    )
    .await
    .map_err(|_| "the quickstart did not settle within 20 s")?;
    handle.shutdown().await?;
    let stats = settled;

    println!(
        "\n{} succeeded ({} after a retry), {} retries scheduled, {} in-place retries, {} dead-lettered",
        stats.succeeded,
        stats.succeeded_after_retry,
        stats.retries_scheduled,
        stats.in_place_retries,
        stats.dead_lettered
    );
    println!("\ndead letter queue of 'orders':");
    for entry in broker
        .dead_letters()
        .list("orders", &DlqFilter::all())
        .await?
    {
        let m = entry.event.metadata();
        let dead = m
            .dead
            .as_ref()
            .ok_or("a DLQ entry without dead-letter metadata")?;
        println!(
            "  {:<8} reason={:<14} attempts={} error={:?} payload={:?}",
            m.event_id.as_deref().unwrap_or("?"),
            dead.reason.to_string(),
            m.attempts,
            m.last_error.as_deref().unwrap_or(""),
            String::from_utf8_lossy(&entry.event.payload)
        );
    }
    Ok(())
}

/// A handler is a function: its unit test builds the context a broker would give it, no broker needed.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn shop() -> State<Shop> {
        State(Shop {
            started: Instant::now(),
            stock_checks: Arc::new(AtomicU32::new(0)),
        })
    }

    #[tokio::test]
    async fn a_malformed_order_is_not_retried_and_a_timeout_is_left_to_the_classifier() {
        let ctx = Context::new("orders", "order-4");
        let err = handle(shop(), Event::new("order-4 quantity=-1"), ctx)
            .await
            .unwrap_err();
        assert_eq!(err.stated_kind(), Some(FailureKind::NonRetryable));

        let first = Context::new("orders", "order-2").with_attempt(1);
        let err = handle(shop(), Event::new("order-2 lamp"), first)
            .await
            .unwrap_err();
        assert_eq!(err.stated_kind(), None, "the classifier decides");
        let second = Context::new("orders", "order-2").with_attempt(2);
        assert!(
            handle(shop(), Event::new("order-2 lamp"), second)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn the_stock_check_is_shared_by_every_call() {
        let shop = shop();
        for _ in 0..2 {
            let ctx = Context::new("orders", "order-3");
            assert!(
                handle(shop.clone(), Event::new("order-3 desk"), ctx)
                    .await
                    .is_err()
            );
        }
        let ctx = Context::new("orders", "order-3")
            .with_attempt(3)
            .with_retries(2);
        assert!(handle(shop, Event::new("order-3 desk"), ctx).await.is_ok());
    }
}
