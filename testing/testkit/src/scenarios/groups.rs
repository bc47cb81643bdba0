//! Consumer groups: a rebalance during retries keeps exact counts, and groups on one topic each get every
//! event.

use std::collections::HashMap;
use std::sync::Arc;

use event_retry_core::event::Event;

use super::support::*;
use super::{ScenarioResult, Verdict};
use crate::fixture::Fixture;
use crate::probe::{Act, Probe, ensure, wait_for};

/// Scenario 14: Two consumers in one group, a rebalance during retries: exact counts, nothing lost.
pub async fn rebalance_during_retries(f: Arc<Fixture>) -> ScenarioResult {
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
        &f,
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
        &f,
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
    let shutdown_began = std::time::Instant::now();
    a.shutdown().await.map_err(|e| format!("shutdown a: {e}"))?;
    let shutdown_took = shutdown_began.elapsed();
    if let Err(timed_out) = wait_for("20 successes", patience(&f, 60), || {
        probe.successes().len() >= 20
    })
    .await
    {
        return Err(format!(
            "{timed_out}; {}",
            missing_successes(&f, &topic, &probe, &ids).await
        ));
    }
    tokio::time::sleep(u * 4).await;
    let counts = probe.success_counts();
    let calls: HashMap<String, usize> = ids
        .iter()
        .map(|id| (id.clone(), probe.calls_of(id).len()))
        .collect();
    ensure(ids.iter().all(|id| counts.get(id) == Some(&1)), || {
        format!(
            "successes {counts:?}; {}",
            calls_around(&probe, &ids, &counts, shutdown_began, shutdown_took)
        )
    })?;
    ensure(calls.values().all(|&n| n == 2), || {
        format!("calls per event {calls:?}")
    })?;
    ensure(dlq(&f, &topic).await?.is_empty(), || "DLQ not empty".into())?;
    finish(&f, &topic, vec![b]).await?;
    Ok(Verdict::Pass(None))
}

/// For each id not handled successfully exactly once: its calls' attempts and start times, in ms from
/// the moment consumer a's shutdown began (negative: before it), beside how long that shutdown took —
/// what tells a copy handled twice from an original delivered again.
fn calls_around(
    probe: &Probe,
    ids: &[String],
    counts: &HashMap<String, usize>,
    shutdown_began: std::time::Instant,
    shutdown_took: std::time::Duration,
) -> String {
    let ms_from_shutdown = |at: std::time::Instant| {
        if at >= shutdown_began {
            (at - shutdown_began).as_millis() as i64
        } else {
            -((shutdown_began - at).as_millis() as i64)
        }
    };
    let odd: Vec<String> = ids
        .iter()
        .filter(|id| counts.get(*id) != Some(&1))
        .map(|id| {
            let calls: Vec<String> = probe
                .calls_of(id)
                .iter()
                .map(|c| format!("attempt {} at {} ms", c.attempt, ms_from_shutdown(c.at)))
                .collect();
            format!("{id}: [{}]", calls.join(", "))
        })
        .collect();
    format!(
        "calls, in ms from the start of a's shutdown (which took {} ms): {}",
        shutdown_took.as_millis(),
        odd.join("; ")
    )
}

/// What a scenario that waited in vain for every id to succeed saw: the ids without a success, the
/// attempt each of their handler calls was given, and what the DLQ holds.
async fn missing_successes(f: &Arc<Fixture>, topic: &str, probe: &Probe, ids: &[String]) -> String {
    let counts = probe.success_counts();
    let missing: Vec<String> = ids
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .map(|id| {
            let attempts: Vec<u32> = probe.calls_of(id).iter().map(|c| c.attempt).collect();
            format!("{id} (calls at attempts {attempts:?})")
        })
        .collect();
    let dead = match dlq(f, topic).await {
        Ok(entries) => entries
            .iter()
            .map(|d| {
                let reason = d
                    .dead()
                    .map(|i| format!("{:?}", i.reason))
                    .unwrap_or_default();
                format!("{} ({reason})", d.event.id().unwrap_or("?"))
            })
            .collect::<Vec<_>>()
            .join(", "),
        Err(e) => e,
    };
    format!(
        "{} of {} succeeded; without a success: {}; DLQ: [{dead}]",
        counts.len(),
        ids.len(),
        missing.join(", ")
    )
}

