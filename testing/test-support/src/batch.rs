//! A batch handler on a real broker gets more than one event per call when the subscription already
//! holds them: the check every adapter's broker tests run, so that a subscription that hands the
//! runtime its deliveries one at a time (no `next_ready`) shows up as batches of one. An adapter's own
//! batch checks drain through the same [`drain_in_batches`].

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

/// A topic drained by a batch consumer, as [`drain_in_batches`] sets it up.
#[derive(Debug, Clone, Copy)]
pub struct BatchDrain {
    /// Events published before the consumer starts.
    pub events: usize,
    /// Each event's payload size (at least 32 bytes: [`crate::bench::payload`]).
    pub payload_bytes: usize,
    /// The consumer's batch size.
    pub batch: usize,
    /// The consumer's concurrency, where the test sets one.
    pub concurrency: Option<usize>,
    /// How long each handler call waits before it returns.
    pub call_time: Duration,
    /// How long the whole drain may take.
    pub within: Duration,
}

/// Declares `topic` with the consumer's default group (so the group holds what is published before it
/// consumes), publishes `drain.events` events to it, then drains it with a batch handler: every event
/// handled once and no batch larger than the batch size, or an error saying which. The topic is deleted
/// afterwards; returns the size of each call, in order.
pub async fn drain_in_batches(
    broker: &Broker,
    topic: &str,
    drain: BatchDrain,
) -> Result<Vec<usize>, String> {
    broker
        .admin()
        .declare(topic, Some(&default_group(topic)))
        .await
        .map_err(|e| format!("declare {topic}: {e}"))?;
    let producer = broker.producer();
    for i in 0..drain.events {
        let body = crate::bench::payload(i, drain.payload_bytes);
        producer
            .publish(topic, Event::new(body).with_id(format!("b{i:04}")))
            .await
            .map_err(|e| format!("publish: {e}"))?;
    }
    let calls: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let recorded = calls.clone();
    let call_time = drain.call_time;
    let handler = batch_handler_fn(move |batch: Vec<(Event, Context)>| {
        recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(batch.iter().map(|(_, c)| c.event_id.to_string()).collect());
        let results = batch.iter().map(|_| Ok(())).collect();
        async move {
            if !call_time.is_zero() {
                tokio::time::sleep(call_time).await;
            }
            results
        }
    });
    let mut builder = broker.consumer(topic).batch_size(drain.batch);
    if let Some(concurrency) = drain.concurrency {
        builder = builder.concurrency(concurrency);
    }
    let consumer = builder
        .start_batch(handler)
        .await
        .map_err(|e| format!("start: {e}"))?;
    let drained = tokio::time::timeout(
        drain.within,
        consumer.wait_until(|s| s.succeeded >= drain.events as u64),
    )
    .await;
    let seen = consumer.stats();
    consumer
        .shutdown()
        .await
        .map_err(|e| format!("shutdown: {e}"))?;
    crate::bench::tidy(broker.admin(), topic).await;
    let stats = drained.map_err(|_| {
        format!(
            "{} events not handled within {:?} (the consumer's counts then: {seen:?}; {} calls)",
            drain.events,
            drain.within,
            calls.lock().unwrap_or_else(|p| p.into_inner()).len()
        )
    })?;
    let calls = calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
    let mut seen: Vec<&String> = calls.iter().flatten().collect();
    seen.sort();
    seen.dedup();
    let handled: usize = sizes.iter().sum();
    if seen.len() != drain.events
        || handled != drain.events
        || stats.succeeded != drain.events as u64
    {
        return Err(format!(
            "{} distinct events in {handled} handled, {} successes; want each of {} once",
            seen.len(),
            stats.succeeded,
            drain.events
        ));
    }
    if sizes.iter().any(|&n| n > drain.batch) {
        return Err(format!(
            "a batch above the batch size {}: {sizes:?}",
            drain.batch
        ));
    }
    Ok(sizes)
}

/// Publishes 300 events to `topic` before the consumer starts, then drains it with a batch handler
/// (batches of up to 32): every event handled once, no batch larger than the batch size, and at least
/// one call given more than one event.
pub async fn batches_take_more_than_one_held_event(
    broker: &Broker,
    topic: &str,
) -> Result<(), String> {
    let sizes = drain_in_batches(
        broker,
        topic,
        BatchDrain {
            events: EVENTS,
            payload_bytes: 32,
            batch: BATCH,
            concurrency: None,
            call_time: Duration::ZERO,
            within: Duration::from_secs(60),
        },
    )
    .await?;
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
