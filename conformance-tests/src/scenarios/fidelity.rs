//! Fidelity: malformed input becomes a poison DLQ entry with its reason, and payload, key and headers
//! survive every hop byte for byte.

use std::sync::Arc;

use bytes::Bytes;
use retry_core::event::Event;
use retry_core::metadata::{DeadReason, names};
use retry_core::runtime::decode_json;

use super::support::*;
use super::{ScenarioResult, Verdict};
use crate::fixture::Fixture;
use crate::probe::{Act, Probe, ensure, wait_for};

/// Scenario 10: poison input (malformed or oversized metadata, undecodable payload) → DLQ with the
/// reason; the consumer stays alive.
pub(super) async fn poison_input_to_dlq(f: Arc<Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s10").await.map_err(|e| e.to_string())?;
    let probe = Probe::new(|e, _| match decode_json::<serde::de::IgnoredAny>(e) {
        Ok(_) => Act::Ok,
        Err(err) => Act::Fail(err),
    });
    let c = start(builder(&f, &topic, "c1"), &probe).await?;
    publish_raw(
        &f,
        &topic,
        Event::new("{}")
            .with_id("poison-1")
            .with_header(names::ATTEMPTS, "abc"),
    )
    .await?;
    publish_raw(
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
        .map(|e| e.event.metadata().last_error.clone().unwrap_or_default())
        .collect();
    for e in &entries {
        let dead = e
            .event
            .metadata()
            .dead
            .as_ref()
            .ok_or("no dead-letter metadata")?;
        ensure(dead.reason == DeadReason::Poison, || {
            format!(
                "reason {:?} for {:?}",
                dead.reason,
                e.event.metadata().last_error
            )
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
        .find(|e| e.event.metadata().event_id.as_deref() == Some("poison-1"));
    ensure(
        salvaged.is_some_and(|e| {
            e.event
                .metadata()
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

/// Scenario 12: Payload, key and custom headers preserved byte for byte through every hop and into the DLQ.
pub(super) async fn bytes_preserved_every_hop(f: Arc<Fixture>) -> ScenarioResult {
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
