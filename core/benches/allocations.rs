//! Heap allocations per event on the runtime's happy path: events through the in-memory transport to a
//! no-op handler (as in the `runtime` bench), counted by dhat's allocator. Each allocation and its free
//! cost tens of nanoseconds, which is a large share of the 1 µs per event the runtime is held to; this
//! bench says how many the path makes, so a change that adds one shows.
//!
//! ```text
//! cargo bench -p event-retry-core --bench allocations
//! ```

use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::runtime::{Context, handler_fn};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Events measured (after as many unmeasured, so one-time set-up is not counted).
const EVENTS: usize = 20_000;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Publishes `n` events of 100 B to `topic`.
async fn publish(broker: &Broker, topic: &str, n: usize) -> Result<(), Error> {
    let producer = broker.producer();
    let body = "x".repeat(100);
    for i in 0..n {
        producer
            .publish(topic, Event::new(body.clone()).with_id(format!("m{i}")))
            .await?;
    }
    Ok(())
}

/// Counts the allocations per event of a consumer with defaults on `runtime` (after `EVENTS` unmeasured
/// ones) and prints them, labelled `on`.
fn count(runtime: &tokio::runtime::Runtime, on: &str) -> Result<(), Error> {
    runtime.block_on(async {
        let broker = Broker::memory();
        publish(&broker, "allocs", 2 * EVENTS).await?;
        let handler =
            handler_fn(|_event: Event, _ctx: Context| async { Ok::<(), HandlerError>(()) });
        let consumer = broker.consumer("allocs").start(handler).await?;
        consumer
            .wait_until(|s| s.succeeded >= EVENTS as u64)
            .await;
        let (before, from) = (dhat::HeapStats::get(), consumer.stats().succeeded);
        consumer
            .wait_until(|s| s.succeeded >= 2 * EVENTS as u64)
            .await;
        let (after, to) = (dhat::HeapStats::get(), consumer.stats().succeeded);
        consumer.shutdown().await?;
        let events = (to - from) as f64;
        let blocks = (after.total_blocks - before.total_blocks) as f64;
        let bytes = (after.total_bytes - before.total_bytes) as f64;
        println!(
            "allocations per event on the happy path, {on}: {:.1} ({:.0} bytes), over {events} events of \
             100 B (in-memory transport, no-op handler, the consumer's defaults)",
            blocks / events,
            bytes / events
        );
        Ok::<(), Error>(())
    })
}

fn main() -> Result<(), Error> {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return Ok(());
    }
    let _profiler = dhat::Profiler::builder().testing().build();
    let one_core = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    count(&one_core, "current-thread runtime")?;
    let multi = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    count(&multi, "multi-threaded runtime")
}
