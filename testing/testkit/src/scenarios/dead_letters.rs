//! Dead letters: replay back to the origin, and a DLQ that refuses writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;

use super::support::*;
use super::{ScenarioResult, Verdict};
use crate::fixture::{Fixture, HeldParts};
use crate::probe::{Act, Probe, ensure, wait_for, wait_for_async};

/// Scenario 9: DLQ replay → processed, DLQ emptied, replay count recorded, attempts restarted.
pub async fn dlq_replay(f: Arc<Fixture>) -> ScenarioResult {
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
    let c = start(&f, builder(&f, &topic, "c1"), &probe).await?;
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
    replay_all(&f, &topic, 2).await?;
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

/// Scenario 15: an unwritable DLQ is a dependency outage. The error surfaces, consumption is held, the
/// original is neither redelivered nor settled anywhere — during the outage and after a crash in it the
/// broker itself still holds it and the event behind it (read with the broker's raw client or tools), and
/// nothing went onto the retry route — and the DLQ write is tried again; once the DLQ accepts, the entry
/// lands there once.
pub async fn dlq_unwritable_holds(f: Arc<Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s15").await.map_err(|e| e.to_string())?;
    let faults = f.faults().ok_or("the fixture has no fault switches")?;
    let inspect = f
        .inspect()
        .ok_or("the fixture cannot read the broker's view")?;
    let u = unit(&f);
    let group = "g15";
    faults
        .set_dlq_writable(&topic, group, false)
        .await
        .map_err(|e| e.to_string())?;
    let probe = Probe::new(|e, _| {
        if e.payload.as_ref() == b"victim" {
            Act::Fail(HandlerError::non_retryable("bad"))
        } else {
            Act::Ok
        }
    });
    let c1 = start(
        &f,
        builder(&f, &topic, "c1").group(group).concurrency(4),
        &probe,
    )
    .await?;
    publish_ids(&f, &topic, &["victim"]).await?;
    wait_for("a surfaced settle error", patience(&f, 10), || {
        c1.stats().settle_errors >= 1
    })
    .await?;
    let stats = c1.stats();
    ensure(
        stats
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("dead-letter")),
        || format!("{stats:?}"),
    )?;
    // Consumption is held from the first failure: an event published now waits.
    tokio::time::sleep(u).await;
    publish_ids(&f, &topic, &["behind"]).await?;
    wait_for("the DLQ write tried again", patience(&f, 10), || {
        c1.stats().settle_errors >= 3
    })
    .await?;
    ensure(probe.calls_of("victim").len() == 1, || {
        format!(
            "the victim was handled {} times during the outage: it went round (redelivered or through \
             the retry route) instead of waiting",
            probe.calls_of("victim").len()
        )
    })?;
    ensure(probe.calls_of("behind").is_empty(), || {
        "consumption went on while the DLQ was unwritable".into()
    })?;
    ensure(dlq(&f, &topic).await?.is_empty(), || {
        "an entry reached an unwritable DLQ".into()
    })?;
    // The broker's own view, while the consumer holds: both messages still unsettled in the source, and
    // nothing sent round through the retry route.
    // A quorum queue's counts lag its state by up to a few seconds; the hold lasts, so wait for them.
    let held = wait_held(inspect, &topic, group, patience(&f, 10), |held| held == 2)
        .await?
        .unwrap_or_else(|held| held);
    ensure(held == 2, || {
        format!(
            "during the outage the broker holds {held} unsettled messages of {topic} for {group}, want \
             the original and the event behind it (2)"
        )
    })?;
    // Where the broker tells waiting from handed out: the original is the one delivery handed out (a
    // copy of it would wait beside the event behind it, with nothing handed out).
    let want = HeldParts {
        waiting: 1,
        handed_out: 1,
    };
    let deadline = std::time::Instant::now() + patience(&f, 10);
    let split = loop {
        let parts = inspect
            .held_parts(&topic, group)
            .await
            .map_err(|e| format!("read the broker's view: {e}"))?;
        if parts.is_none_or(|p| p == want) || std::time::Instant::now() > deadline {
            break parts;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure(split.is_none_or(|p| p == want), || {
        format!(
            "during the outage the broker holds {split:?} of {topic} for {group}, want the original \
             handed out and the event behind it waiting ({want:?})"
        )
    })?;
    let route = inspect
        .sent_to_retry_route(&topic, group)
        .await
        .map_err(|e| format!("read the broker's view of the retry route: {e}"))?;
    ensure(route.is_none_or(|n| n == 0), || {
        format!(
            "during the outage {} messages went onto the retry route",
            route.unwrap_or_default()
        )
    })?;
    // A crash in the outage: whatever the consumer held must still be the broker's, unsettled.
    c1.abort().await;
    if let Err(held) = wait_held(inspect, &topic, group, patience(&f, 10), |held| held >= 2).await?
    {
        return Err(format!(
            "after a crash in the outage the broker holds {held} messages of {topic} for {group}, \
             want the original and the event behind it (2): the original was settled"
        ));
    }
    faults
        .set_dlq_writable(&topic, group, true)
        .await
        .map_err(|e| e.to_string())?;
    let c2 = start(&f, builder(&f, &topic, "c2").group(group), &probe).await?;
    let entries = wait_dlq(&f, &topic, 1, patience(&f, 10)).await?;
    wait_for("the event behind it", patience(&f, 10), || {
        probe.success_counts().get("behind") == Some(&1)
    })
    .await?;
    tokio::time::sleep(u * 3).await;
    let entries = if entries.len() == 1 {
        dlq(&f, &topic).await?
    } else {
        entries
    };
    ensure(
        entries.len() == 1 && entries[0].event.metadata().event_id.as_deref() == Some("victim"),
        || format!("{} DLQ entries, want the victim once", entries.len()),
    )?;
    ensure(probe.calls_of("victim").len() == 2, || {
        format!(
            "the victim was handled {} times, want once per consumer",
            probe.calls_of("victim").len()
        )
    })?;
    finish(&f, &topic, vec![c2]).await?;
    // Each view the fixture could not give is named in the cell: a pass says every check ran.
    let mut unread = Vec::new();
    if split.is_none() {
        unread.push(
            "the broker's waiting / handed-out split was not read (the fixture cannot tell them \
             apart)"
                .to_string(),
        );
    }
    if route.is_none() {
        unread.push(format!(
            "the retry route was not read: {}",
            inspect.retry_route_unread()
        ));
    }
    Ok(if unread.is_empty() {
        Verdict::Pass(Some("retry route read from the broker: empty".to_string()))
    } else {
        Verdict::Partial(unread.join("; "))
    })
}
