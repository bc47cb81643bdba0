//! Holding back: a blocking error pauses consumption in order, and per-key ordering parks later events
//! of a retrying key.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::metadata::DeadReason;
use event_retry_core::runtime::ParkedAfterDead;

use super::support::*;
use super::{ScenarioResult, Verdict};
use crate::fixture::Fixture;
use crate::probe::{Act, Probe, ensure, wait_for};

/// Scenario 6: Blocking kind pauses consumption and keeps order until the dependency heals.
pub async fn blocking_pauses_in_order(f: Arc<Fixture>) -> ScenarioResult {
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
    let c = start(&f, builder(&f, &topic, "c1").concurrency(4), &probe).await?;
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

/// Scenario 7: per-key ordering at the default concurrency. A retrying key's later events run after it,
/// in order; a key with many events runs them one at a time, in order; other keys go on; events parked
/// behind a head that dies follow it to the DLQ. Where the broker itself holds a key's later events back
/// while one is in flight (SQS FIFO message groups), a later event may instead be handed out only after
/// its head was dead-lettered — never while the head could still be retried.
pub async fn per_key_ordering(f: Arc<Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s07").await.map_err(|e| e.to_string())?;
    let u = unit(&f);
    // Key D's handler takes a while, so two of its events run at once unless they are kept apart.
    let busy = u / 10;
    let probe = Probe::new(move |e, nth| match (e.payload.as_ref(), nth) {
        (b"a1", 0 | 1) => deferred("not yet"),
        (b"c1", _) => deferred("never"),
        (p, _) if p.starts_with(b"d") => Act::SleepThenOk(busy),
        _ => Act::Ok,
    });
    let b = builder(&f, &topic, "c1")
        .policy(policy(&format!("{}ms x3", ms(u * 4))))
        .ordered_by_key(ParkedAfterDead::FollowToDlq);
    let c = start(&f, b, &probe).await?;
    let many: Vec<String> = (1..=20).map(|i| format!("d{i:02}")).collect();
    let mut events: Vec<(String, &str)> = [
        ("a1", "A"),
        ("c1", "C"),
        ("a2", "A"),
        ("b1", "B"),
        ("c2", "C"),
        ("a3", "A"),
        ("b2", "B"),
    ]
    .into_iter()
    .map(|(id, key)| (id.to_string(), key))
    .collect();
    events.extend(many.iter().map(|id| (id.clone(), "D")));
    for (id, key) in &events {
        publish(
            &f,
            &topic,
            Event::new(id.clone()).with_id(id.as_str()).with_key(*key),
        )
        .await?;
    }
    wait_for("keys A, B and D done", patience(&f, 40), || {
        let done = probe.successes();
        ["a3", "b2"].iter().all(|id| done.iter().any(|d| d == id))
            && many.iter().all(|id| done.contains(id))
    })
    .await?;
    let order = probe.successes();
    let of_key = |prefix: char| -> Vec<String> {
        order
            .iter()
            .filter(|id| id.starts_with(prefix))
            .cloned()
            .collect()
    };
    ensure(of_key('a') == ["a1", "a2", "a3"], || {
        format!("key A order {:?}", of_key('a'))
    })?;
    ensure(of_key('d') == many, || {
        format!("key D order {:?}", of_key('d'))
    })?;
    // One at a time: each D event started only after the one before it had succeeded.
    for pair in many.windows(2) {
        let previous_done = probe
            .success_time(&pair[0])
            .ok_or_else(|| format!("{} never succeeded", pair[0]))?;
        let started = probe
            .calls_of(&pair[1])
            .first()
            .map(|c| c.at)
            .ok_or_else(|| format!("{} never ran", pair[1]))?;
        ensure(started >= previous_done, || {
            format!("{} ran while {} was still running", pair[1], pair[0])
        })?;
    }
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
    let broker_holds = f.capabilities().broker_orders_keys;
    let entries = wait_dlq(
        &f,
        &topic,
        if broker_holds { 1 } else { 2 },
        patience(&f, 40),
    )
    .await?;
    let reason_of = |id: &str| {
        entries
            .iter()
            .find(|e| e.event.metadata().event_id.as_deref() == Some(id))
            .and_then(|e| e.event.metadata().dead.as_ref().map(|d| d.reason))
    };
    ensure(reason_of("c1") == Some(DeadReason::Exhausted), || {
        format!("c1: {:?}", reason_of("c1"))
    })?;
    let c1_last = probe
        .calls_of("c1")
        .last()
        .and_then(|c| c.ended)
        .ok_or("c1's last call never ended")?;
    // Where the broker holds a key's events back itself, c2 either was parked (it arrived with c1) and
    // follows it to the DLQ, or is handed out once c1 is dead-lettered: wait for one or the other.
    let deadline = std::time::Instant::now() + patience(&f, 20);
    let c2_dead = loop {
        let dead = dlq(&f, &topic).await?.iter().find_map(|e| {
            (e.event.metadata().event_id.as_deref() == Some("c2"))
                .then(|| e.event.metadata().dead.as_ref().map(|d| d.reason))
                .flatten()
        });
        if dead.is_some() || (broker_holds && probe.success_counts().get("c2") == Some(&1)) {
            break dead;
        }
        if std::time::Instant::now() > deadline {
            return Err("c2 neither followed its dead head to the DLQ nor ran after it".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let c2_calls = probe.calls_of("c2");
    match c2_dead {
        Some(reason) => {
            ensure(reason == DeadReason::ParkedBehindDead, || {
                format!("c2: {reason:?}")
            })?;
            ensure(c2_calls.is_empty(), || {
                "c2 reached the handler while its key's head was failing".into()
            })?;
        }
        None => {
            ensure(c2_calls[0].at >= c1_last, || {
                "c2 reached the handler while its key's head could still be retried".into()
            })?;
        }
    }
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}
