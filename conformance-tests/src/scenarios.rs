//! The sixteen scenarios, written once, run against every adapter.
//!
//! Each scenario uses topics of its own, so scenarios run concurrently; delays are multiples of the
//! fixture's [`Fixture::delay_unit`], so a broker with one-second granularity gets one-second delays and the
//! in-memory transport gets tenths. A scenario that needs a capability the adapter lacks is skipped with
//! the reason, never silently passed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use retry_core::classify::HandlerError;
use retry_core::dlq::{DeadLetter, DlqFilter};
use retry_core::event::Event;
use retry_core::idempotency::InMemoryIdempotencyStore;
use retry_core::metadata::{DeadReason, names};
use retry_core::policy::RetryPolicy;
use retry_core::runtime::{Consumer, ConsumerBuilder, ConsumerHandle, decode_json};
use retry_core::transport::Capabilities;

use crate::fixture::{Fixture, FixtureCapabilities};
use crate::probe::{Act, BoxFuture, Probe, ensure, percentile, wait_for, wait_for_async};

/// How a scenario ended, when it did not fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It passed; the note carries figures for the report (lateness).
    Pass(Option<String>),
    /// It was skipped, for this reason.
    Skip(String),
}

/// A scenario's result: `Err` is a failure with its explanation.
pub type ScenarioResult = Result<Verdict, String>;

type Run = fn(Arc<dyn Fixture>) -> BoxFuture<ScenarioResult>;
type Needs = fn(&Capabilities, &FixtureCapabilities) -> Option<&'static str>;

/// One scenario of the suite.
pub struct Scenario {
    /// Its number in DESIGN §7.
    pub number: u8,
    /// Its name in test names and the report.
    pub name: &'static str,
    /// Why it must be skipped for an adapter with these capabilities, if it must.
    pub needs: Needs,
    /// Runs it.
    pub run: Run,
}

fn always(_: &Capabilities, _: &FixtureCapabilities) -> Option<&'static str> {
    None
}

/// All scenarios, in order.
pub fn all() -> Vec<Scenario> {
    vec![
        Scenario {
            number: 1,
            name: "success_acked_once",
            needs: always,
            run: |f| Box::pin(success_acked_once(f)),
        },
        Scenario {
            number: 2,
            name: "transient_then_success",
            needs: always,
            run: |f| Box::pin(transient_then_success(f)),
        },
        Scenario {
            number: 3,
            name: "policy_spent_to_dlq",
            needs: always,
            run: |f| Box::pin(policy_spent_to_dlq(f)),
        },
        Scenario {
            number: 4,
            name: "non_retryable_to_dlq",
            needs: always,
            run: |f| Box::pin(non_retryable_to_dlq(f)),
        },
        Scenario {
            number: 5,
            name: "non_blocking_isolation",
            needs: always,
            run: |f| Box::pin(non_blocking_isolation(f)),
        },
        Scenario {
            number: 6,
            name: "blocking_pauses_in_order",
            needs: |c, _| (!c.blocking_pause).then_some("the transport cannot pause consumption"),
            run: |f| Box::pin(blocking_pauses_in_order(f)),
        },
        Scenario {
            number: 7,
            name: "per_key_ordering",
            needs: |c, _| (!c.per_key_order).then_some("the transport cannot keep per-key order"),
            run: |f| Box::pin(per_key_ordering(f)),
        },
        Scenario {
            number: 8,
            name: "crash_mid_handle_redelivered",
            needs: |c, _| {
                (!c.crash_redelivery).then_some("the transport does not redeliver after a crash")
            },
            run: |f| Box::pin(crash_mid_handle_redelivered(f)),
        },
        Scenario {
            number: 9,
            name: "dlq_replay",
            needs: |c, _| (!c.replay).then_some("the transport cannot replay its DLQ"),
            run: |f| Box::pin(dlq_replay(f)),
        },
        Scenario {
            number: 10,
            name: "poison_input_to_dlq",
            needs: always,
            run: |f| Box::pin(poison_input_to_dlq(f)),
        },
        Scenario {
            number: 11,
            name: "duplicate_delivery_idempotent",
            needs: always,
            run: |f| Box::pin(duplicate_delivery_idempotent(f)),
        },
        Scenario {
            number: 12,
            name: "bytes_preserved_every_hop",
            needs: always,
            run: |f| Box::pin(bytes_preserved_every_hop(f)),
        },
        Scenario {
            number: 13,
            name: "delay_precision",
            needs: always,
            run: |f| Box::pin(delay_precision(f)),
        },
        Scenario {
            number: 14,
            name: "rebalance_during_retries",
            needs: |c, _| {
                (!c.shared_subscription).then_some("the transport has no shared subscription")
            },
            run: |f| Box::pin(rebalance_during_retries(f)),
        },
        Scenario {
            number: 15,
            name: "dlq_unwritable_not_acked",
            needs: |_, f| (!f.dlq_fault).then_some("the fixture cannot make the DLQ unwritable"),
            run: |f| Box::pin(dlq_unwritable_not_acked(f)),
        },
        Scenario {
            number: 16,
            name: "graceful_shutdown",
            needs: always,
            run: |f| Box::pin(graceful_shutdown(f)),
        },
    ]
}

