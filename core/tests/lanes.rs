//! Receive lanes: on a multi-threaded runtime a consumer of a transport that splits its subscription
//! (the in-memory broker) receives in one lane per worker thread. What must hold: every event is
//! handled exactly once and counted once; the lanes are asked for only where they keep the consumer's
//! promises (not with per-key ordering, concurrency 1, a batch that needs every slot, or one thread);
//! a lane whose receives keep failing stops the whole consumer with its error.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_retry_core::adapter::default_group;
use event_retry_core::error::Kind;
use event_retry_core::memory::MemoryTransport;
use event_retry_core::prelude::*;
use event_retry_core::runtime::ConsumerError;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A handler that succeeds and counts each event by its payload.
fn counting(seen: Arc<Mutex<HashMap<String, u32>>>) -> impl Handler {
    handler_fn(move |event: Event, _ctx: Context| {
        let seen = seen.clone();
        async move {
            let body = String::from_utf8_lossy(&event.payload).into_owned();
            *seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(body)
                .or_default() += 1;
            Ok(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lanes_on_two_workers_handle_every_event_exactly_once() -> TestResult {
    const EVENTS: u32 = 20_000;
    let transport = MemoryTransport::new();
    let broker = Broker::new(transport.clone());
    let producer = broker.producer();
    for i in 0..EVENTS {
        producer
            .publish("lanes", Event::new(format!("{i}")))
            .await?;
    }
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let handle = broker
        .consumer("lanes")
        .start(counting(seen.clone()))
        .await?;
    assert_eq!(handle.lanes(), 2, "one lane per worker thread");
    let stats = tokio::time::timeout(
        Duration::from_secs(60),
        handle.wait_until(|s| s.succeeded >= u64::from(EVENTS)),
    )
    .await?;
    handle.shutdown().await?;
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(seen.len(), EVENTS as usize, "every event handled");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "events handled more than once: {twice:?}");
    assert_eq!(
        (stats.received, stats.attempts, stats.succeeded),
        (u64::from(EVENTS), u64::from(EVENTS), u64::from(EVENTS)),
        "the lanes' counts sum to one per event: {stats:?}"
    );
    assert_eq!(transport.held("lanes", &default_group("lanes")), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lane_where_lanes_would_break_a_promise() -> TestResult {
    let broker = Broker::memory();
    let noop = || handler_fn(|_e: Event, _c: Context| async { Ok(()) });
    let ordered = broker
        .consumer("ordered")
        .ordered_by_key(ParkedAfterDead::Run)
        .start(noop())
        .await?;
    let sequential = broker.consumer("one").concurrency(1).start(noop()).await?;
    // A batch handler's lane holds a whole batch: 64 slots (the default batch) make one lane.
    let batched = broker
        .consumer("batched")
        .start_batch(batch_handler_fn(
            |batch: Vec<(Event, Context)>| async move { batch.iter().map(|_| Ok(())).collect() },
        ))
        .await?;
    let two_batches = broker
        .consumer("two-batches")
        .batch_size(8)
        .concurrency(16)
        .start_batch(batch_handler_fn(
            |batch: Vec<(Event, Context)>| async move { batch.iter().map(|_| Ok(())).collect() },
        ))
        .await?;
    assert_eq!(
        [
            ordered.lanes(),
            sequential.lanes(),
            batched.lanes(),
            two_batches.lanes()
        ],
        [1, 1, 1, 2],
        "per-key ordering, concurrency 1, a default batch: one lane; two batches of 8 in 16 slots: two"
    );
    for handle in [ordered, sequential, batched, two_batches] {
        handle.shutdown().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn one_lane_on_a_current_thread_runtime() -> TestResult {
    let broker = Broker::memory();
    let handle = broker
        .consumer("single")
        .start(handler_fn(|_e: Event, _c: Context| async { Ok(()) }))
        .await?;
    assert_eq!(handle.lanes(), 1);
    handle.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_receive_errors_in_the_lanes_stop_the_consumer_with_the_error() -> TestResult {
    let transport = MemoryTransport::new();
    transport.fail_receives("refused", Some(Kind::Security));
    let broker = Broker::new(transport.clone());
    let handle = broker
        .consumer("refused")
        .give_up_receiving_after(3, Duration::from_millis(100))
        .start(handler_fn(|_e: Event, _c: Context| async { Ok(()) }))
        .await?;
    assert_eq!(handle.lanes(), 2);
    match tokio::time::timeout(Duration::from_secs(10), handle).await? {
        Err(ConsumerError::ReceiveFailed { last, .. }) => assert_eq!(last.kind(), Kind::Security),
        other => panic!("want ReceiveFailed, got {other:?}"),
    }
    Ok(())
}

/// Two lanes of one slot each: the first handler call hangs. The lane it hangs in has taken messages
/// ahead; with its one slot busy it gives them back, and the other lane handles every other event
/// while the first still hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_whose_slots_are_busy_leaves_what_it_took_to_the_other() -> TestResult {
    const EVENTS: u64 = 40;
    let transport = MemoryTransport::new();
    let broker = Broker::new(transport.clone());
    let producer = broker.producer();
    for i in 0..EVENTS {
        producer.publish("busy", Event::new(format!("{i}"))).await?;
    }
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let release = Arc::new(tokio::sync::Notify::new());
    let handle = broker
        .consumer("busy")
        .concurrency(2)
        .start(handler_fn({
            let (first, release) = (first.clone(), release.clone());
            move |_event: Event, _ctx: Context| {
                let hang = first.swap(false, std::sync::atomic::Ordering::SeqCst);
                let release = release.clone();
                async move {
                    if hang {
                        release.notified().await;
                    }
                    Ok(())
                }
            }
        }))
        .await?;
    assert_eq!(handle.lanes(), 2);
    let stats = tokio::time::timeout(
        Duration::from_secs(10),
        handle.wait_until(|s| s.succeeded >= EVENTS - 1),
    )
    .await;
    release.notify_one();
    let stats = stats.map_err(|_| {
        format!(
            "only {} of the {} other events were handled while the first hung: the busy lane kept \
             what it took",
            handle.stats().succeeded,
            EVENTS - 1
        )
    })?;
    assert_eq!(stats.succeeded, EVENTS - 1);
    tokio::time::timeout(
        Duration::from_secs(10),
        handle.wait_until(|s| s.succeeded == EVENTS),
    )
    .await?;
    handle.shutdown().await?;
    Ok(())
}
