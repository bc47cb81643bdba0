//! Tests against the real broker that the conformance suite does not cover:
//!
//! * a RabbitMQ restart (stop + start through the project's scripts, on the same data) while retries sit
//!   in the delay ladder loses none of them: durable queues and persistent messages keep them, the
//!   consumer reconnects, and every retry runs once, no earlier than its delay;
//! * under concurrent publishing, a return (unroutable copy) fails its own publish and no other;
//! * with quorum queues (replicated work queue, DLQ and ladder) retries and dead letters behave the same;
//! * a topic deleted while its retries wait in the ladder stalls no other topic's retries, with quorum
//!   and with classic queues: its copies, due at an exit that routes them nowhere, go to the ladder's
//!   `unroutable` queue (read with lapin), and a live topic's retry behind them comes back on time;
//! * acknowledgements sent in batches (`basic.ack` with `multiple`) settle every delivery once, with
//!   handlers finishing out of order, retries through the ladder, and deliveries requeued at a shutdown
//!   cut in the middle: every event succeeds exactly once and the queue, read with lapin, ends empty;
//! * a connection lost while a DLQ outage holds consumption ends the hold: the delivery's channel died
//!   with it, so the broker gives the event again; once the DLQ is back the event lands there once and
//!   consumption goes on (before, the held dead letter was retried on the dead channel for ever).
//!
//! * a transport dropped without `close` stops moving its delay ladder: each level of its own ladder has
//!   one consumer while it lives and none once it is dropped (read with `rabbitmqctl list_queues`);
//!
//! * closing a transport while its movers send copies on sends each copy on once: the ladder's exit
//!   and levels, read with lapin, hold exactly the copies put in;
//!
//! * a due retry runs while a backlog of healthy events waits in the work queue (it comes back to the
//!   group's retry queue, read first), with classic and with quorum queues;
//!
//! They run one at a time (the restart would disturb the other) when `RETRY_TEST_AMQP` names a broker
//! started by `scripts/brokers`; otherwise they are listed as ignored with the reason, and fail when
//! `RETRY_TEST_REQUIRE` names rabbitmq.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_retry_core::adapter::{Admin, Transport};
use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::dlq::{DeadLetter, DlqFilter};
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{Context, handler_fn};
use event_retry_rabbitmq::{QueueType, RabbitConfig, RabbitTransport};
use libtest_mimic::Arguments;
use test_support::broker::runtime;
use test_support::restart::{Waits, delayed_retries_survive_restart};

const EVENTS: usize = 20;
const DELAY: Duration = Duration::from_secs(20);

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    let tests = test_support::named_tests![
        closing_mid_move_sends_each_copy_on_once,
        a_dropped_transport_stops_moving_its_ladder,
        a_batch_handler_gets_more_than_one_held_event_per_call,
        a_due_retry_overtakes_the_backlog,
        a_due_retry_overtakes_the_backlog_on_quorum_queues,
        a_deleted_topics_waiting_retries_stall_no_other_topic,
        a_deleted_topics_waiting_retries_stall_no_other_topic_classic,
        a_connection_lost_in_a_dlq_outage_ends_the_hold,
        batched_acks_settle_every_delivery_once,
        returns_are_paired_with_their_own_publish,
        quorum_queues_retry_and_dead_letter,
        restart_keeps_delayed_retries,
    ];
    let trials = test_support::broker::trials("rabbitmq", "RETRY_TEST_AMQP", &tests);
    libtest_mimic::run(&args, trials).exit();
}

/// Deletes `topic`'s DLQ queue with lapin: dead-lettering from it fails until the topic is declared
/// again (the SDK still takes it as declared).
async fn delete_dlq(url: &str, transport: &RabbitTransport, topic: &str) -> Result<(), String> {
    let dlq = transport
        .names(topic, None)
        .await
        .map_err(|e| e.to_string())?
        .dlq;
    raw_brokers::RawRabbit::new(url)
        .delete_queue(&dlq)
        .await
        .map_err(|e| format!("delete {dlq}: {e}"))
}

/// The DLQ entries of `topic`, read through the SDK's DLQ operations.
async fn dead_letters(transport: &RabbitTransport, topic: &str) -> Result<Vec<DeadLetter>, String> {
    Broker::new(transport.clone())
        .dead_letters()
        .list(topic, &DlqFilter::all())
        .await
        .map_err(|e| e.to_string())
}

/// Runs `rabbitmqctl -q -n <node> <args>` on the node `RETRY_TEST_AMQP_NODE` names; its output, or
/// its error.
async fn rabbitmqctl(args: &[&str]) -> Result<String, String> {
    let ctl = raw_brokers::Rabbitmqctl::from_env("RETRY_TEST_AMQP")
        .ok_or("RETRY_TEST_AMQP_NODE is not set (scripts/brokers writes it)")?;
    ctl.run(args).await.map_err(|e| e.to_string())
}

