//! Dead letters: replay back to the origin, and a DLQ that refuses writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use retry_core::classify::HandlerError;
use retry_core::dlq::DlqFilter;
use retry_core::event::Event;

use super::support::*;
use super::{ScenarioResult, Verdict};
use crate::fixture::Fixture;
use crate::probe::{Act, Probe, ensure, wait_for, wait_for_async};

/// Scenario 9: DLQ replay → processed, DLQ emptied, replay count recorded, attempts restarted.
pub(super) async fn dlq_replay(f: Arc<Fixture>) -> ScenarioResult {
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
        .broker()
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

/// Scenario 15: DLQ unwritable → the original is not acked, the error surfaces, nothing is lost.
pub(super) async fn dlq_unwritable_not_acked(f: Arc<Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s15").await.map_err(|e| e.to_string())?;
    let faults = f.faults().ok_or("the fixture has no fault switches")?;
    faults
        .set_dlq_writable(&topic, false)
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
    faults
        .set_dlq_writable(&topic, true)
        .await
        .map_err(|e| e.to_string())?;
    let entries = wait_dlq(&f, &topic, 1, patience(&f, 10)).await?;
    ensure(
        entries[0].event.metadata().event_id.as_deref() == Some("victim"),
        || "wrong DLQ entry".into(),
    )?;
    finish(&f, &topic, vec![c]).await?;
    Ok(Verdict::Pass(None))
}
