//! A blocking error with a dependency probe: while the probe fails, the held event's handler is not run
//! again; once the probe answers, the event runs again and succeeds. The health says the consumer is held
//! meanwhile, with the error.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use event_retry_core::prelude::*;
use event_retry_core::runtime::Health;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_is_not_run_again_while_the_probe_fails()
-> Result<(), Box<dyn std::error::Error>> {
    let broker = Broker::memory();
    let database_up = Arc::new(AtomicBool::new(false));
    let handler_calls = Arc::new(AtomicU32::new(0));
    let probe_calls = Arc::new(AtomicU32::new(0));
    let (up, calls) = (database_up.clone(), handler_calls.clone());
    let (probe_up, probes) = (database_up.clone(), probe_calls.clone());
    let handle = broker
        .consumer("probed")
        // A fast blocking backoff: without the probe, the handler would run every 20 ms.
        .blocking(RetryPolicy::parse("20ms x1000")?)
        .blocking_probe(move || {
            probes.fetch_add(1, Ordering::SeqCst);
            let up = probe_up.load(Ordering::SeqCst);
            async move {
                if up {
                    Ok(())
                } else {
                    Err("database still down")
                }
            }
        })
        .start(handler_fn(move |_event: Event, _ctx: Context| {
            calls.fetch_add(1, Ordering::SeqCst);
            let up = up.load(Ordering::SeqCst);
            async move {
                if up {
                    Ok(())
                } else {
                    Err(HandlerError::blocking("database down"))
                }
            }
        }))
        .await?;
    broker
        .producer()
        .publish("probed", Event::new("order-1").with_id("order-1"))
        .await?;
    // Held for 500 ms: the probe is asked about 25 times, the handler not once more.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let Health::Held { reason, .. } = handle.health() else {
        panic!("want held, got {}", handle.health());
    };
    assert!(reason.contains("database down"), "{reason}");
    assert_eq!(
        handler_calls.load(Ordering::SeqCst),
        1,
        "the handler ran again while the probe failed"
    );
    assert!(
        probe_calls.load(Ordering::SeqCst) >= 5,
        "the probe was not asked"
    );
    database_up.store(true, Ordering::SeqCst);
    tokio::time::timeout(
        Duration::from_secs(5),
        handle.wait_until(|s| s.succeeded >= 1),
    )
    .await?;
    assert_eq!(handler_calls.load(Ordering::SeqCst), 2);
    assert_eq!(handle.health(), Health::Running);
    handle.shutdown().await?;
    Ok(())
}
