//! Tests against a real SQS endpoint (the ElasticMQ `scripts/brokers` starts) beyond the conformance
//! suite:
//!
//! * a delay longer than the visibility limit is carried, not capped (limits scaled down through
//!   configuration: 3 s of visibility, 1 s of send delay, a 7 s retry), through the retry queue and by
//!   visibility;
//! * without the retry queue, once `remembered_retries` retries wait, a retry on a standard queue is a
//!   copy carrying its history (the previous error and counts reach the handler), not a visibility change that loses it;
//! * a redrive policy that would move messages before the retry policy is spent stops the consumer from
//!   starting;
//! * a FIFO queue retries by visibility and dead-letters into its FIFO DLQ;
//! * a FIFO DLQ keeps one entry per dead-lettering: an event delivered twice and refused twice leaves
//!   one entry, and its replay refused again leaves a new one;
//! * a handler that runs longer than the visibility timeout keeps its message hidden (heartbeat), so it
//!   is not handled twice at once;
//! * a message whose producer used all ten attributes retries and dead-letters once, with the SDK's
//!   diagnostics and every attribute (read back with a raw client) kept.
//!
//! * with the `retry_queue` setting, a retry waits in the retry queue (read with a raw client: the
//!   source holds nothing meanwhile), returns with its history and leaves both queues empty; and a due
//!   retry runs while a backlog of healthy events still drains (`test_support::busy`).
//!
//! Without `RETRY_TEST_SQS` they are listed as ignored with the reason; with `RETRY_TEST_REQUIRE` naming
//! sqs, that is a failure.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_retry_core::adapter::{Admin, Transport};
use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::dlq::DlqFilter;
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{ConsumerHandle, Context, handler_fn};
use event_retry_sqs::{SqsConfig, SqsTransport};
use libtest_mimic::Arguments;
use raw_brokers::{RawBroker, RawSqs};

type Calls = Arc<Mutex<HashMap<String, Vec<Instant>>>>;

/// What a handler saw on each call: event id, attempts, retries, last error.
/// Each handler call: the event id, its attempts, its retries, its last error and its first-seen time
/// (milliseconds).
type Seen = Arc<Mutex<Vec<(String, u32, u32, Option<String>, Option<u64>)>>>;

fn main() {
    let args = Arguments::from_args();
    let tests = test_support::named_tests![
        through_the_retry_queue_a_retry_waits_there_with_its_history,
        through_the_retry_queue_a_due_retry_overtakes_the_backlog,
        beyond_the_remembered_retries_a_retry_carries_its_history,
        ten_attributes_retry_and_dead_letter_once,
        a_long_handler_keeps_its_message_hidden,
        long_delay_is_carried_not_capped,
        redrive_below_the_policy_is_refused,
        fifo_queue_retries_and_dead_letters,
        a_fifo_dlq_keeps_one_entry_per_dead_lettering,
        a_batch_handler_gets_one_event_per_call,
    ];
    let trials = test_support::broker::trials("sqs", "RETRY_TEST_SQS", &tests);
    libtest_mimic::run(&args, trials).exit();
}

fn block_on<F: Future<Output = Result<(), String>>>(f: F) -> Result<(), String> {
    test_support::broker::runtime()?.block_on(f)
}

/// SQS hands deliveries over one at a time (the adapter has no `next_ready`): with 20 events waiting, a
/// batch handler with batches of up to 32 gets each event once, in a call of its own.
fn a_batch_handler_gets_one_event_per_call(url: String) -> Result<(), String> {
    block_on(async move {
        let transport = SqsTransport::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("batch-{}", uuid::Uuid::new_v4().simple());
        let sizes = test_support::batch::drain_in_batches(
            &Broker::new(transport),
            &topic,
            test_support::batch::BatchDrain {
                events: 20,
                payload_bytes: 32,
                batch: 32,
                concurrency: None,
                call_time: Duration::ZERO,
                within: Duration::from_secs(60),
            },
        )
        .await?;
        if sizes.iter().any(|&n| n != 1) {
            return Err(format!("calls of more than one event: {sizes:?}"));
        }
        Ok(())
    })
}

