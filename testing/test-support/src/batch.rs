//! A batch handler on a real broker gets more than one event per call when the subscription already
//! holds them: the check every adapter's broker tests run, so that a subscription that hands the
//! runtime its deliveries one at a time (no `next_ready`) shows up as batches of one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_retry_core::adapter::default_group;
use event_retry_core::broker::Broker;
use event_retry_core::event::Event;
use event_retry_core::runtime::{Context, batch_handler_fn};

/// Events published before the consumer starts.
const EVENTS: usize = 300;
/// The consumer's batch size.
const BATCH: usize = 32;

/// Declares `topic` with the consumer's default group (so the group holds what is published before it
/// consumes), publishes 300 events to it, then drains it with a batch handler (batches of up to 32):
/// every event handled once, no batch larger than the batch size, and at least one call given more than
/// one event.
pub async fn batches_take_what_is_at_hand(broker: &Broker, topic: &str) -> Result<(), String> {
    broker
        .admin()
        .declare(topic, Some(&default_group(topic)))
        .await
        .map_err(|e| format!("declare {topic}: {e}"))?;
    let producer = broker.producer();
    for i in 0..EVENTS {
        producer
            .publish(
                topic,
                Event::new(format!("{i}")).with_id(format!("b{i:03}")),
            )
            .await
            .map_err(|e| format!("publish: {e}"))?;
    }
    let calls: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let recorded = calls.clone();
    let handler = batch_handler_fn(move |batch: Vec<(Event, Context)>| {
        recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(batch.iter().map(|(_, c)| c.event_id.to_string()).collect());
        let results = batch.iter().map(|_| Ok(())).collect();
        async move { results }
    });
    let consumer = broker
        .consumer(topic)
        .batch_size(BATCH)
        .start_batch(handler)
        .await
        .map_err(|e| format!("start: {e}"))?;
    let drained = tokio::time::timeout(
        Duration::from_secs(60),
        consumer.wait_until(|s| s.succeeded >= EVENTS as u64),
    )
    .await;
    consumer
        .shutdown()
        .await
        .map_err(|e| format!("shutdown: {e}"))?;
    let stats = drained.map_err(|_| format!("{EVENTS} events not handled within 60 s"))?;
    let calls = calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
    let mut seen: Vec<&String> = calls.iter().flatten().collect();
    seen.sort();
    seen.dedup();
    if seen.len() != EVENTS || stats.succeeded != EVENTS as u64 {
        return Err(format!(
            "{} distinct events handled, {} successes; want {EVENTS} of each",
            seen.len(),
            stats.succeeded
        ));
    }
    if sizes.iter().any(|&n| n > BATCH) {
        return Err(format!("a batch above the batch size {BATCH}: {sizes:?}"));
    }
    let largest = sizes.iter().copied().max().unwrap_or(0);
    if largest < 2 {
        return Err(format!(
            "{} calls, every one with a single event: the subscription handed over nothing it held",
            sizes.len()
        ));
    }
    println!(
        "{} calls for {EVENTS} events, {:.1} per call on average, the largest {largest}",
        sizes.len(),
        EVENTS as f64 / sizes.len() as f64
    );
    Ok(())
}
