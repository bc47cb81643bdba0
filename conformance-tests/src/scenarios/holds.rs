//! Holding back: a blocking error pauses consumption in order, and per-key ordering parks later events
//! of a retrying key.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use retry_core::classify::HandlerError;
use retry_core::event::Event;
use retry_core::metadata::DeadReason;
use retry_core::runtime::ParkedAfterDead;

use super::support::*;
use super::{ScenarioResult, Verdict};
use crate::fixture::Fixture;
use crate::probe::{Act, Probe, ensure, wait_for};

/// Scenario 6: Blocking kind pauses consumption and keeps order until the dependency heals.
pub(super) async fn blocking_pauses_in_order(f: Arc<Fixture>) -> ScenarioResult {
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
pub(super) async fn per_key_ordering(f: Arc<Fixture>) -> ScenarioResult {
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
        .ordered_by_key(ParkedAfterDead::FollowToDlq);
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
            .find(|e| e.event.metadata().event_id.as_deref() == Some(id))
            .and_then(|e| e.event.metadata().dead.as_ref().map(|d| d.reason))
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
