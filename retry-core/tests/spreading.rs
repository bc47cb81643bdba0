//! On a multi-threaded runtime the receive loop polls a delivery once itself before making it a task; a
//! handler that computes for long before it first waits must still run on several cores at once, not
//! be held to the loop's one thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use retry_core::prelude::*;

const EVENTS: u64 = 400;
/// How long each handler computes (without an await) before it returns.
const COMPUTE: Duration = Duration::from_micros(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_that_compute_before_they_wait_run_on_two_workers_at_once()
-> Result<(), Box<dyn std::error::Error>> {
    let broker = Broker::memory();
    let producer = broker.producer();
    for i in 0..EVENTS {
        producer
            .publish("compute", Event::new(format!("{i}")))
            .await?;
    }
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
    tokio::time::timeout(
        Duration::from_secs(60),
        handle.wait_until(|s| s.succeeded >= EVENTS),
    )
    .await?;
    handle.shutdown().await?;
    assert!(
        most_at_once.load(Ordering::SeqCst) >= 2,
        "at most one handler computed at a time over {EVENTS} events of {COMPUTE:?} each on two \
         workers: the receive loop kept them all to its own thread"
    );
    Ok(())
}
