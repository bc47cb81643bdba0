//! Per-key ordering must not let one busy key take every concurrency slot: events of other keys go on
//! while a key's events wait behind a slow one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_retry_core::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_key_does_not_starve_the_others() -> Result<(), Box<dyn std::error::Error>> {
    let broker = Broker::memory();
    let producer = broker.producer();
    let done: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let record = done.clone();
    let handle = broker
        .consumer("keys")
        .concurrency(2)
        .ordered_by_key(ParkedAfterDead::FollowToDlq)
        .start(handler_fn(move |event: Event, _ctx: Context| {
            let record = record.clone();
            async move {
                let id = String::from_utf8_lossy(&event.payload).into_owned();
                if id == "a0" {
                    tokio::time::sleep(Duration::from_millis(800)).await;
                }
                record
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((id, Instant::now()));
                Ok(())
            }
        }))
        .await?;
    let start = Instant::now();
    for i in 0..5 {
        producer
            .publish("keys", Event::new(format!("a{i}")).with_key("A"))
            .await?;
    }
    for i in 0..3 {
        producer
            .publish(
                "keys",
                Event::new(format!("b{i}")).with_key(format!("B{i}")),
            )
            .await?;
    }
    tokio::time::timeout(
        Duration::from_secs(3),
        handle.wait_until(|s| s.succeeded >= 8),
    )
    .await?;
    handle.shutdown().await?;
    let done = done.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let order: Vec<&str> = done.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(done.len(), 8, "{order:?}");
    let a: Vec<&str> = order
        .iter()
        .copied()
        .filter(|id| id.starts_with('a'))
        .collect();
    assert_eq!(a, ["a0", "a1", "a2", "a3", "a4"], "key A in order");
    for (id, at) in &done {
        if id.starts_with('b') {
            assert!(
                at.duration_since(start) < Duration::from_millis(600),
                "{id} waited behind key A: {order:?}"
            );
        }
    }
    Ok(())
}