/// Closes every client connection to the node `RETRY_TEST_AMQP_NODE` names, with `rabbitmqctl`.
async fn close_all_connections() -> Result<(), String> {
    rabbitmqctl(&["close_all_connections", "test: connection lost"])
        .await
        .map(drop)
}

/// The DLQ refuses the victim's dead letter, so the runtime holds consumption and tries again; then every
/// connection is closed (as a broker restart does) and the DLQ comes back. The held delivery's channel
/// died, so the broker gives the victim again: it must land in the DLQ exactly once and the event
/// published behind it must be handled, within 30 s.
fn a_connection_lost_in_a_dlq_outage_ends_the_hold(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        let transport = RabbitTransport::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("lost-in-outage-{}", uuid::Uuid::new_v4().simple());
        transport
            .declare(&topic, None)
            .await
            .map_err(|e| e.to_string())?;
        delete_dlq(&url, &transport, &topic).await?;
        let handler = handler_fn(|event: Event, _ctx: Context| async move {
            match event.id() {
                Some("victim") => Err(HandlerError::non_retryable("bad input")),
                _ => Ok(()),
            }
        });
        let consumer = Broker::new(transport.clone())
            .consumer(&topic)
            .blocking(RetryPolicy::parse("200ms").map_err(|e| e.to_string())?)
            .build()
            .map_err(|e| e.to_string())?
            .start(handler)
            .await
            .map_err(|e| e.to_string())?;
        transport
            .publish(&topic, &Event::new("victim").with_id("victim"))
            .await
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(
            Duration::from_secs(15),
            consumer.wait_until(|s| s.settle_errors >= 2),
        )
        .await
        .map_err(|_| format!("the DLQ outage was not met: {:?}", consumer.stats()))?;
        close_all_connections().await?;
        transport
            .declare(&topic, None)
            .await
            .map_err(|e| e.to_string())?;
        transport
            .publish(&topic, &Event::new("after").with_id("after"))
            .await
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let dead = loop {
            let dead = dead_letters(&transport, &topic).await?;
            if consumer.stats().succeeded == 1 && !dead.is_empty() {
                break dead;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "30 s after the connections closed and the DLQ came back: {} DLQ entries, {:?} \
                     (consumption still held?)",
                    dead.len(),
                    consumer.stats()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // A dead letter repeated on the dead channel would show as a second entry.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let dead = if dead.len() == 1 {
            dead_letters(&transport, &topic).await?
        } else {
            dead
        };
        let ids: Vec<_> = dead
            .iter()
            .map(|d| d.event.id().unwrap_or_default().to_string())
            .collect();
        if ids != ["victim"] {
            return Err(format!("DLQ entries {ids:?}, want the victim once"));
        }
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        transport.delete(&topic).await.map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// A transport on quorum queues, its other settings the defaults.
async fn quorum_transport(url: &str) -> Result<RabbitTransport, String> {
    let config = RabbitConfig {
        queue_type: QueueType::Quorum,
        ..RabbitConfig::default()
    };
    RabbitTransport::connect_with(url, config)
        .await
        .map_err(|e| e.to_string())
}

/// A quorum-queue transport: an event failing twice retries through the quorum ladder (never early) and
/// succeeds; a non-retryable one lands in the quorum DLQ with its metadata and replays from it.
fn quorum_queues_retry_and_dead_letter(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        let transport = quorum_transport(&url).await?;
        let topic = format!("quorum-{}", uuid::Uuid::new_v4().simple());
        let calls: Arc<Mutex<HashMap<String, Vec<Instant>>>> = Arc::default();
        let seen = calls.clone();
        let handler = handler_fn(move |event: Event, _ctx: Context| {
            let seen = seen.clone();
            async move {
                let id = event.id().unwrap_or_default().to_string();
                let n = {
                    let mut calls = seen.lock().unwrap_or_else(|p| p.into_inner());
                    let mine = calls.entry(id.clone()).or_default();
                    mine.push(Instant::now());
                    mine.len()
                };
                match (id.as_str(), n) {
                    ("bad", 1) => Err(HandlerError::non_retryable("bad input")),
                    ("flaky", 1 | 2) => Err(HandlerError::deferred("not yet")),
                    _ => Ok(()),
                }
            }
        });
        let policy = RetryPolicy::parse("700ms x3").map_err(|e| e.to_string())?;
        let consumer = Broker::new(transport.clone())
            .consumer(&topic)
            .policy(policy)
            .build()
            .map_err(|e| e.to_string())?
            .start(handler)
            .await
            .map_err(|e| e.to_string())?;
        for id in ["flaky", "bad"] {
            transport
                .publish(&topic, &Event::new(id).with_id(id).with_key("k"))
                .await
                .map_err(|e| e.to_string())?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let dead = loop {
            let dead = dead_letters(&transport, &topic).await?;
            if consumer.stats().succeeded_after_retry == 1 && dead.len() == 1 {
                break dead;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no retry success and DLQ entry: {:?}, DLQ {}",
                    consumer.stats(),
                    dead.len()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let flaky = calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get("flaky")
            .cloned()
            .unwrap_or_default();
        if flaky.len() != 3 {
            return Err(format!("flaky was handled {} times, want 3", flaky.len()));
        }
        for pair in flaky.windows(2) {
            if pair[1] - pair[0] < Duration::from_millis(700) {
                return Err(format!(
                    "a quorum-ladder retry ran after {:?}, before its 700 ms delay",
                    pair[1] - pair[0]
                ));
            }
        }
        let meta = dead[0].event.metadata();
        if meta.event_id.as_deref() != Some("bad")
            || dead[0].event.key.as_deref() != Some(&b"k"[..])
        {
            return Err(format!("wrong DLQ entry: {:?}", dead[0]));
        }
        let report = Broker::new(transport.clone())
            .dead_letters()
            .replay(&topic, &DlqFilter::all())
            .await
            .map_err(|e| e.to_string())?;
        if report.replayed != 1 {
            return Err(format!("replayed {}", report.replayed));
        }
        let replayed = tokio::time::timeout(
            Duration::from_secs(15),
            consumer.wait_until(|s| s.succeeded >= 2),
        )
        .await;
        if replayed.is_err() {
            return Err(format!(
                "the replayed event did not succeed: {:?}",
                consumer.stats()
            ));
        }
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        transport.delete(&topic).await.map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// Copies of the deleted topic: without somewhere to go each would come back to the ladder's mover as a
/// return and hold up its level.
const ORPHANS: usize = 50;

/// A ladder of its own (a fresh prefix, 6 levels): `ORPHANS` events of one topic fail and wait 4 s in
/// the quorum ladder; the topic is deleted; then an event of a live topic fails and waits 4 s behind
/// them. The live retry must run within 12 s of its first attempt, the `unroutable` queue must hold
/// exactly the deleted topic's copies, and every delay level must end empty (each read with lapin).
/// The delete must end before the first copy is due (else that copy would find the topic's retry queue
/// still there): the test says so, rather than failing on the unroutable queue, if it did not.
fn a_deleted_topics_waiting_retries_stall_no_other_topic(url: String) -> Result<(), String> {
    deleted_topic_in_a_ladder_of_its_own(url, QueueType::Quorum)
}

/// The same with classic queues (the default).
fn a_deleted_topics_waiting_retries_stall_no_other_topic_classic(
    url: String,
) -> Result<(), String> {
    deleted_topic_in_a_ladder_of_its_own(url, QueueType::Classic)
}

fn deleted_topic_in_a_ladder_of_its_own(url: String, queue_type: QueueType) -> Result<(), String> {
    runtime()?.block_on(async move {
        let prefix = format!("stall-{}", uuid::Uuid::new_v4().simple());
        let config = RabbitConfig {
            prefix: prefix.clone(),
            levels: 6,
            queue_type,
            ..RabbitConfig::default()
        };
        let ladder = format!("{prefix}.ladder-100ms-{}", queue_type.as_str());
        let transport = RabbitTransport::connect_with(&url, config)
            .await
            .map_err(|e| e.to_string())?;
        let result = deleted_topic_then_live_retry(&transport, &url, &ladder).await;
        transport.close().await;
        let cleanup = delete_ladder(&url, &ladder, 6).await;
        result.and(cleanup)
    })
}

async fn deleted_topic_then_live_retry(
    transport: &RabbitTransport,
    url: &str,
    ladder: &str,
) -> Result<(), String> {
    let suffix = uuid::Uuid::new_v4().simple();
    let (gone, live) = (format!("gone-{suffix}"), format!("live-{suffix}"));
    const DELAY: Duration = Duration::from_secs(4);
    let policy = RetryPolicy::parse("4s x1").map_err(|e| e.to_string())?;
    let broker = Broker::new(transport.clone());

    let first_orphan_failed: Arc<Mutex<Option<Instant>>> = Arc::default();
    let failed = first_orphan_failed.clone();
    let always_fails = handler_fn(move |_event: Event, _ctx: Context| {
        failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(Instant::now);
        async move { Err::<(), _>(HandlerError::deferred("waits in the ladder")) }
    });
    let doomed = broker
        .consumer(&gone)
        .policy(policy.clone())
        .build()
        .map_err(|e| e.to_string())?
        .start(always_fails)
        .await
        .map_err(|e| e.to_string())?;
    for i in 0..ORPHANS {
        let id = format!("orphan-{i:02}");
        transport
            .publish(&gone, &Event::new(id.clone()).with_id(id))
            .await
            .map_err(|e| e.to_string())?;
    }
    let in_ladder = tokio::time::timeout(
        Duration::from_secs(30),
        doomed.wait_until(|s| s.retries_scheduled >= ORPHANS as u64),
    )
    .await;
    if in_ladder.is_err() {
        return Err(format!(
            "the copies never reached the ladder: {:?}",
            doomed.stats()
        ));
    }
    doomed.shutdown().await.map_err(|e| e.to_string())?;
    transport.delete(&gone).await.map_err(|e| e.to_string())?;
    let since_first_failure = first_orphan_failed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .map(|t| t.elapsed())
        .unwrap_or_default();
    if since_first_failure >= DELAY {
        return Err(format!(
            "inconclusive: the topic's delete ended {since_first_failure:?} after its first copy \
             went to the ladder, so that copy was due before the topic was gone"
        ));
    }

    let first_call: Arc<Mutex<Option<Instant>>> = Arc::default();
    let seen = first_call.clone();
    let fails_once = handler_fn(move |_event: Event, ctx: Context| {
        let seen = seen.clone();
        async move {
            if ctx.attempt == 1 {
                *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                Err(HandlerError::deferred("comes back in 4 s"))
            } else {
                Ok(())
            }
        }
    });
    let consumer = broker
        .consumer(&live)
        .policy(policy)
        .build()
        .map_err(|e| e.to_string())?
        .start(fails_once)
        .await
        .map_err(|e| e.to_string())?;
    transport
        .publish(&live, &Event::new("late").with_id("late"))
        .await
        .map_err(|e| e.to_string())?;
    let came_back = tokio::time::timeout(
        Duration::from_secs(20),
        consumer.wait_until(|s| s.succeeded_after_retry == 1),
    )
    .await;
    let took = first_call
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .map(|t| t.elapsed());
    consumer.shutdown().await.map_err(|e| e.to_string())?;
    transport.delete(&live).await.map_err(|e| e.to_string())?;
    match (came_back, took) {
        (Ok(_), Some(took)) if took <= Duration::from_secs(12) => {}
        (_, took) => {
            return Err(format!(
                "the live topic's 4 s retry did not run within 12 s of its first attempt (first \
                 attempt {took:?} ago): the deleted topic's copies hold up the ladder"
            ));
        }
    }

    let raw = raw_brokers::RawRabbit::new(url);
    let unroutable = raw_brokers::RawBroker::messages(&raw, &format!("{ladder}.unroutable"))
        .await
        .map_err(|e| e.to_string())?;
    let mut ids: Vec<String> = unroutable
        .iter()
        .map(|m| {
            String::from_utf8_lossy(
                m.header(event_retry_core::metadata::names::EVENT_ID)
                    .unwrap_or_default(),
            )
            .into_owned()
        })
        .collect();
    ids.sort();
    let want: Vec<String> = (0..ORPHANS).map(|i| format!("orphan-{i:02}")).collect();
    if ids != want {
        return Err(format!(
            "the unroutable queue holds {} copies ({:?}…), want the {ORPHANS} of the deleted topic",
            ids.len(),
            ids.first()
        ));
    }
    for k in 0..6 {
        let level = level_queue(ladder, k);
        let depth = raw.depth(&level).await.map_err(|e| e.to_string())?;
        if depth != 0 {
            return Err(format!("delay level {level} still holds {depth} copies"));
        }
    }
    Ok(())
}

/// The queue of delay level `k` of the ladder named `ladder`, as the adapter names it on the broker.
fn level_queue(ladder: &str, k: u32) -> String {
    format!("{ladder}.{k:02}")
}

/// Deletes a test's own ladder: its levels' queues and exchanges, its exit and its unroutable queue.
async fn delete_ladder(url: &str, ladder: &str, levels: u32) -> Result<(), String> {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .map_err(|e| e.to_string())?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    let mut names: Vec<String> = (0..levels).map(|k| level_queue(ladder, k)).collect();
    names.push(format!("{ladder}.unroutable"));
    for name in &names {
        channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await
            .map_err(|e| format!("delete queue {name}: {e}"))?;
    }
    names.push(format!("{ladder}.out"));
    for name in &names {
        channel
            .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .map_err(|e| format!("delete exchange {name}: {e}"))?;
    }
    let _ = connection.close(200, "cleaned up".into()).await;
    Ok(())
}

fn a_due_retry_overtakes_the_backlog(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        let transport = RabbitTransport::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("overtake-{}", uuid::Uuid::new_v4().simple());
        test_support::busy::a_due_retry_overtakes_the_backlog(&Broker::new(transport), &topic).await
    })
}

fn a_due_retry_overtakes_the_backlog_on_quorum_queues(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        let transport = quorum_transport(&url).await?;
        let topic = format!("overtake-quorum-{}", uuid::Uuid::new_v4().simple());
        test_support::busy::a_due_retry_overtakes_the_backlog(&Broker::new(transport), &topic).await
    })
}

fn restart_keeps_delayed_retries(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        let transport = RabbitTransport::connect(&url).await.map_err(|e| e.to_string())?;
        let topic = format!("restart-{}", uuid::Uuid::new_v4().simple());
        let waits = Waits {
            scheduled: Duration::from_secs(15),
            after_due: Duration::from_secs(60),
        };
        let stats = delayed_retries_survive_restart(
            &Broker::new(transport.clone()),
            "rabbitmq",
            &topic,
            EVENTS,
            DELAY,
            waits,
        )
        .await?;
        if stats.receive_errors == 0 || stats.succeeded_after_retry != EVENTS as u64 {
            return Err(format!(
                "the consumer should have lost its connection and reconnected, then finished every retry: {stats:?}"
            ));
        }
        let _ = transport.delete(&topic).await;
        Ok(())
    })
}

