//! On a current-thread runtime the consumer polls deliveries in its own receive loop: a stream of
//! deliveries that are always ready must still leave the thread to its other tasks and timers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use retry_core::prelude::*;

const EVENTS: u64 = 50_000;

#[tokio::test(flavor = "current_thread")]
async fn a_flood_of_ready_deliveries_leaves_the_thread_to_its_timers()
-> Result<(), Box<dyn std::error::Error>> {
    let broker = Broker::memory();
    let producer = broker.producer();
    for i in 0..EVENTS {
        producer
            .publish("flood", Event::new(format!("{i}")))
            .await?;
    }
    let handled = Arc::new(AtomicU64::new(0));
    let count = handled.clone();
    let handle = broker
        .consumer("flood")
        .start(handler_fn(move |_event: Event, _ctx: Context| {
            let count = count.clone();
            async move {
                count.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }))
        .await?;
    // A timer on the same thread, due long before the consumer can be through the flood.
    let seen = handled.clone();
    let at_tick = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        seen.load(Ordering::Relaxed)
    })
    .await?;
    tokio::time::timeout(
        Duration::from_secs(30),
        handle.wait_until(|s| s.succeeded >= EVENTS),
    )
    .await?;
    handle.shutdown().await?;
    assert!(
        at_tick < EVENTS,
        "a 1 ms timer ran only once the consumer had handled all {EVENTS} events: the receive loop \
         kept the thread to itself"
    );
    assert_eq!(handled.load(Ordering::Relaxed), EVENTS);
    Ok(())
}
