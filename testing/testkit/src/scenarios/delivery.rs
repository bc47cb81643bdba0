//! Delivery: success acknowledged once, isolation of healthy events from a retrying one, duplicates
//! skipped through the idempotency store, and graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use event_retry_core::event::Event;
use event_retry_core::idempotency::InMemoryIdempotencyStore;

use super::support::*;
use super::{ScenarioResult, Verdict};
use crate::fixture::Fixture;
use crate::probe::{Act, Probe, ensure, wait_for};

/// Scenario 1: Success is acked once; nothing lands in retry or DLQ. "Acked" is read from the broker:
/// it holds nothing more for the group (read with its own client or tools) before the consumer stops.
pub async fn success_acked_once(f: Arc<Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s01").await.map_err(|e| e.to_string())?;
    let group = "g01";
    let probe = Probe::ok();
    let c = start(&f, builder(&f, &topic, "c1").group(group), &probe).await?;
    let ids = ["a", "b", "c", "d", "e"];
    publish_ids(&f, &topic, &ids).await?;
    wait_for("5 successes", patience(&f, 5), || {
        probe.successes().len() >= 5
    })
    .await?;
    // Acknowledged on the broker, not only counted by the SDK: it holds nothing more for the group.
    let acked_on_broker = match f.inspect() {
        Some(inspect) => {
            if let Err(held) =
                wait_held(inspect, &topic, group, patience(&f, 10), |held| held == 0).await?
            {
                return Err(format!(
                    "5 events succeeded but the broker still holds {held} of {topic} for {group}: \
                     not acknowledged"
                ));
            }
            true
        }
        None => false,
    };
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
    Ok(if acked_on_broker {
        Verdict::Pass(None)
    } else {
        Verdict::Partial("the broker's own view was not read (the fixture has none)".into())
    })
}

/// Scenario 5: Non-blocking isolation: events behind a retrying one finish before its retry fires.
pub async fn non_blocking_isolation(f: Arc<Fixture>) -> ScenarioResult {
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
    let c = start(&f, b, &probe).await?;
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

/// Scenario 11: Duplicate delivery with the idempotency store → one side effect.
pub async fn duplicate_delivery_idempotent(f: Arc<Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s11").await.map_err(|e| e.to_string())?;
    let probe = Probe::ok();
    let store = Arc::new(InMemoryIdempotencyStore::new(Duration::from_secs(600)));
    let c = start(&f, builder(&f, &topic, "c1").idempotency(store), &probe).await?;
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

/// Scenario 16: Graceful shutdown: in-flight work finishes or is released; nothing lost.
pub async fn graceful_shutdown(f: Arc<Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s16").await.map_err(|e| e.to_string())?;
    let u = unit(&f);
    let probe = Probe::new(move |_, _| Act::SleepThenOk(u * 5));
    let c1 = start(
        &f,
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
    let c2 = start(&f, builder(&f, &topic, "c2").concurrency(3), &probe).await?;
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
    let c3 = start(&f, builder(&f, &topic, "c3").shutdown_grace(u * 2), &slow).await?;
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
    let c4 = start(&f, builder(&f, &topic, "c4"), &slow).await?;
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