/// Under concurrent publishing, an unroutable copy's return is paired with its own publish: dead letters
/// to a deleted DLQ all fail (none is "confirmed" and acknowledged), while publishes to a healthy queue
/// made at the same time all succeed (none is failed by another message's return).
fn returns_are_paired_with_their_own_publish(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        let transport = RabbitTransport::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let broken = format!("returns-broken-{}", uuid::Uuid::new_v4().simple());
        let healthy = format!("returns-healthy-{}", uuid::Uuid::new_v4().simple());
        transport
            .declare(&broken, None)
            .await
            .map_err(|e| e.to_string())?;
        transport
            .declare(&healthy, None)
            .await
            .map_err(|e| e.to_string())?;
        delete_dlq(&url, &transport, &broken).await?;
        let handler = handler_fn(|_event: Event, _ctx: Context| async {
            Err::<(), _>(HandlerError::non_retryable("bad"))
        });
        let consumer = Broker::new(transport.clone())
            .consumer(&broken)
            .concurrency(16)
            .settle_backoff(Duration::from_millis(50))
            .build()
            .map_err(|e| e.to_string())?
            .start(handler)
            .await
            .map_err(|e| e.to_string())?;
        for i in 0..50 {
            let id = format!("b{i}");
            transport
                .publish(&broken, &Event::new(id.clone()).with_id(id))
                .await
                .map_err(|e| e.to_string())?;
        }
        let sends = (0..400).map(|i| {
            let (transport, healthy) = (transport.clone(), healthy.clone());
            async move {
                transport
                    .publish(&healthy, &Event::new(format!("h{i}")))
                    .await
            }
        });
        let results = futures::future::join_all(sends).await;
        let failed: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
            .collect();
        let stats = consumer.stats();
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        if !failed.is_empty() {
            return Err(format!(
                "{} publishes to a healthy queue failed, e.g. {}",
                failed.len(),
                failed[0]
            ));
        }
        if stats.dead_lettered != 0 || stats.settle_errors == 0 {
            return Err(format!(
                "dead letters to a deleted DLQ must all fail: {stats:?}"
            ));
        }
        transport
            .declare(&broken, None)
            .await
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let handler = handler_fn(|_event: Event, _ctx: Context| async {
            Err::<(), _>(HandlerError::non_retryable("bad"))
        });
        let consumer = Broker::new(transport.clone())
            .consumer(&broken)
            .concurrency(16)
            .build()
            .map_err(|e| e.to_string())?
            .start(handler)
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let dead = dead_letters(&transport, &broken).await?;
            if dead.len() == 50 {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} of 50 events reached the DLQ once it was back",
                    dead.len()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        for topic in [&broken, &healthy] {
            transport.delete(topic).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    })
}

