//! Fidelity: malformed input becomes a poison DLQ entry with its reason, and payload, key and headers
//! survive every hop byte for byte.

use std::sync::Arc;

use bytes::Bytes;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::metadata::{DeadReason, names};
use event_retry_core::runtime::decode_json;

use super::support::*;
use super::{ScenarioResult, Verdict};
use crate::fixture::{Fixture, hex};
use crate::probe::{Act, Probe, ensure, wait_for};

/// Scenario 10: poison input (malformed or oversized metadata, undecodable payload) → DLQ with the
/// reason; the consumer stays alive.
pub async fn poison_input_to_dlq(f: Arc<Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s10").await.map_err(|e| e.to_string())?;
    let probe = Probe::new(|e, _| match decode_json::<serde::de::IgnoredAny>(e) {
        Ok(_) => Act::Ok,
        Err(err) => Act::Fail(err),
    });
    let c = start(&f, builder(&f, &topic, "c1"), &probe).await?;
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

/// Scenario 12: payload, key and headers — names out of order and repeated — byte for byte through
/// every hop (retries, the delay route, the DLQ, a replay and the DLQ again), as the handler sees them;
/// and, with the broker's raw client, a natively published message's every native field (typed header
/// values, properties, keys, timestamps) equal in the DLQ after its retries and again after a replay.
pub async fn bytes_preserved_every_hop(f: Arc<Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s12").await.map_err(|e| e.to_string())?;
    let payload = Bytes::from((0..=255u8).rev().chain(0..=255u8).collect::<Vec<u8>>());
    let key = Bytes::from_static(&[0x00, 0xff, 0x80, b'k', 0x7f]);
    // Names out of order, repeated, binary and empty values: what a broker with map-shaped headers would
    // sort, merge or drop if the SDK did not carry the layout.
    let original = Event::new(payload.clone())
        .with_id("bytes")
        .with_key(key.clone())
        .with_header("zulu", Bytes::from_static(&[0xff, 0x00, 0xfe, 0x80]))
        .with_header("custom-text", "héllo wörld")
        .with_header("zulu", "second zulu")
        .with_header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .with_header("empty", "")
        .with_header("custom-text", Bytes::from_static(&[0x80, 0x81]));
    let native_payload = format!("native-{}", uuid::Uuid::new_v4().simple());
    // Two deferred failures (two trips through the delay route), then the policy is spent: DLQ. After a
    // replay, a non-retryable failure sends it straight back to the DLQ.
    let probe = Probe::new(|e, _| {
        if e.metadata().replay_count > 0 {
            Act::Fail(HandlerError::non_retryable("back to the DLQ"))
        } else {
            deferred("keep going")
        }
    });
    let b = builder(&f, &topic, "c1").policy(policy(&format!("{}ms x2", ms(unit(&f)))));
    let c = start(&f, b, &probe).await?;
    publish(&f, &topic, original.clone()).await?;
    let native = match f.raw_client() {
        Some(raw) => Some(
            raw.publish_native(&topic, native_payload.as_bytes())
                .await
                .map_err(|e| format!("raw publish: {e}"))?,
        ),
        None => None,
    };
    let expected_entries = if native.is_some() { 2 } else { 1 };
    let entries = wait_dlq(&f, &topic, expected_entries, patience(&f, 20)).await?;
    check_sdk_view(&probe, &original, &entries, 3, 0)?;
    if let Some(native) = &native {
        check_native(
            &f,
            &topic,
            native,
            native_payload.as_bytes(),
            "after two retries",
        )
        .await?;
    }

    replay_all(&f, &topic, expected_entries).await?;
    let deadline = std::time::Instant::now() + patience(&f, 20);
    let entries = loop {
        let entries = dlq(&f, &topic).await?;
        if entries.len() >= expected_entries
            && entries.iter().all(|e| e.event.metadata().replay_count == 1)
        {
            break entries;
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "the replayed events did not come back to the DLQ: {} entries",
                entries.len()
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    check_sdk_view(&probe, &original, &entries, 4, 1)?;
    let verdict = match &native {
        Some(native) => {
            check_native(
                &f,
                &topic,
                native,
                native_payload.as_bytes(),
                "after a replay",
            )
            .await?;
            Verdict::Pass(Some(format!(
                "{} native fields equal after retries and a replay",
                native.len()
            )))
        }
        None => Verdict::Partial("no raw client: native fields not read".to_string()),
    };
    finish(&f, &topic, vec![c]).await?;
    Ok(verdict)
}

/// The handler saw `original`'s payload, key and headers on every one of its `calls` calls, and the DLQ
/// entry (of replay count `replays`) holds them too.
fn check_sdk_view(
    probe: &Probe,
    original: &Event,
    entries: &[event_retry_core::dlq::DeadLetter],
    calls: usize,
    replays: u32,
) -> Result<(), String> {
    let seen = probe.calls_of("bytes");
    ensure(seen.len() == calls, || {
        format!("{} calls, want {calls}", seen.len())
    })?;
    for (hop, call) in seen.iter().enumerate() {
        ensure(call.payload == original.payload, || {
            format!("payload changed at hop {hop}")
        })?;
        ensure(call.key == original.key, || {
            format!("key changed at hop {hop}: {:?}", call.key)
        })?;
        ensure(call.headers == original.headers, || {
            format!(
                "headers changed at hop {hop}:\n  got  {:?}\n  want {:?}",
                call.headers, original.headers
            )
        })?;
    }
    let dead = entries
        .iter()
        .find(|e| e.event.id() == Some("bytes") && e.event.metadata().replay_count == replays)
        .ok_or("the event is not in the DLQ")?;
    ensure(
        dead.event.payload == original.payload && dead.event.key == original.key,
        || "payload or key changed in the DLQ".into(),
    )?;
    ensure(dead.event.headers == original.headers, || {
        format!(
            "headers changed in the DLQ:\n  got  {:?}\n  want {:?}",
            dead.event.headers, original.headers
        )
    })
}

/// The natively published message, read from the DLQ with the broker's raw client, is field for field
/// what was published.
async fn check_native(
    f: &Arc<Fixture>,
    topic: &str,
    published: &[(String, String)],
    payload: &[u8],
    when: &str,
) -> Result<(), String> {
    let raw = f.raw_client().ok_or("no raw client")?;
    let payload_line = ("payload".to_string(), hex(payload));
    let entries = raw
        .dead_letters(topic)
        .await
        .map_err(|e| format!("raw read of the DLQ: {e}"))?;
    // Every copy of it: a broker whose DLQ is a log (Kafka) still holds the entry a replay marked done.
    let mine: Vec<_> = entries
        .iter()
        .filter(|m| m.contains(&payload_line))
        .collect();
    ensure(!mine.is_empty(), || {
        format!(
            "{when}: none of the {} DLQ entries carries the native payload",
            entries.len()
        )
    })?;
    for got in mine {
        ensure(got.as_slice() == published, || {
            let missing: Vec<_> = published.iter().filter(|l| !got.contains(l)).collect();
            let extra: Vec<_> = got.iter().filter(|l| !published.contains(l)).collect();
            format!(
                "{when}: the DLQ copy differs from the native message as published (raw client):\n  \
                 lost or changed {missing:?}\n  added or changed {extra:?}\n  published {published:?}\n  \
                 in the DLQ {got:?}"
            )
        })?;
    }
    Ok(())
}