/// Scenario 17: two consumer groups on one topic: each receives every event, each retries on its own
/// (one group's retry is not delivered to the other), a dead letter is the dead-lettering group's alone,
/// and its replay goes back to that group only.
pub async fn groups_each_get_every_event(f: Arc<Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s17").await.map_err(|e| e.to_string())?;
    let (ga, gb) = ("billing", "audit");
    for group in [ga, gb] {
        f.broker()
            .admin()
            .declare(&topic, Some(group))
            .await
            .map_err(|e| format!("declare group {group}: {e}"))?;
    }
    let u = unit(&f);
    // Billing fails e1 once and refuses e4 for good (until it is replayed); audit fails e2 once.
    let billing = Probe::new(|e, nth| match (e.id(), nth) {
        (Some("e1"), 0) => deferred("billing: not yet"),
        (Some("e4"), _) if e.metadata().replay_count == 0 => Act::Fail(
            event_retry_core::classify::HandlerError::non_retryable("billing refuses e4"),
        ),
        _ => Act::Ok,
    });
    let audit = Probe::new(|e, nth| match (e.id(), nth) {
        (Some("e2"), 0) => deferred("audit: not yet"),
        _ => Act::Ok,
    });
    let pol = policy(&format!("{}ms x2", ms(u * 2)));
    let a = start(
        &f,
        builder(&f, &topic, "billing-1")
            .group(ga)
            .policy(pol.clone()),
        &billing,
    )
    .await?;
    let b = start(
        &f,
        builder(&f, &topic, "audit-1").group(gb).policy(pol),
        &audit,
    )
    .await?;
    let ids = ["e1", "e2", "e3", "e4"];
    publish_ids(&f, &topic, &ids).await?;
    wait_for("billing: e1-e3 succeeded", patience(&f, 20), || {
        billing.successes().len() >= 3
    })
    .await?;
    wait_for("audit: e1-e4 succeeded", patience(&f, 20), || {
        audit.successes().len() >= 4
    })
    .await?;
    let entries = wait_dlq(&f, &topic, 1, patience(&f, 10)).await?;
    // Long enough for a stray copy (a retry of the other group, a second delivery) to show up.
    tokio::time::sleep(u * 4).await;
    let calls = |p: &Probe, id: &str| p.calls_of(id).len();
    let got: Vec<(usize, usize)> = ids
        .iter()
        .map(|id| (calls(&billing, id), calls(&audit, id)))
        .collect();
    ensure(got == [(2, 1), (1, 2), (1, 1), (1, 1)], || {
        format!(
            "handler calls per event (billing, audit) for e1..e4: {got:?}, want [(2, 1), (1, 2), (1, \
             1), (1, 1)]: each group gets every event once and retries only its own"
        )
    })?;
    ensure(
        entries.len() == 1 && entries[0].event.id() == Some("e4"),
        || format!("DLQ: {} entries, want billing's e4 alone", entries.len()),
    )?;
    replay_all(&f, &topic, 1).await?;
    wait_for("billing: the replayed e4", patience(&f, 10), || {
        billing.success_counts().get("e4") == Some(&1)
    })
    .await?;
    tokio::time::sleep(u * 4).await;
    ensure(calls(&audit, "e4") == 1, || {
        format!(
            "audit handled e4 {} times: the replay of billing's dead letter reached another group",
            calls(&audit, "e4")
        )
    })?;
    ensure(dlq(&f, &topic).await?.is_empty(), || {
        "the DLQ is not empty after the replay".into()
    })?;
    finish(&f, &topic, vec![a, b]).await?;
    Ok(Verdict::Pass(None))
}
