//! Consumer groups: a crashed consumer's work goes to another, and a rebalance during retries keeps
//! exact counts.

use std::collections::HashMap;
use std::sync::Arc;

use retry_core::event::Event;

use super::support::*;
use super::{ScenarioResult, Verdict};
use crate::fixture::Fixture;
use crate::probe::{Act, Probe, ensure, wait_for};

/// Scenario 8: Crash mid-handle: the consumer dies without settling; a new consumer gets everything.
pub(super) async fn crash_mid_handle_redelivered(f: Arc<Fixture>) -> ScenarioResult {
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

/// Scenario 14: Two consumers in one group, a rebalance during retries: exact counts, nothing lost.
pub(super) async fn rebalance_during_retries(f: Arc<Fixture>) -> ScenarioResult {
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
