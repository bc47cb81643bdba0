//! The receive loop polls a delivery once itself before it makes it a task. Two things that must still
//! hold: a stream of deliveries that are always ready leaves the thread to its other tasks and timers
//! (on a current-thread runtime, and on a multi-threaded one with a single worker); on a multi-threaded runtime handlers that compute for long before they
//! first wait still run on several cores at once, not held to the loop's one thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use event_retry_core::prelude::*;
use event_retry_core::runtime::ConsumerHandle;

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
