//! The receive loop polls a delivery once itself before it makes it a task. Two things that must still
//! hold: a stream of deliveries that are always ready leaves the thread to its other tasks and timers
//! (on a current-thread runtime, and on a multi-threaded one with a single worker); on a multi-threaded runtime handlers that compute for long before they
//! first wait still run on several cores at once, not held to the loop's one thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use event_retry_core::prelude::*;
use event_retry_core::runtime::ConsumerHandle;
use event_retry_core::time::Timestamp;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A new in-memory broker whose `topic` holds `events` events.
async fn broker_holding(topic: &str, events: u64) -> Result<Broker, Box<dyn std::error::Error>> {
    let broker = Broker::memory();
    let producer = broker.producer();
    for i in 0..events {
        producer.publish(topic, Event::new(format!("{i}"))).await?;
    }
    Ok(broker)
}

/// Waits (at most `within`) until `handle`'s consumer has handled `events` events, then stops it.
async fn until_handled(handle: ConsumerHandle, events: u64, within: Duration) -> TestResult {
    tokio::time::timeout(within, handle.wait_until(|s| s.succeeded >= events)).await?;
    handle.shutdown().await?;
    Ok(())
}

/// A consumer handles a flood of 50,000 deliveries that are always ready while a 1 ms timer waits on the
/// same runtime: the timer must run before the consumer is through the flood.
async fn a_flood_leaves_the_runtime_to_its_timers() -> TestResult {
    const EVENTS: u64 = 50_000;
    let broker = broker_holding("flood", EVENTS).await?;
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
    until_handled(handle, EVENTS, Duration::from_secs(30)).await?;
    assert!(
        at_tick < EVENTS,
        "a 1 ms timer ran only once the consumer had handled all {EVENTS} events: the receive loop \
         kept the thread to itself"
    );
    assert_eq!(handled.load(Ordering::Relaxed), EVENTS);
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn a_flood_of_ready_deliveries_leaves_the_thread_to_its_timers() -> TestResult {
    a_flood_leaves_the_runtime_to_its_timers().await
}

/// On a multi-threaded runtime the loop takes a unit of its cooperative budget per 8 deliveries, not per
/// delivery: with a single worker thread, the timer and the loop share it, and the loop must still yield.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_flood_on_one_worker_thread_leaves_it_to_its_timers() -> TestResult {
    a_flood_leaves_the_runtime_to_its_timers().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_that_compute_before_they_wait_run_on_two_workers_at_once() -> TestResult {
    const EVENTS: u64 = 400;
    /// How long each handler computes (without an await) before it returns.
    const COMPUTE: Duration = Duration::from_micros(300);
    let broker = broker_holding("compute", EVENTS).await?;
    let running = Arc::new(AtomicUsize::new(0));
    let most_at_once = Arc::new(AtomicUsize::new(0));
    let (r, m) = (running.clone(), most_at_once.clone());
    let handle = broker
        .consumer("compute")
        .concurrency(8)
        .start(handler_fn(move |_event: Event, _ctx: Context| {
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            let until = Instant::now() + COMPUTE;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            r.fetch_sub(1, Ordering::SeqCst);
            async { Ok(()) }
        }))
        .await?;
    until_handled(handle, EVENTS, Duration::from_secs(60)).await?;
    assert!(
        most_at_once.load(Ordering::SeqCst) >= 2,
        "at most one handler computed at a time over {EVENTS} events of {COMPUTE:?} each on two \
         workers: the receive loop kept them all to its own thread"
    );
    Ok(())
}

/// The receive loop hands the clock reading that ends one delivery's call to the next delivery it takes
/// without waiting (one reading per event). A delivery that comes after the loop waited must be stamped
/// with its own time: here the second of two events comes 300 ms after the first was handled, and its
/// first-seen time must be within 100 ms of its call, not the first one's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_taken_after_a_wait_is_stamped_with_its_own_time() -> TestResult {
    const GAP: Duration = Duration::from_millis(300);
    let broker = Broker::memory();
    let producer = broker.producer();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let handle = broker
        .consumer("stamps")
        // One receive lane: both events go through the same loop.
        .concurrency(1)
        .start(handler_fn(move |event: Event, _ctx: Context| {
            let called = Timestamp::now();
            let first_seen = event.metadata().first_seen;
            record
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((first_seen, called));
            async { Ok(()) }
        }))
        .await?;
    producer.publish("stamps", Event::new("first")).await?;
    tokio::time::timeout(
        Duration::from_secs(10),
        handle.wait_until(|s| s.succeeded >= 1),
    )
    .await?;
    tokio::time::sleep(GAP).await;
    producer.publish("stamps", Event::new("second")).await?;
    until_handled(handle, 2, Duration::from_secs(10)).await?;
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for (first_seen, called) in seen {
        let first_seen = first_seen.ok_or("an event without a first-seen time")?;
        let before = called.since(first_seen);
        assert!(
            before < Duration::from_millis(100),
            "an event first seen {before:?} before its call: the loop stamped it with a reading \
             taken before it waited"
        );
    }
    Ok(())
}