/// A handler that records every call and fails as `fail` says (by event id and call number).
fn recording(
    calls: Calls,
    fail: fn(&str, usize) -> Option<HandlerError>,
) -> impl event_retry_core::runtime::Handler {
    handler_fn(move |event: Event, _ctx: Context| {
        let calls = calls.clone();
        async move {
            let id = event.id().unwrap_or_default().to_string();
            let n = {
                let mut calls = calls.lock().unwrap_or_else(|p| p.into_inner());
                let mine = calls.entry(id.clone()).or_default();
                mine.push(Instant::now());
                mine.len()
            };
            match fail(&id, n) {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
    })
}

async fn start(
    transport: &SqsTransport,
    topic: &str,
    policy: &str,
    handler: impl event_retry_core::runtime::Handler,
) -> Result<ConsumerHandle, String> {
    Broker::new(transport.clone())
        .consumer(topic)
        .policy(RetryPolicy::parse(policy).map_err(|e| e.to_string())?)
        .build()
        .map_err(|e| e.to_string())?
        .start(handler)
        .await
        .map_err(|e| e.to_string())
}

async fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A 7 s retry with 3 s of visibility and 1 s of send delay runs after 7 s or more, once, on either route.
fn long_delay_is_carried_not_capped(url: String) -> Result<(), String> {
    for retry_queue in [true, false] {
        long_delay_is_carried_on(&url, retry_queue)
            .map_err(|e| format!("with retry_queue={retry_queue}: {e}"))?;
    }
    Ok(())
}

/// One route of [`long_delay_is_carried_not_capped`]: through the retry queue or by visibility.
fn long_delay_is_carried_on(url: &str, retry_queue: bool) -> Result<(), String> {
    let url = url.to_string();
    block_on(async move {
        let config = SqsConfig {
            visibility: Duration::from_secs(2),
            max_visibility: Duration::from_secs(3),
            max_send_delay: Duration::from_secs(1),
            retry_queue,
            ..SqsConfig::default()
        };
        let transport = SqsTransport::connect_with(&url, config)
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("carried-{}", uuid::Uuid::new_v4().simple());
        let calls: Calls = Arc::default();
        let handler = recording(calls.clone(), |_, n| {
            (n == 1).then(|| HandlerError::deferred("later"))
        });
        let consumer = Broker::new(transport.clone())
            .consumer(&topic)
            .policy(RetryPolicy::parse("7s x1").map_err(|e| e.to_string())?)
            .build()
            .map_err(|e| e.to_string())?;
        let report = consumer.delay_report().to_string();
        if !report.contains("split") {
            return Err(format!(
                "the start-up check should say the 7 s delay is split into hops: {report}"
            ));
        }
        let consumer = consumer.start(handler).await.map_err(|e| e.to_string())?;
        transport
            .publish(&topic, &Event::new("long").with_id("long"))
            .await
            .map_err(|e| e.to_string())?;
        wait_until("the carried retry", Duration::from_secs(30), || {
            calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get("long")
                .is_some_and(|c| c.len() >= 2)
        })
        .await
        .map_err(|e| format!("{e}: {:?}", consumer.stats()))?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let at = calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get("long")
            .cloned()
            .unwrap_or_default();
        if at.len() != 2 {
            return Err(format!("handled {} times, want 2", at.len()));
        }
        let gap = at[1] - at[0];
        if gap < Duration::from_secs(7) {
            return Err(format!(
                "the retry ran after {gap:?}: capped below its 7 s delay"
            ));
        }
        eprintln!(
            "7 s retry with 3 s visibility and 1 s send delay (retry_queue={retry_queue}) ran after {gap:?}"
        );
        let stats = consumer.stats();
        if stats.succeeded_after_retry != 1 || stats.dead_lettered != 0 {
            return Err(format!("{stats:?}"));
        }
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        transport.delete(&topic).await.map_err(|e| e.to_string())
    })
}

/// A handler that records each call's event id, attempts, retries and last error in `seen`, and fails
/// as `fail` says (by event id and the retries before the call).
fn recording_history(
    seen: Seen,
    fail: fn(&str, u32) -> Option<HandlerError>,
) -> impl event_retry_core::runtime::Handler {
    handler_fn(move |event: Event, _ctx: Context| {
        let seen = seen.clone();
        async move {
            let meta = event.metadata();
            let id = event.id().unwrap_or_default().to_string();
            seen.lock().unwrap_or_else(|p| p.into_inner()).push((
                id.clone(),
                meta.attempts,
                meta.retries,
                meta.last_error.clone(),
                meta.first_seen.map(|t| t.as_millis()),
            ));
            match fail(&id, meta.retries) {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
    })
}

/// Publishes `count` events with ids `<prefix>0`, `<prefix>1`, … to `topic`; their ids.
async fn publish_ids(
    transport: &SqsTransport,
    topic: &str,
    prefix: &str,
    count: usize,
) -> Result<Vec<String>, String> {
    let ids: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    for id in &ids {
        transport
            .publish(topic, &Event::new("x").with_id(id))
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(ids)
}

/// The settings of the retry-queue tests: retries through `<queue>-retry`.
fn through_a_retry_queue() -> SqsConfig {
    SqsConfig {
        retry_queue: true,
        ..SqsConfig::default()
    }
}

/// Three events fail once under `3s x1`: while their retries wait, the retry queue holds three messages
/// and the source none (read with a raw client); each second call sees one attempt and one retry before
/// it, and the first call's error; afterwards both queues and the DLQ are empty.
fn through_the_retry_queue_a_retry_waits_there_with_its_history(url: String) -> Result<(), String> {
    block_on(async move {
        let transport = SqsTransport::connect_with(&url, through_a_retry_queue())
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("retry-queue-{}", uuid::Uuid::new_v4().simple());
        let retry_queue = format!("{topic}-retry");
        let seen: Seen = Arc::default();
        let handler = recording_history(seen.clone(), |id, retries| {
            (retries == 0).then(|| HandlerError::deferred(format!("boom {id}")))
        });
        let consumer = start(&transport, &topic, "3s x1", handler).await?;
        let ids = publish_ids(&transport, &topic, "q", 3).await?;
        wait_until("three retries scheduled", Duration::from_secs(30), || {
            consumer.stats().retries_scheduled >= 3
        })
        .await
        .map_err(|e| format!("{e}: {:?}", consumer.stats()))?;
        let raw = RawSqs::new(&url);
        let waiting = |queue: String| {
            let raw = &raw;
            async move {
                raw.waiting(&queue, "")
                    .await
                    .map_err(|e| format!("count the messages of {queue}: {e}"))
            }
        };
        let (in_retry, in_source) = (
            waiting(retry_queue.clone()).await?,
            waiting(topic.clone()).await?,
        );
        if (in_retry, in_source) != (3, 0) {
            return Err(format!(
                "while the retries wait, {retry_queue} holds {in_retry} and {topic} {in_source}; want 3 and 0"
            ));
        }
        wait_until("three retries succeeded", Duration::from_secs(60), || {
            consumer.stats().succeeded_after_retry >= 3
        })
        .await
        .map_err(|e| format!("{e}: {:?}", consumer.stats()))?;
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for id in &ids {
            let calls: Vec<_> = seen.iter().filter(|c| &c.0 == id).collect();
            let want_error = Some(format!("boom {id}"));
            if calls.len() != 2 || calls[1].1 != 1 || calls[1].2 != 1 || calls[1].3 != want_error {
                return Err(format!(
                    "{id}: want two calls, the second after one attempt and one retry, with the first's error: {calls:?}"
                ));
            }
        }
        let left = (
            waiting(retry_queue.clone()).await?,
            waiting(topic.clone()).await?,
            waiting(format!("{topic}-dlq")).await?,
        );
        if left != (0, 0, 0) {
            return Err(format!(
                "afterwards the retry queue, the source and the DLQ hold {left:?}; want none"
            ));
        }
        transport.delete(&topic).await.map_err(|e| e.to_string())?;
        if waiting(retry_queue.clone()).await.is_ok() {
            return Err(format!(
                "{retry_queue} is still there after the topic was deleted"
            ));
        }
        Ok(())
    })
}

/// `test_support::busy::a_due_retry_overtakes_the_backlog` with the retry queue: 20 retries due while
/// 3,000 healthy events still drain each run before three quarters of them are done.
fn through_the_retry_queue_a_due_retry_overtakes_the_backlog(url: String) -> Result<(), String> {
    block_on(async move {
        let transport = SqsTransport::connect_with(&url, through_a_retry_queue())
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("overtake-{}", uuid::Uuid::new_v4().simple());
        let broker = Broker::new(transport.clone());
        let result = test_support::busy::a_due_retry_overtakes_the_backlog(&broker, &topic).await;
        let _ = transport.delete(&topic).await;
        result
    })
}

/// With room to remember one retry, five events retry at once: every retry — the remembered one and the
/// four carried by copies — must reach the handler with the previous call's error and counts, and the
/// DLQ entries (read with aws-sdk-sqs) hold the last error and the first-seen time of the first call:
/// every call of an event, and its DLQ entry, carry the one first-seen time its first call had.
fn beyond_the_remembered_retries_a_retry_carries_its_history(url: String) -> Result<(), String> {
    block_on(async move {
        // About the visibility path: a retry queue would carry every retry by a copy.
        let config = SqsConfig {
            remembered_retries: 1,
            retry_queue: false,
            ..SqsConfig::default()
        };
        let transport = SqsTransport::connect_with(&url, config)
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("remembered-{}", uuid::Uuid::new_v4().simple());
        let seen: Seen = Arc::default();
        let handler = recording_history(seen.clone(), |id, retries| {
            Some(HandlerError::deferred(format!(
                "boom {id} after {retries} retries"
            )))
        });
        let consumer = start(&transport, &topic, "1s x2", handler).await?;
        let ids = publish_ids(&transport, &topic, "r", 5).await?;
        wait_until("five dead letters", Duration::from_secs(60), || {
            consumer.stats().dead_lettered >= 5
        })
        .await
        .map_err(|e| format!("{e}: {:?}", consumer.stats()))?;
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut first_seen = HashMap::new();
        for id in &ids {
            let calls: Vec<_> = seen.iter().filter(|c| &c.0 == id).collect();
            if calls.len() != 3 {
                return Err(format!(
                    "{id} handled {} times, want 3: {calls:?}",
                    calls.len()
                ));
            }
            let first = calls[0]
                .4
                .ok_or(format!("{id}'s first call had no first-seen time"))?;
            if calls.iter().any(|c| c.4 != Some(first)) {
                return Err(format!(
                    "{id}'s first-seen time changed between calls (a copy stamped its own): {calls:?}"
                ));
            }
            first_seen.insert(id.clone(), first.to_string());
            for (n, call) in calls.iter().enumerate() {
                let n = n as u32;
                let want_error = (n > 0).then(|| format!("boom {id} after {} retries", n - 1));
                if call.2 != n || call.3 != want_error {
                    return Err(format!(
                        "{id}'s call {} saw retries {} and last error {:?}, want {n} and {want_error:?} \
                         (the retry lost its history): {calls:?}",
                        n + 1,
                        call.2,
                        call.3
                    ));
                }
            }
        }
        let dead = RawSqs::new(&url)
            .messages(&format!("{topic}-dlq"))
            .await
            .map_err(|e| e.to_string())?;
        if dead.len() != 5 {
            return Err(format!("the DLQ holds {} messages, want 5", dead.len()));
        }
        for m in &dead {
            let packed = String::from_utf8_lossy(m.header("x-retry").unwrap_or_default());
            let fields: HashMap<String, String> =
                serde_json::from_str(&packed).map_err(|e| format!("{e}: {packed}"))?;
            let field = |name: &str| fields.get(name).map(String::as_str);
            let id = field("event-id").unwrap_or_default();
            let want_error = format!("boom {id} after 2 retries");
            let want_first_seen = first_seen.get(id).map(String::as_str);
            if field("retries") != Some("2")
                || field("last-error") != Some(want_error.as_str())
                || field("last-delay-ms") != Some("1000")
                || want_first_seen.is_none()
                || field("first-seen") != want_first_seen
            {
                return Err(format!(
                    "a DLQ entry's history is incomplete (want retries 2, {want_error:?}, last delay \
                     1000 ms, the first call's first-seen time {want_first_seen:?}): {packed}"
                ));
            }
        }
        transport.delete(&topic).await.map_err(|e| e.to_string())
    })
}

fn a_long_handler_keeps_its_message_hidden(url: String) -> Result<(), String> {
    block_on(async move {
        let config = SqsConfig {
            visibility: Duration::from_secs(2),
            ..SqsConfig::default()
        };
        let transport = SqsTransport::connect_with(&url, config)
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("heartbeat-{}", uuid::Uuid::new_v4().simple());
        let calls: Calls = Arc::default();
        let seen = calls.clone();
        let handler = handler_fn(move |event: Event, _ctx: Context| {
            let seen = seen.clone();
            async move {
                let id = event.id().unwrap_or_default().to_string();
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(id)
                    .or_default()
                    .push(Instant::now());
                tokio::time::sleep(Duration::from_secs(7)).await;
                Ok::<(), HandlerError>(())
            }
        });
        // Two consumers: without the heartbeat, the second would receive the message once its 2 s
        // visibility ran out, while the first still handles it.
        let a = start(&transport, &topic, "1s x1", handler.clone()).await?;
        let b = start(&transport, &topic, "1s x1", handler).await?;
        transport
            .publish(&topic, &Event::new("slow").with_id("slow"))
            .await
            .map_err(|e| e.to_string())?;
        wait_until(
            "the slow handler to finish",
            Duration::from_secs(30),
            || a.stats().succeeded + b.stats().succeeded >= 1,
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let n = calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get("slow")
            .map_or(0, Vec::len);
        if n != 1 {
            return Err(format!(
                "a 7 s handler with 2 s visibility was called {n} times, want 1"
            ));
        }
        a.shutdown().await.map_err(|e| e.to_string())?;
        b.shutdown().await.map_err(|e| e.to_string())?;
        transport.delete(&topic).await.map_err(|e| e.to_string())
    })
}

fn redrive_below_the_policy_is_refused(url: String) -> Result<(), String> {
    block_on(async move {
        let config = SqsConfig {
            max_receive_count: 3,
            ..SqsConfig::default()
        };
        let transport = SqsTransport::connect_with(&url, config)
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("redrive-{}", uuid::Uuid::new_v4().simple());
        transport
            .declare(&topic, None)
            .await
            .map_err(|e| e.to_string())?;
        let calls: Calls = Arc::default();
        let refused = start(
            &transport,
            &topic,
            "1s x5",
            recording(calls.clone(), |_, _| None),
        )
        .await;
        let result = match refused {
            Err(e) if e.contains("raise maxReceiveCount above 6") => Ok(()),
            Err(e) => Err(format!("refused, but not for the redrive policy: {e}")),
            Ok(c) => {
                let _ = c.shutdown().await;
                Err("a consumer whose policy needs 6 deliveries started on a queue that redrives after 3".into())
            }
        };
        let fine = start(&transport, &topic, "1s x1", recording(calls, |_, _| None)).await?;
        fine.shutdown().await.map_err(|e| e.to_string())?;
        transport.delete(&topic).await.map_err(|e| e.to_string())?;
        result
    })
}

/// Every dead letter of `topic`, through the SDK's DLQ operations.
async fn dead_letters(
    transport: &SqsTransport,
    topic: &str,
) -> Result<Vec<event_retry_core::dlq::DeadLetter>, String> {
    Broker::new(transport.clone())
        .dead_letters()
        .list(topic, &DlqFilter::all())
        .await
        .map_err(|e| e.to_string())
}

/// A new FIFO queue named `<prefix>-<uuid>.fifo`, declared with its DLQ: the transport, the queue and the
/// DLQ's name.
async fn fifo_queue(url: &str, prefix: &str) -> Result<(SqsTransport, String, String), String> {
    let transport = SqsTransport::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let topic = format!("{prefix}-{}.fifo", uuid::Uuid::new_v4().simple());
    transport
        .declare(&topic, None)
        .await
        .map_err(|e| e.to_string())?;
    let dlq = transport
        .names(&topic, None)
        .await
        .map_err(|e| e.to_string())?
        .dlq;
    Ok((transport, topic, dlq))
}

fn fifo_queue_retries_and_dead_letters(url: String) -> Result<(), String> {
    block_on(async move {
        let (transport, topic, dlq) = fifo_queue(&url, "fifo").await?;
        if !dlq.ends_with("-dlq.fifo") {
            return Err(format!("FIFO DLQ named {dlq}"));
        }
        let calls: Calls = Arc::default();
        let handler = recording(calls.clone(), |id, n| match (id, n) {
            ("flaky", 1) => Some(HandlerError::deferred("not yet")),
            ("bad", _) => Some(HandlerError::non_retryable("bad input")),
            _ => None,
        });
        let consumer = start(&transport, &topic, "2s x2", handler).await?;
        for (id, key) in [("flaky", "k1"), ("bad", "k2"), ("fine", "k3")] {
            transport
                .publish(&topic, &Event::new(id).with_id(id).with_key(key))
                .await
                .map_err(|e| e.to_string())?;
        }
        wait_until(
            "flaky and fine to succeed, bad to be dead-lettered",
            Duration::from_secs(30),
            || {
                let stats = consumer.stats();
                stats.succeeded >= 2 && stats.dead_lettered >= 1
            },
        )
        .await?;
        let dead = dead_letters(&transport, &topic).await?;
        if dead.len() != 1
            || dead[0].event.id() != Some("bad")
            || dead[0].event.key.as_deref() != Some(&b"k2"[..])
        {
            return Err(format!("FIFO DLQ: {dead:?}"));
        }
        let flaky = calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get("flaky")
            .cloned()
            .unwrap_or_default();
        if flaky.len() != 2 || flaky[1] - flaky[0] < Duration::from_secs(2) {
            return Err(format!(
                "flaky: {} calls, gap {:?}",
                flaky.len(),
                flaky.get(1).map(|t| *t - flaky[0])
            ));
        }
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        transport.delete(&topic).await.map_err(|e| e.to_string())
    })
}

fn a_fifo_dlq_keeps_one_entry_per_dead_lettering(url: String) -> Result<(), String> {
    block_on(async move {
        let (transport, topic, dlq) = fifo_queue(&url, "fifo-dedup").await?;
        let calls: Calls = Arc::default();
        let handler = recording(calls.clone(), |_, _| {
            Some(HandlerError::non_retryable("refused"))
        });
        let consumer = start(&transport, &topic, "1s x1", handler).await?;
        // The same event twice (two messages, as a redelivery of a settled-late original would be).
        for _ in 0..2 {
            transport
                .publish(&topic, &Event::new("x").with_id("twice").with_key("k"))
                .await
                .map_err(|e| e.to_string())?;
        }
        wait_until(
            "both deliveries dead-lettered",
            Duration::from_secs(30),
            || consumer.stats().dead_lettered >= 2,
        )
        .await?;
        let raw = RawSqs::new(&url);
        let held = raw.waiting(&dlq, "").await.map_err(|e| e.to_string())?;
        if held != 1 {
            return Err(format!(
                "{held} entries in {dlq} after two dead letters of one event"
            ));
        }
        // A replay refused again is a new dead-lettering (replay count 1): kept, not dropped as a copy.
        let replayed = Broker::new(transport.clone())
            .dead_letters()
            .replay(&topic, &DlqFilter::all())
            .await
            .map_err(|e| e.to_string())?;
        wait_until("the replay dead-lettered", Duration::from_secs(30), || {
            consumer.stats().dead_lettered >= 3
        })
        .await?;
        let dead = dead_letters(&transport, &topic).await?;
        let replays: Vec<u32> = dead
            .iter()
            .map(|d| d.event.metadata().replay_count)
            .collect();
        if replayed.replayed != 1 || replays != [1] {
            return Err(format!(
                "replayed {}, then the DLQ held entries with replay counts {replays:?} (want [1])",
                replayed.replayed
            ));
        }
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        transport.delete(&topic).await.map_err(|e| e.to_string())
    })
}

/// A producer used all ten attributes: the SDK's metadata has no attribute of its own left. The event
/// still retries (a visibility retry), then dead-letters once with the reason and its history. The DLQ
/// copy read through the SDK has the ten as headers, each with its original bytes; read raw, every
/// original is there with its data type and value, either as an attribute or carried in the packed
/// `x-retry` attribute's list (what did not fit beside the SDK's own).
fn ten_attributes_retry_and_dead_letter_once(url: String) -> Result<(), String> {
    use aws_sdk_sqs::types::MessageAttributeValue;
    block_on(async move {
        let transport = SqsTransport::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("ten-{}", uuid::Uuid::new_v4().simple());
        transport
            .declare(&topic, None)
            .await
            .map_err(|e| e.to_string())?;
        let client = raw_client(&url);
        let queue_url = |name: String| {
            let client = client.clone();
            async move {
                client
                    .get_queue_url()
                    .queue_name(name)
                    .send()
                    .await
                    .map_err(|e| e.to_string())
                    .map(|o| o.queue_url.unwrap_or_default())
            }
        };
        let mut attributes = HashMap::new();
        for i in 0..9 {
            attributes.insert(
                format!("attr-{i}"),
                MessageAttributeValue::builder()
                    .data_type(if i % 2 == 0 { "String" } else { "Number" })
                    .string_value(format!("{i}"))
                    .build()
                    .map_err(|e| e.to_string())?,
            );
        }
        attributes.insert(
            "zz-binary".into(),
            MessageAttributeValue::builder()
                .data_type("Binary.custom")
                .binary_value(aws_sdk_sqs::primitives::Blob::new(vec![0xffu8, 0]))
                .build()
                .map_err(|e| e.to_string())?,
        );
        client
            .send_message()
            .queue_url(queue_url(topic.clone()).await?)
            .message_body("ten")
            .set_message_attributes(Some(attributes.clone()))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let calls: Calls = Arc::default();
        let seen = calls.clone();
        let handler = handler_fn(move |event: Event, _ctx: Context| {
            let calls = seen.clone();
            async move {
                let n = {
                    let mut calls = calls.lock().unwrap_or_else(|p| p.into_inner());
                    let mine = calls.entry("ten".to_string()).or_default();
                    mine.push(Instant::now());
                    mine.len()
                };
                if event.headers.len() != 10 {
                    return Err(HandlerError::non_retryable(format!(
                        "{} headers reached the handler",
                        event.headers.len()
                    )));
                }
                Err(if n == 1 {
                    HandlerError::deferred("once more")
                } else {
                    HandlerError::non_retryable("refused for good")
                })
            }
        });
        let consumer = start(&transport, &topic, "1s x3", handler).await?;
        wait_until("the dead letter", Duration::from_secs(30), || {
            consumer.stats().dead_lettered >= 1
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let n = calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get("ten")
            .map_or(0, Vec::len);
        let stats = consumer.stats();
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        if n != 2 || stats.dead_lettered != 1 || stats.settle_errors != 0 {
            return Err(format!("{n} handler calls (want 2); {stats:?}"));
        }
        let dead = dead_letters(&transport, &topic).await?;
        let [entry] = dead.as_slice() else {
            return Err(format!("{} DLQ entries, want 1", dead.len()));
        };
        let meta = entry.event.metadata();
        if entry.event.headers.len() != 10
            || meta.attempts != 2
            || meta.last_error.as_deref() != Some("refused for good")
            || meta.dead.is_none()
        {
            return Err(format!("the DLQ entry lost something: {entry:?}"));
        }
        for (name, value) in entry.event.headers.iter() {
            let original = attributes.get(name).ok_or(format!(
                "the DLQ entry has a header {name:?} no attribute had"
            ))?;
            let want: &[u8] = match (original.string_value(), original.binary_value()) {
                (Some(text), _) => text.as_bytes(),
                (None, Some(blob)) => blob.as_ref(),
                (None, None) => b"",
            };
            if value.as_ref() != want {
                return Err(format!("header {name}: {value:?}, was {want:?}"));
            }
        }
        // Raw: the attributes on the message, the SDK's `x-retry` among them, and the rest carried in
        // its list; together, exactly the ten originals.
        let dlq_url = queue_url(format!("{topic}-dlq")).await?;
        let got = client
            .receive_message()
            .queue_url(&dlq_url)
            .message_attribute_names("All")
            .visibility_timeout(0)
            .wait_time_seconds(2)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let message = got
            .messages()
            .first()
            .ok_or("the raw client found no DLQ message")?;
        let raw_attrs = message.message_attributes().cloned().unwrap_or_default();
        if raw_attrs.len() != 10 || !raw_attrs.contains_key("x-retry") {
            return Err(format!("raw DLQ attributes: {:?}", raw_attrs.keys()));
        }
        let mut restored: HashMap<String, MessageAttributeValue> = raw_attrs
            .iter()
            .filter(|(name, _)| name.as_str() != "x-retry")
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        let packed = raw_attrs["x-retry"].string_value().unwrap_or_default();
        let packed: serde_json::Value =
            serde_json::from_str(packed).map_err(|e| format!("x-retry: {e}: {packed}"))?;
        for carried in packed["attributes"].as_array().into_iter().flatten() {
            let text = |key: &str| carried[key].as_str().map(str::to_string);
            let name =
                text("name").ok_or(format!("a carried attribute without a name: {carried}"))?;
            let mut value =
                MessageAttributeValue::builder().data_type(text("type").unwrap_or_default());
            if let Some(string) = text("string") {
                value = value.string_value(string);
            }
            if let Some(binary) = text("binary") {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(&binary)
                    .map_err(|e| format!("carried {name}: {e}"))?;
                value = value.binary_value(aws_sdk_sqs::primitives::Blob::new(bytes));
            }
            let value = value.build().map_err(|e| e.to_string())?;
            if restored.insert(name.clone(), value).is_some() {
                return Err(format!("{name} both an attribute and carried in x-retry"));
            }
        }
        if restored != attributes {
            return Err(format!(
                "the raw DLQ copy's attributes, carried ones included, are not the originals: \
                 {restored:?}, were {attributes:?}"
            ));
        }
        transport.delete(&topic).await.map_err(|e| e.to_string())
    })
}

fn raw_client(url: &str) -> aws_sdk_sqs::Client {
    use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(url)
        .credentials_provider(Credentials::new("local", "local", None, None, "test"))
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}