// ---- helpers ------------------------------------------------------------------------------------------

fn unit(f: &Arc<dyn Fixture>) -> Duration {
    f.delay_unit()
}

/// How long a scenario waits for something that should happen within `units` delay units.
fn patience(f: &Arc<dyn Fixture>, units: u32) -> Duration {
    unit(f) * units + Duration::from_secs(15)
}

fn policy(text: &str) -> RetryPolicy {
    RetryPolicy::parse(text).unwrap_or_else(|e| unreachable!("scenario policy {text}: {e}"))
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

fn builder(f: &Arc<dyn Fixture>, topic: &str, name: &str) -> ConsumerBuilder {
    Consumer::builder(f.transport(), topic)
        .name(name)
        .seed(7)
        .in_place(policy("1ms x1"))
        .blocking(policy(&format!(
            "exp({}ms, {}ms, 2)",
            ms(unit(f)),
            ms(unit(f) * 4)
        )))
        .settle_backoff(unit(f) * 2)
}

async fn start(b: ConsumerBuilder, probe: &Arc<Probe>) -> Result<ConsumerHandle, String> {
    b.build()
        .map_err(|e| e.to_string())?
        .start(probe.handler())
        .await
        .map_err(|e| e.to_string())
}

async fn publish(f: &Arc<dyn Fixture>, topic: &str, event: Event) -> Result<(), String> {
    f.transport()
        .publish(topic, &event)
        .await
        .map_err(|e| format!("publish to {topic}: {e}"))
}

async fn publish_ids(f: &Arc<dyn Fixture>, topic: &str, ids: &[&str]) -> Result<(), String> {
    for id in ids {
        publish(f, topic, Event::new(id.to_string()).with_id(*id)).await?;
    }
    Ok(())
}

async fn dlq(f: &Arc<dyn Fixture>, topic: &str) -> Result<Vec<DeadLetter>, String> {
    f.transport()
        .dead_letters()
        .list(topic, &DlqFilter::all())
        .await
        .map_err(|e| format!("list DLQ of {topic}: {e}"))
}

async fn wait_dlq(
    f: &Arc<dyn Fixture>,
    topic: &str,
    n: usize,
    timeout: Duration,
) -> Result<Vec<DeadLetter>, String> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let entries = dlq(f, topic).await?;
        if entries.len() >= n {
            return Ok(entries);
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "timed out after {timeout:?} waiting for {n} DLQ entries (have {})",
                entries.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn deferred(msg: &str) -> Act {
    Act::Fail(HandlerError::deferred(msg.to_string()))
}

async fn finish(
    f: &Arc<dyn Fixture>,
    topic: &str,
    handles: Vec<ConsumerHandle>,
) -> Result<(), String> {
    for h in handles {
        h.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
    }
    f.cleanup(topic).await;
    Ok(())
}

fn lateness_note(late: &mut [Duration]) -> String {
    late.sort();
    format!(
        "lateness p50 {} ms, p99 {} ms (n={})",
        ms(percentile(late, 50)),
        ms(percentile(late, 99)),
        late.len()
    )
}

/// Checks that every retry call of `calls` started no earlier than its delay after the previous call
/// returned (monotonic clock), and not before its recorded due time (wall clock); returns how late each was.
fn check_never_early(calls: &[crate::probe::Call]) -> Result<Vec<Duration>, String> {
    let mut late = Vec::new();
    for pair in calls.windows(2) {
        let (prev, next) = (&pair[0], &pair[1]);
        // Only a new delivery scheduled through the broker has a delay to honour (an in-place retry keeps
        // the delivery's due time).
        let Some(delay) = next.last_delay.filter(|_| next.due_at != prev.due_at) else {
            continue;
        };
        let failed_at = prev.ended.unwrap_or(prev.at);
        let gap = next.at.saturating_duration_since(failed_at);
        ensure(gap >= delay, || {
            format!(
                "retry of {} ran {} ms after the failure, before its delay of {} ms",
                next.id,
                ms(gap),
                ms(delay)
            )
        })?;
        if let Some(due) = next.due_at {
            ensure(next.wall >= due, || {
                format!(
                    "retry of {} ran at {} before its due time {}",
                    next.id, next.wall, due
                )
            })?;
        }
        late.push(gap - delay);
    }
    Ok(late)
}

// ---- scenarios ----------------------------------------------------------------------------------------

/// Scenario 1: Success is acked once; nothing lands in retry or DLQ.
async fn success_acked_once(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s01").await.map_err(|e| e.to_string())?;
    let probe = Probe::ok();
    let c = start(builder(&f, &topic, "c1"), &probe).await?;
    let ids = ["a", "b", "c", "d", "e"];
    publish_ids(&f, &topic, &ids).await?;
    wait_for("5 successes", patience(&f, 5), || {
        probe.successes().len() >= 5
    })
    .await?;
    tokio::time::sleep(unit(&f) * 5).await;
    let counts = probe.success_counts();
    ensure(
        probe.call_count() == 5 && ids.iter().all(|id| counts.get(*id) == Some(&1)),
        || {
            format!(
                "expected each event handled once, got calls {:?}",
                probe.calls().iter().map(|c| &c.id).collect::<Vec<_>>()
            )
        },
    )?;
    let stats = c.stats();
    ensure(
        stats.retries_scheduled == 0 && stats.dead_lettered == 0 && stats.succeeded == 5,
        || format!("{stats:?}"),
    )?;
    ensure(dlq(&f, &topic).await?.is_empty(), || "DLQ not empty".into())?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 2: Transient failures then success: attempts counted; every retry waits at least its delay.
async fn transient_then_success(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s02").await.map_err(|e| e.to_string())?;
    let u = unit(&f);
    // t1–t3 fail twice with a deferred error; blip fails twice with a transient one: an in-place retry
    // first, then (in-place budget spent) a deferred retry.
    let probe = Probe::new(|e, nth| match (e.payload.as_ref(), nth) {
        (_, 2..) => Act::Ok,
        (b"blip", _) => Act::Fail(HandlerError::transient("connection reset")),
        _ => deferred("not yet"),
    });
    let b = builder(&f, &topic, "c1").policy(policy(&format!("{}ms x3", ms(u * 2))));
    let c = start(b, &probe).await?;
    let ids = ["t1", "t2", "t3", "blip"];
    publish_ids(&f, &topic, &ids).await?;
    wait_for("4 successes", patience(&f, 20), || {
        probe.successes().len() >= 4
    })
    .await?;
    // The handler's success is counted once the broker confirmed the ack, a moment later.
    wait_for("4 acknowledged successes", patience(&f, 2), || {
        c.stats().succeeded >= 4
    })
    .await?;
    let mut late = Vec::new();
    for id in ids {
        let calls = probe.calls_of(id);
        let attempts: Vec<u32> = calls.iter().map(|c| c.attempt).collect();
        ensure(attempts == [1, 2, 3], || {
            format!("{id}: attempts {attempts:?}, want [1, 2, 3]")
        })?;
        late.extend(check_never_early(&calls)?);
    }
    ensure(late.len() == 7, || {
        format!("{} deferred retries measured, want 7", late.len())
    })?;
    let stats = c.stats();
    ensure(
        stats.succeeded_after_retry == 4
            && stats.retries_scheduled == 7
            && stats.in_place_retries == 1
            && stats.dead_lettered == 0,
        || format!("{stats:?}"),
    )?;
    ensure(dlq(&f, &topic).await?.is_empty(), || "DLQ not empty".into())?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(Some(lateness_note(&mut late))))
}

/// Scenario 3: Policy spent → DLQ with complete metadata; the handler ran exactly 1 + retries times.
async fn policy_spent_to_dlq(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s03").await.map_err(|e| e.to_string())?;
    let probe = Probe::new(|_, _| deferred("inventory service says no"));
    let b = builder(&f, &topic, "spent-consumer").policy(policy(&format!("{}ms x2", ms(unit(&f)))));
    let c = start(b, &probe).await?;
    publish(
        &f,
        &topic,
        Event::new("order-1").with_id("order-1").with_key("k1"),
    )
    .await?;
    let entries = wait_dlq(&f, &topic, 1, patience(&f, 20)).await?;
    tokio::time::sleep(unit(&f) * 3).await;
    ensure(probe.calls_of("order-1").len() == 3, || {
        format!(
            "handler ran {} times, want 3",
            probe.calls_of("order-1").len()
        )
    })?;
    let entries = if entries.len() == 1 {
        entries
    } else {
        dlq(&f, &topic).await?
    };
    ensure(entries.len() == 1, || {
        format!("{} DLQ entries, want 1", entries.len())
    })?;
    let e = &entries[0].event;
    let m = &e.meta;
    let dead = m
        .dead
        .as_ref()
        .ok_or("DLQ entry has no dead-letter metadata")?;
    ensure(dead.reason == DeadReason::Exhausted, || {
        format!("reason {:?}", dead.reason)
    })?;
    ensure(dead.consumer == "spent-consumer", || {
        format!("consumer {:?}", dead.consumer)
    })?;
    ensure(m.event_id.as_deref() == Some("order-1"), || {
        format!("event id {:?}", m.event_id)
    })?;
    ensure(m.attempts == 3 && m.retries == 2, || {
        format!("attempts {} retries {}", m.attempts, m.retries)
    })?;
    ensure(
        m.last_error
            .as_deref()
            .is_some_and(|s| s.contains("inventory service says no")),
        || format!("last error {:?}", m.last_error),
    )?;
    ensure(
        m.error_kind == Some(retry_core::classify::ErrorKind::Deferred),
        || format!("kind {:?}", m.error_kind),
    )?;
    ensure(m.origin.as_ref().is_some_and(|o| o.topic == topic), || {
        format!("origin {:?}", m.origin)
    })?;
    ensure(
        m.first_seen.is_some() && dead.at >= m.first_seen.unwrap_or_default(),
        || "first seen / dead at".into(),
    )?;
    ensure(
        e.payload.as_ref() == b"order-1" && e.key.as_deref() == Some(&b"k1"[..]),
        || "payload or key changed".into(),
    )?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 4: Non-retryable → DLQ after one call.
async fn non_retryable_to_dlq(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s04").await.map_err(|e| e.to_string())?;
    let probe = Probe::new(|_, _| Act::Fail(HandlerError::non_retryable("negative quantity")));
    let c = start(builder(&f, &topic, "c1"), &probe).await?;
    publish_ids(&f, &topic, &["bad"]).await?;
    let entries = wait_dlq(&f, &topic, 1, patience(&f, 5)).await?;
    tokio::time::sleep(unit(&f) * 3).await;
    ensure(probe.calls_of("bad").len() == 1, || {
        format!("handler ran {} times, want 1", probe.calls_of("bad").len())
    })?;
    let dead = entries[0]
        .event
        .meta
        .dead
        .clone()
        .ok_or("no dead-letter metadata")?;
    ensure(dead.reason == DeadReason::NonRetryable, || {
        format!("reason {:?}", dead.reason)
    })?;
    ensure(c.stats().retries_scheduled == 0, || {
        "a retry was scheduled".into()
    })?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 5: Non-blocking isolation: events behind a retrying one finish before its retry fires.
async fn non_blocking_isolation(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s05").await.map_err(|e| e.to_string())?;
    let u = unit(&f);
    let probe = Probe::new(|e, nth| {
        if e.payload.as_ref() == b"slow" && nth == 0 {
            deferred("later")
        } else {
            Act::Ok
        }
    });
    let b = builder(&f, &topic, "c1")
        .policy(policy(&format!("{}ms", ms(u * 10))))
        .concurrency(2);
    let c = start(b, &probe).await?;
    let behind = ["b1", "b2", "b3", "b4", "b5"];
    publish_ids(&f, &topic, &["slow"]).await?;
    publish_ids(&f, &topic, &behind).await?;
    wait_for("all successes", patience(&f, 30), || {
        probe.successes().len() >= 6
    })
    .await?;
    let retry_at = probe
        .calls_of("slow")
        .get(1)
        .map(|c| c.at)
        .ok_or("the retry never ran")?;
    for id in behind {
        let done = probe
            .success_time(id)
            .ok_or_else(|| format!("{id} never succeeded"))?;
        ensure(done < retry_at, || {
            format!("{id} finished after the retry of the event before it")
        })?;
    }
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 6: Blocking kind pauses consumption and keeps order until the dependency heals.
async fn blocking_pauses_in_order(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s06").await.map_err(|e| e.to_string())?;
    let u = unit(&f);
    let down = Arc::new(AtomicBool::new(true));
    let flag = down.clone();
    let probe = Probe::new(move |e, _| {
        if e.payload.as_ref() == b"e2" && flag.load(Ordering::SeqCst) {
            Act::Fail(HandlerError::blocking("database unreachable"))
        } else {
            Act::Ok
        }
    });
    // Free slots: only the pause, not a lack of concurrency, may keep the later events waiting.
    let c = start(builder(&f, &topic, "c1").concurrency(4), &probe).await?;
    publish_ids(&f, &topic, &["e1", "e2"]).await?;
    wait_for("e2 held", patience(&f, 20), || {
        probe.calls_of("e2").len() >= 2
    })
    .await?;
    let later = ["e3", "e4", "e5"];
    publish_ids(&f, &topic, &later).await?;
    tokio::time::sleep(u * 6).await;
    let during: Vec<String> = probe.calls().iter().map(|c| c.id.clone()).collect();
    ensure(during.iter().all(|id| id == "e1" || id == "e2"), || {
        format!("consumption went on while blocked: {during:?}")
    })?;
    ensure(probe.calls_of("e2").len() >= 3, || {
        "the held event was not retried while blocked".into()
    })?;
    down.store(false, Ordering::SeqCst);
    wait_for("all successes", patience(&f, 20), || {
        probe.successes().len() >= 5
    })
    .await?;
    let healed = probe.success_time("e2").ok_or("e2 never succeeded")?;
    for id in later {
        let first = probe
            .calls_of(id)
            .first()
            .map(|c| c.at)
            .ok_or_else(|| format!("{id} never ran"))?;
        ensure(first > healed, || {
            format!("{id} ran before the blocked event healed")
        })?;
    }
    let stats = c.stats();
    ensure(
        stats.holds >= 2 && stats.dead_lettered == 0 && stats.retries_scheduled == 0,
        || format!("{stats:?}"),
    )?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 7: Per-key ordering: later events of a retrying key wait behind it and run in order; other keys go
/// on; when a key's head is dead-lettered, the events parked behind it follow it to the DLQ.
async fn per_key_ordering(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s07").await.map_err(|e| e.to_string())?;
    let u = unit(&f);
    let probe = Probe::new(|e, nth| match (e.payload.as_ref(), nth) {
        (b"a1", 0 | 1) => deferred("not yet"),
        (b"c1", _) => deferred("never"),
        _ => Act::Ok,
    });
    let b = builder(&f, &topic, "c1")
        .policy(policy(&format!("{}ms x3", ms(u * 4))))
        .concurrency(4)
        .ordered_by_key(true);
    let c = start(b, &probe).await?;
    for (id, key) in [
        ("a1", "A"),
        ("c1", "C"),
        ("a2", "A"),
        ("b1", "B"),
        ("c2", "C"),
        ("a3", "A"),
        ("b2", "B"),
    ] {
        publish(&f, &topic, Event::new(id).with_id(id).with_key(key)).await?;
    }
    wait_for("keys A and B done", patience(&f, 40), || {
        probe.successes().len() >= 5
    })
    .await?;
    let order = probe.successes();
    let a: Vec<_> = order
        .iter()
        .filter(|id| id.starts_with('a'))
        .cloned()
        .collect();
    ensure(a == ["a1", "a2", "a3"], || format!("key A order {a:?}"))?;
    let first_retry = probe
        .calls_of("a1")
        .get(1)
        .map(|c| c.at)
        .ok_or("a1 never retried")?;
    for id in ["b1", "b2"] {
        let done = probe
            .success_time(id)
            .ok_or_else(|| format!("{id} never succeeded"))?;
        ensure(done < first_retry, || {
            format!("{id} waited behind another key's retry")
        })?;
    }
    ensure(
        probe.calls_of("a2").len() == 1 && probe.calls_of("a3").len() == 1,
        || "parked events reached the handler early".into(),
    )?;
    let entries = wait_dlq(&f, &topic, 2, patience(&f, 40)).await?;
    let reason_of = |id: &str| {
        entries
            .iter()
            .find(|e| e.event.meta.event_id.as_deref() == Some(id))
            .and_then(|e| e.event.meta.dead.as_ref().map(|d| d.reason))
    };
    ensure(reason_of("c1") == Some(DeadReason::Exhausted), || {
        format!("c1: {:?}", reason_of("c1"))
    })?;
    ensure(
        reason_of("c2") == Some(DeadReason::ParkedBehindDead),
        || format!("c2: {:?}", reason_of("c2")),
    )?;
    ensure(probe.calls_of("c2").is_empty(), || {
        "c2 reached the handler while its key's head was failing".into()
    })?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 8: Crash mid-handle: the consumer dies without settling; a new consumer gets everything.
async fn crash_mid_handle_redelivered(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s08").await.map_err(|e| e.to_string())?;
    let hanging = Probe::new(|_, _| Act::Hang);
    let c1 = start(builder(&f, &topic, "doomed").concurrency(3), &hanging).await?;
    let ids = ["x1", "x2", "x3"];
    publish_ids(&f, &topic, &ids).await?;
    wait_for("3 events in the doomed handler", patience(&f, 10), || {
        hanging.call_count() >= 3
    })
    .await?;
    c1.abort().await;
    let probe = Probe::ok();
    let c2 = start(builder(&f, &topic, "survivor"), &probe).await?;
    wait_for("3 successes on the new consumer", patience(&f, 60), || {
        probe.successes().len() >= 3
    })
    .await?;
    let counts = probe.success_counts();
    ensure(ids.iter().all(|id| counts.get(*id) == Some(&1)), || {
        format!("successes {counts:?}")
    })?;
    ensure(dlq(&f, &topic).await?.is_empty(), || "DLQ not empty".into())?;
    finish(&f, &topic, vec![c2]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 9: DLQ replay → processed, DLQ emptied, replay count recorded, attempts restarted.
async fn dlq_replay(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s09").await.map_err(|e| e.to_string())?;
    let broken = Arc::new(AtomicBool::new(true));
    let flag = broken.clone();
    let probe = Probe::new(move |_, _| {
        if flag.load(Ordering::SeqCst) {
            Act::Fail(HandlerError::non_retryable("bug"))
        } else {
            Act::Ok
        }
    });
    let c = start(builder(&f, &topic, "c1"), &probe).await?;
    publish(
        &f,
        &topic,
        Event::new("r1")
            .with_id("r1")
            .with_key("k")
            .with_header("h", "v"),
    )
    .await?;
    publish_ids(&f, &topic, &["r2"]).await?;
    wait_dlq(&f, &topic, 2, patience(&f, 10)).await?;
    broken.store(false, Ordering::SeqCst);
    let report = f
        .transport()
        .dead_letters()
        .replay(&topic, &DlqFilter::all())
        .await
        .map_err(|e| format!("replay: {e}"))?;
    ensure(report.replayed == 2, || {
        format!("replayed {}", report.replayed)
    })?;
    wait_for("2 successes after replay", patience(&f, 20), || {
        probe.successes().len() >= 2
    })
    .await?;
    for id in ["r1", "r2"] {
        let last = probe.calls_of(id).pop().ok_or("no call")?;
        ensure(last.replay_count == 1 && last.attempt == 1, || {
            format!(
                "{id}: replay count {} attempt {}",
                last.replay_count, last.attempt
            )
        })?;
    }
    let r1 = probe.calls_of("r1").pop().ok_or("no call")?;
    ensure(
        r1.payload.as_ref() == b"r1"
            && r1.key.as_deref() == Some(&b"k"[..])
            && r1.headers.get("h").map(|v| v.as_ref()) == Some(&b"v"[..]),
        || "replay edited the event".into(),
    )?;
    wait_for_async("the DLQ to be empty", patience(&f, 10), || async {
        dlq(&f, &topic).await.is_ok_and(|d| d.is_empty())
    })
    .await?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 10: poison input (malformed or oversized metadata, undecodable payload) → DLQ with the
/// reason; the consumer stays alive.
async fn poison_input_to_dlq(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s10").await.map_err(|e| e.to_string())?;
    let probe = Probe::new(|e, _| match decode_json::<serde::de::IgnoredAny>(e) {
        Ok(_) => Act::Ok,
        Err(err) => Act::Fail(err),
    });
    let c = start(builder(&f, &topic, "c1"), &probe).await?;
    publish(
        &f,
        &topic,
        Event::new("{}")
            .with_id("poison-1")
            .with_header(names::ATTEMPTS, "abc"),
    )
    .await?;
    publish(
        &f,
        &topic,
        Event::new("{}").with_header(names::EVENT_ID, vec![b'x'; 64 * 1024]),
    )
    .await?;
    publish(&f, &topic, Event::new("{not json").with_id("garbled")).await?;
    publish(&f, &topic, Event::new("{\"ok\":true}").with_id("fine")).await?;
    let entries = wait_dlq(&f, &topic, 3, patience(&f, 10)).await?;
    wait_for("the good event", patience(&f, 10), || {
        probe.successes().contains(&"fine".to_string())
    })
    .await?;
    let reasons: Vec<String> = entries
        .iter()
        .map(|e| e.event.meta.last_error.clone().unwrap_or_default())
        .collect();
    for e in &entries {
        let dead = e
            .event
            .meta
            .dead
            .as_ref()
            .ok_or("no dead-letter metadata")?;
        ensure(dead.reason == DeadReason::Poison, || {
            format!("reason {:?} for {:?}", dead.reason, e.event.meta.last_error)
        })?;
    }
    ensure(
        reasons
            .iter()
            .any(|r| r.contains(names::ATTEMPTS) && r.contains("not a valid number")),
        || format!("{reasons:?}"),
    )?;
    ensure(
        reasons
            .iter()
            .any(|r| r.contains(names::EVENT_ID) && r.contains("bytes (limit")),
        || format!("{reasons:?}"),
    )?;
    ensure(
        reasons.iter().any(|r| r.contains("undecodable payload")),
        || format!("{reasons:?}"),
    )?;
    let salvaged = entries
        .iter()
        .find(|e| e.event.meta.event_id.as_deref() == Some("poison-1"));
    ensure(
        salvaged.is_some_and(|e| {
            e.event
                .meta
                .last_error
                .as_deref()
                .is_some_and(|r| r.contains(names::ATTEMPTS))
        }),
        || "the poison entry lost the event id that did parse".into(),
    )?;
    ensure(!c.is_finished(), || "the consumer died".into())?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 11: Duplicate delivery with the idempotency store → one side effect.
async fn duplicate_delivery_idempotent(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s11").await.map_err(|e| e.to_string())?;
    let probe = Probe::ok();
    let store = Arc::new(InMemoryIdempotencyStore::new(Duration::from_secs(600)));
    let c = start(builder(&f, &topic, "c1").idempotency(store), &probe).await?;
    publish_ids(&f, &topic, &["dup", "dup", "single"]).await?;
    wait_for("both deliveries of dup settled", patience(&f, 10), || {
        let s = c.stats();
        s.succeeded + s.duplicates_skipped >= 3
    })
    .await?;
    tokio::time::sleep(unit(&f) * 3).await;
    let counts = probe.success_counts();
    ensure(
        counts.get("dup") == Some(&1) && counts.get("single") == Some(&1),
        || format!("side effects {counts:?}"),
    )?;
    ensure(c.stats().duplicates_skipped == 1, || {
        format!("{:?}", c.stats())
    })?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 12: Payload, key and custom headers preserved byte for byte through every hop and into the DLQ.
async fn bytes_preserved_every_hop(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s12").await.map_err(|e| e.to_string())?;
    let payload = Bytes::from((0..=255u8).rev().chain(0..=255u8).collect::<Vec<u8>>());
    let key = Bytes::from_static(&[0x00, 0xff, 0x80, b'k', 0x7f]);
    let original = Event::new(payload.clone())
        .with_id("bytes")
        .with_key(key.clone())
        .with_header(
            "custom-binary",
            Bytes::from_static(&[0xff, 0x00, 0xfe, 0x80]),
        )
        .with_header("custom-text", "héllo wörld")
        .with_header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        );
    let probe = Probe::new(|_, _| deferred("keep going"));
    let b = builder(&f, &topic, "c1").policy(policy(&format!("{}ms x2", ms(unit(&f)))));
    let c = start(b, &probe).await?;
    publish(&f, &topic, original.clone()).await?;
    let entries = wait_dlq(&f, &topic, 1, patience(&f, 20)).await?;
    let calls = probe.calls_of("bytes");
    ensure(calls.len() == 3, || {
        format!("{} calls, want 3", calls.len())
    })?;
    for (hop, call) in calls.iter().enumerate() {
        ensure(call.payload == payload, || {
            format!("payload changed at hop {hop}")
        })?;
        ensure(call.key.as_ref() == Some(&key), || {
            format!("key changed at hop {hop}: {:?}", call.key)
        })?;
        ensure(call.headers == original.headers, || {
            format!("headers changed at hop {hop}: {:?}", call.headers)
        })?;
    }
    let dead = &entries[0].event;
    ensure(
        dead.payload == payload && dead.key.as_ref() == Some(&key),
        || "payload or key changed in the DLQ".into(),
    )?;
    ensure(dead.headers == original.headers, || {
        format!("headers changed in the DLQ: {:?}", dead.headers)
    })?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 13: Delay precision: many retries with random delays; never early; lateness recorded.
async fn delay_precision(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s13").await.map_err(|e| e.to_string())?;
    let u = unit(&f);
    let probe = Probe::new(|_, nth| if nth < 2 { deferred("again") } else { Act::Ok });
    let b = builder(&f, &topic, "c1")
        .policy(policy(&format!(
            "exp({}ms, {}ms, 2, 3); jitter=full",
            ms(u * 2),
            ms(u * 8)
        )))
        .concurrency(16);
    let c = start(b, &probe).await?;
    let ids: Vec<String> = (0..40).map(|i| format!("p{i:02}")).collect();
    for id in &ids {
        publish(&f, &topic, Event::new(id.clone()).with_id(id.clone())).await?;
    }
    wait_for("40 successes", patience(&f, 60), || {
        probe.successes().len() >= ids.len()
    })
    .await?;
    let mut late = Vec::new();
    for id in &ids {
        late.extend(check_never_early(&probe.calls_of(id))?);
    }
    ensure(late.len() == 80, || {
        format!("{} retries measured, want 80", late.len())
    })?;
    let note = lateness_note(&mut late);
    let bound = f.capabilities().delay.granularity + Duration::from_secs(2);
    ensure(percentile(&late, 99) <= bound, || {
        format!("{note}: p99 beyond {} ms", ms(bound))
    })?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(Some(note)))
}

/// Scenario 14: Two consumers in one group, a rebalance during retries: exact counts, nothing lost.
async fn rebalance_during_retries(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s14").await.map_err(|e| e.to_string())?;
    let u = unit(&f);
    let probe = Probe::new(|_, nth| {
        if nth == 0 {
            deferred("first try fails")
        } else {
            Act::Ok
        }
    });
    let pol = policy(&format!("{}ms x2", ms(u * 3)));
    let a = start(
        builder(&f, &topic, "a")
            .group("g14")
            .policy(pol.clone())
            .concurrency(4),
        &probe,
    )
    .await?;
    let ids: Vec<String> = (0..20).map(|i| format!("r{i:02}")).collect();
    for id in &ids[..10] {
        publish(&f, &topic, Event::new(id.clone()).with_id(id.clone())).await?;
    }
    wait_for("first failures", patience(&f, 10), || {
        probe.call_count() >= 5
    })
    .await?;
    let b = start(
        builder(&f, &topic, "b")
            .group("g14")
            .policy(pol)
            .concurrency(4),
        &probe,
    )
    .await?;
    for id in &ids[10..] {
        publish(&f, &topic, Event::new(id.clone()).with_id(id.clone())).await?;
    }
    wait_for("more progress", patience(&f, 10), || {
        probe.call_count() >= 15
    })
    .await?;
    a.shutdown().await.map_err(|e| format!("shutdown a: {e}"))?;
    wait_for("20 successes", patience(&f, 60), || {
        probe.successes().len() >= 20
    })
    .await?;
    tokio::time::sleep(u * 4).await;
    let counts = probe.success_counts();
    let calls: HashMap<String, usize> = ids
        .iter()
        .map(|id| (id.clone(), probe.calls_of(id).len()))
        .collect();
    ensure(ids.iter().all(|id| counts.get(id) == Some(&1)), || {
        format!("successes {counts:?}")
    })?;
    ensure(calls.values().all(|&n| n == 2), || {
        format!("calls per event {calls:?}")
    })?;
    ensure(dlq(&f, &topic).await?.is_empty(), || "DLQ not empty".into())?;
    finish(&f, &topic, vec![b]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 15: DLQ unwritable → the original is not acked, the error surfaces, nothing is lost.
async fn dlq_unwritable_not_acked(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s15").await.map_err(|e| e.to_string())?;
    f.set_dlq_writable(&topic, false)
        .await
        .map_err(|e| e.to_string())?;
    let probe = Probe::new(|_, _| Act::Fail(HandlerError::non_retryable("bad")));
    let c = start(builder(&f, &topic, "c1"), &probe).await?;
    publish_ids(&f, &topic, &["victim"]).await?;
    wait_for("a surfaced settle error", patience(&f, 10), || {
        c.stats().settle_errors >= 1
    })
    .await?;
    let stats = c.stats();
    ensure(
        stats
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("dead-letter")),
        || format!("{stats:?}"),
    )?;
    ensure(dlq(&f, &topic).await?.is_empty(), || {
        "an entry reached an unwritable DLQ".into()
    })?;
    wait_for(
        "a redelivery of the unsettled original",
        patience(&f, 10),
        || probe.calls_of("victim").len() >= 2,
    )
    .await?;
    f.set_dlq_writable(&topic, true)
        .await
        .map_err(|e| e.to_string())?;
    let entries = wait_dlq(&f, &topic, 1, patience(&f, 10)).await?;
    ensure(
        entries[0].event.meta.event_id.as_deref() == Some("victim"),
        || "wrong DLQ entry".into(),
    )?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}

/// Scenario 16: Graceful shutdown: in-flight work finishes or is released; nothing lost.
async fn graceful_shutdown(f: Arc<dyn Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s16").await.map_err(|e| e.to_string())?;
    let u = unit(&f);
    let probe = Probe::new(move |_, _| Act::SleepThenOk(u * 5));
    let c1 = start(
        builder(&f, &topic, "c1")
            .concurrency(3)
            .shutdown_grace(u * 50),
        &probe,
    )
    .await?;
    let ids: Vec<String> = (0..8).map(|i| format!("g{i}")).collect();
    for id in &ids {
        publish(&f, &topic, Event::new(id.clone()).with_id(id.clone())).await?;
    }
    wait_for("3 in flight", patience(&f, 10), || probe.call_count() >= 3).await?;
    c1.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
    let after_first = probe.successes().len();
    ensure(
        after_first >= 3 && after_first == probe.call_count(),
        || {
            format!(
                "{after_first} finished of {} started: in-flight work was cut",
                probe.call_count()
            )
        },
    )?;
    let c2 = start(builder(&f, &topic, "c2").concurrency(3), &probe).await?;
    wait_for("all 8 handled", patience(&f, 40), || {
        probe.successes().len() >= 8
    })
    .await?;
    tokio::time::sleep(u * 3).await;
    let counts = probe.success_counts();
    ensure(ids.iter().all(|id| counts.get(id) == Some(&1)), || {
        format!("successes {counts:?}")
    })?;
    finish(&f, &topic, vec![c2]).await?;

    // A handler that outlives the grace period: shutdown returns within it and releases the event,
    // which the next consumer handles; nothing is lost, and nothing is acknowledged unhandled.
    let topic = f
        .fresh_topic("s16-grace")
        .await
        .map_err(|e| e.to_string())?;
    let slow = Probe::new(move |_, nth| if nth == 0 { Act::Hang } else { Act::Ok });
    let c3 = start(builder(&f, &topic, "c3").shutdown_grace(u * 2), &slow).await?;
    publish_ids(&f, &topic, &["stuck"]).await?;
    wait_for("the slow call", patience(&f, 10), || slow.call_count() >= 1).await?;
    let asked = std::time::Instant::now();
    c3.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
    let took = asked.elapsed();
    ensure(took < u * 2 + Duration::from_secs(10), || {
        format!("shutdown took {took:?} with a grace of {:?}", u * 2)
    })?;
    ensure(slow.successes().is_empty(), || {
        "the cut call counted as a success".into()
    })?;
    let c4 = start(builder(&f, &topic, "c4"), &slow).await?;
    wait_for(
        "the released event on the next consumer",
        patience(&f, 60),
        || slow.success_counts().get("stuck") == Some(&1),
    )
    .await?;
    ensure(dlq(&f, &topic).await?.is_empty(), || "DLQ not empty".into())?;
    finish(&f, &topic, vec![c4]).await?;
    Ok(Verdict::Pass(None))
}
