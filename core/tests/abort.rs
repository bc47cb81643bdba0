//! `ConsumerHandle::abort` stands in for a crash in the crash scenarios: once it returns, nothing of the
//! consumer may run — no handler call ends, no event is acknowledged — or a test counts an event the
//! "crashed" consumer settled afterwards as lost. A handler that waits once and then computes runs in a
//! task of its own on a multi-threaded runtime, possibly on the other worker at the moment of the abort.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use event_retry_core::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_of_an_aborted_consumer_runs_after_abort_returns()
-> Result<(), Box<dyn std::error::Error>> {
    let broker = Broker::memory();
    let producer = broker.producer();
    for i in 0..4 {
        producer
            .publish("crash", Event::new(format!("{i}")))
            .await?;
    }
    let (started, ended) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s, e) = (started.clone(), ended.clone());
    let handle = broker
        .consumer("crash")
        .concurrency(4)
        .start(handler_fn(move |_event: Event, _ctx: Context| {
            let (s, e) = (s.clone(), e.clone());
            async move {
                // Pending once, so the delivery goes on as a task of its own; then 300 ms of work
                // without an await, which an abort cannot interrupt.
                tokio::task::yield_now().await;
                s.fetch_add(1, Ordering::SeqCst);
                let until = Instant::now() + Duration::from_millis(300);
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
                e.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while started.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no handler started within 10 s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    handle.abort().await;
    let ended_at_abort = ended.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        ended.load(Ordering::SeqCst),
        ended_at_abort,
        "a handler call ended after abort() returned (and its event could be acknowledged): the \
         aborted consumer was still running"
    );
    Ok(())
}