/// 600 events on one queue; every 7th handler takes 40 ms (acks complete out of order, so a batch meets
/// open deliveries), every 11th fails its first try (a ladder retry: a publish, then the ack). The first
/// consumer stops with a 50 ms grace once 200 have succeeded, so handlers still running are cut and their
/// deliveries requeued beside batched acks; a second consumer handles the rest. A `multiple` ack that
/// passed a requeued delivery would lose it (one event short), and an ack sent twice would close the
/// channel (a receive error).
fn batched_acks_settle_every_delivery_once(url: String) -> Result<(), String> {
    const N: usize = 600;
    runtime()?.block_on(async move {
        let transport = RabbitTransport::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let broker = Broker::new(transport.clone());
        let topic = format!("batched-acks-{}", uuid::Uuid::new_v4().simple());
        transport
            .declare(&topic, None)
            .await
            .map_err(|e| e.to_string())?;
        let successes: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let tries: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let handler = {
            let (successes, tries) = (successes.clone(), tries.clone());
            move || {
                let (successes, tries) = (successes.clone(), tries.clone());
                handler_fn(move |event: Event, _ctx: Context| {
                    let (successes, tries) = (successes.clone(), tries.clone());
                    async move {
                        let id = event.id().unwrap_or_default().to_string();
                        let n: usize = id.parse().unwrap_or(0);
                        let nth = {
                            let mut t = tries.lock().unwrap_or_else(|p| p.into_inner());
                            let e = t.entry(id.clone()).or_default();
                            *e += 1;
                            *e
                        };
                        if n.is_multiple_of(7) {
                            tokio::time::sleep(Duration::from_millis(40)).await;
                        }
                        if n.is_multiple_of(11) && nth == 1 {
                            return Err(HandlerError::deferred("first try"));
                        }
                        *successes
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .entry(id)
                            .or_default() += 1;
                        Ok(())
                    }
                })
            }
        };
        let start = |grace: Duration| {
            let broker = broker.clone();
            let handler = handler();
            let topic = topic.clone();
            async move {
                broker
                    .consumer(&topic)
                    .concurrency(32)
                    .policy(RetryPolicy::parse("200ms x3").map_err(|e| e.to_string())?)
                    .shutdown_grace(grace)
                    .build()
                    .map_err(|e| e.to_string())?
                    .start(handler)
                    .await
                    .map_err(|e| e.to_string())
            }
        };
        let first = start(Duration::from_millis(50)).await?;
        let producer = broker.producer();
        for i in 0..N {
            let id = i.to_string();
            producer
                .publish(&topic, Event::new(id.clone()).with_id(id))
                .await
                .map_err(|e| e.to_string())?;
        }
        tokio::time::timeout(
            Duration::from_secs(60),
            first.wait_until(|s| s.succeeded >= 200),
        )
        .await
        .map_err(|_| format!("the first consumer did not get to 200: {:?}", first.stats()))?;
        let first_stats = first.stats();
        first.shutdown().await.map_err(|e| e.to_string())?;
        let second = start(Duration::from_secs(5)).await?;
        let deadline = Instant::now() + Duration::from_secs(90);
        while successes.lock().unwrap_or_else(|p| p.into_inner()).len() < N {
            if Instant::now() > deadline {
                return Err(format!(
                    "{} of {N} succeeded; first {first_stats:?}, second {:?}",
                    successes.lock().unwrap_or_else(|p| p.into_inner()).len(),
                    second.stats()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let second_stats = second.stats();
        second.shutdown().await.map_err(|e| e.to_string())?;
        let twice: Vec<(String, usize)> = successes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, n)| **n != 1)
            .map(|(id, n)| (id.clone(), *n))
            .collect();
        if !twice.is_empty() {
            return Err(format!("events that succeeded more than once: {twice:?}"));
        }
        if first_stats.receive_errors + second_stats.receive_errors > 0 {
            return Err(format!(
                "a channel failed: first {first_stats:?}, second {second_stats:?}"
            ));
        }
        // With both consumers gone, whatever was left unacknowledged is ready again: none may be.
        // The consumers' channels close without waiting for the broker, so the queue is read (by a raw
        // client) once the broker counts no consumer on it: their unacknowledged messages are back.
        let queue = transport
            .names(&topic, None)
            .await
            .map_err(|e| e.to_string())?
            .topic;
        let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .map_err(|e| e.to_string())?;
        let ch = conn.create_channel().await.map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let q = loop {
            let q = ch
                .queue_declare(
                    queue.as_str().into(),
                    lapin::options::QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    lapin::types::FieldTable::default(),
                )
                .await
                .map_err(|e| e.to_string())?;
            if q.consumer_count() == 0 {
                break q;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{queue} still has {} consumers 30 s after both consumers shut down",
                    q.consumer_count()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let _ = conn.close(200, "done".into()).await;
        if q.message_count() != 0 {
            return Err(format!(
                "{} messages left in {queue} after every event succeeded once",
                q.message_count()
            ));
        }
        transport.delete(&topic).await.map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// With 300 events waiting, a batch handler gets each once, none in a call above the batch size, and at
/// least one call of more than one event: the subscription hands over what it holds together
/// (`test_support::batch`).
fn a_batch_handler_gets_more_than_one_held_event_per_call(url: String) -> Result<(), String> {
    test_support::broker::runtime()?.block_on(async move {
        let transport = RabbitTransport::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("batch-{}", uuid::Uuid::new_v4().simple());
        test_support::batch::batches_take_more_than_one_held_event(&Broker::new(transport), &topic)
            .await
    })
}

/// How many consumers each of `queues` has, read with `rabbitmqctl list_queues` on the node
/// `RETRY_TEST_AMQP_NODE` names (a queue that does not exist is missing from the answer).
async fn consumers_of(queues: &[String]) -> Result<HashMap<String, u64>, String> {
    let out = rabbitmqctl(&["list_queues", "name", "consumers", "--no-table-headers"]).await?;
    let mut counts = HashMap::new();
    for line in out.lines() {
        let mut fields = line.split_whitespace();
        if let (Some(name), Some(n)) = (fields.next(), fields.next())
            && queues.iter().any(|q| q == name)
        {
            let n = n
                .parse()
                .map_err(|e| format!("consumers of {name}: '{n}': {e}"))?;
            counts.insert(name.to_string(), n);
        }
    }
    Ok(counts)
}

/// Waits up to 15 s until every one of `queues` has `want` consumers; the last counts otherwise.
async fn until_consumers(queues: &[String], want: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let counts = consumers_of(queues).await?;
        if queues.iter().all(|q| counts.get(q) == Some(&want)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "after 15 s the levels' consumers are {counts:?}, want {want} on each"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A subscription starts moving its transport's delay ladder — one consumer on each level of a ladder
/// of its own — and dropping the subscription and the transport, without `close`, stops it: within 15 s
/// no level has a consumer (a mover left running would take copies from the levels that no process
/// of the service moves on).
fn a_dropped_transport_stops_moving_its_ladder(url: String) -> Result<(), String> {
    use event_retry_core::adapter::SubscriptionSpec;
    const LEVELS: u32 = 6;
    runtime()?.block_on(async move {
        let own = OwnLadder::new("drop", LEVELS);
        let levels: Vec<String> = (0..LEVELS).map(|k| level_queue(&own.ladder, k)).collect();
        let transport = RabbitTransport::connect_with(&url, own.config.clone())
            .await
            .map_err(|e| e.to_string())?;
        let subscription = transport
            .subscribe(&SubscriptionSpec::new(&own.topic, "drop", "drop-test"))
            .await
            .map_err(|e| e.to_string())?;
        let living = until_consumers(&levels, 1)
            .await
            .map_err(|e| format!("while the transport lives: {e}"));
        drop(subscription);
        drop(transport);
        let dropped = match living {
            Ok(()) => until_consumers(&levels, 0)
                .await
                .map_err(|e| format!("once the transport was dropped: {e}")),
            Err(e) => Err(e),
        };
        dropped.and(own.remove(&url).await)
    })
}

/// A delay ladder of a test's own (a fresh prefix, the default queue type) and a topic on it.
struct OwnLadder {
    config: RabbitConfig,
    /// The ladder's name: its levels are `{ladder}.00`, `{ladder}.01`, …
    ladder: String,
    /// A topic of the test's, named from the prefix.
    topic: String,
}

impl OwnLadder {
    /// A ladder of `levels` levels, its prefix `{what}-<uuid>`.
    fn new(what: &str, levels: u32) -> Self {
        let prefix = format!("{what}-{}", uuid::Uuid::new_v4().simple());
        let config = RabbitConfig {
            prefix: prefix.clone(),
            levels,
            ..RabbitConfig::default()
        };
        Self {
            ladder: format!("{prefix}.ladder-100ms-{}", config.queue_type.as_str()),
            topic: format!("{prefix}-topic"),
            config,
        }
    }

    /// Deletes the topic (through a transport with these settings) and the ladder.
    async fn remove(&self, url: &str) -> Result<(), String> {
        let cleaner = RabbitTransport::connect_with(url, self.config.clone())
            .await
            .map_err(|e| e.to_string())?;
        let deleted = cleaner.delete(&self.topic).await.map_err(|e| e.to_string());
        cleaner.close().await;
        let cleanup = delete_ladder(url, &self.ladder, self.config.levels).await;
        deleted.and(cleanup)
    }
}

/// Closing a transport while its movers send copies on sends each copy on once. `COPIES` copies, all
/// due, are put (with lapin) into the top level of a two-level ladder of its own, routed to an exit
/// queue of the test's; a transport starts moving them and is closed once the exit holds some. Then the
/// exit and the levels, read with lapin, hold exactly `COPIES`: none lost, none sent on twice (before,
/// `close` aborted moves between the send and the acknowledgement, and the broker gave those copies,
/// already sent on, to a mover again).
fn closing_mid_move_sends_each_copy_on_once(url: String) -> Result<(), String> {
    use event_retry_core::adapter::SubscriptionSpec;
    const LEVELS: u32 = 2;
    runtime()?.block_on(async move {
        let own = OwnLadder::new("close", LEVELS);
        let exit = format!("{}-exit", own.config.prefix);
        // The ladder, declared by a transport that closes before a copy is in it.
        let declarer = RabbitTransport::connect_with(&url, own.config.clone())
            .await
            .map_err(|e| e.to_string())?;
        let declared = declarer
            .subscribe(&SubscriptionSpec::new(&own.topic, "close", "close-test"))
            .await
            .map(drop)
            .map_err(|e| format!("declare the ladder: {e}"));
        declarer.close().await;
        let counted = match declared {
            Ok(()) => fill_then_close_mid_move(&url, &own, &exit).await,
            Err(e) => Err(e),
        };
        let raw = raw_brokers::RawRabbit::new(&url);
        let exit_deleted = raw.delete_queue(&exit).await.map_err(|e| e.to_string());
        counted.and(exit_deleted).and(own.remove(&url).await)
    })
}

/// Copies put into the ladder for [`closing_mid_move_sends_each_copy_on_once`].
const COPIES: u64 = 3_000;

/// Puts [`COPIES`] due copies into level 01 of `own`'s ladder, routed to a new queue `exit`; starts a
/// transport's movers, closes it once `exit` holds some, and counts what the exit and levels hold.
async fn fill_then_close_mid_move(url: &str, own: &OwnLadder, exit: &str) -> Result<(), String> {
    use event_retry_core::adapter::SubscriptionSpec;
    use lapin::options::{
        BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions,
    };
    use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
    let ladder = own.ladder.as_str();
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .map_err(|e| e.to_string())?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    channel
        .queue_declare(
            exit.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("declare {exit}: {e}"))?;
    channel
        .queue_bind(
            exit.into(),
            format!("{ladder}.out").as_str().into(),
            format!("*.*.{exit}").as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("bind {exit}: {e}"))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    // Due long ago: each copy waits in level 01, then in level 00, then leaves for the exit.
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from(event_retry_core::metadata::names::HOP_DUE),
        AMQPValue::LongString(LongString::from("1")),
    );
    let props = lapin::BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    let key = format!("1.1.{exit}");
    for i in 0..COPIES {
        channel
            .basic_publish(
                level_queue(ladder, 1).as_str().into(),
                key.as_str().into(),
                BasicPublishOptions::default(),
                format!("copy-{i}").as_bytes(),
                props.clone(),
            )
            .await
            .map_err(|e| format!("put copy {i}: {e}"))?;
    }
    channel
        .wait_for_confirms()
        .await
        .map_err(|e| format!("confirms of the copies: {e}"))?;
    let _ = connection.close(200, "filled".into()).await;

    let raw = raw_brokers::RawRabbit::new(url);
    let queues = [
        level_queue(ladder, 1),
        level_queue(ladder, 0),
        exit.to_string(),
    ];
    let queues: Vec<&str> = queues.iter().map(String::as_str).collect();
    let held = |what: &'static str| {
        let (raw, queues) = (&raw, &queues);
        async move {
            raw.total_depth(queues)
                .await
                .map_err(|e| format!("count {what}: {e}"))
        }
    };
    let before = held("the copies put in").await?;
    if before != COPIES {
        return Err(format!(
            "the ladder holds {before} copies, want the {COPIES} put in"
        ));
    }

    let mover = RabbitTransport::connect_with(url, own.config.clone())
        .await
        .map_err(|e| e.to_string())?;
    let subscription = mover
        .subscribe(&SubscriptionSpec::new(&own.topic, "close", "close-test"))
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(15);
    let moving = loop {
        let out = raw.depth(exit).await.map_err(|e| e.to_string())?;
        if out >= 200 {
            break Ok(out);
        }
        if Instant::now() > deadline {
            break Err(format!(
                "after 15 s the exit holds {out} copies, want 200 or more"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop(subscription);
    mover.close().await;
    let out_at_close = moving?;
    let after = held("the copies after the close").await?;
    if after != COPIES {
        return Err(format!(
            "after a close with {out_at_close} copies out, the exit and the levels hold {after}, \
             want the {COPIES} put in ({} sent on twice)",
            after.saturating_sub(COPIES)
        ));
    }
    Ok(())
}
