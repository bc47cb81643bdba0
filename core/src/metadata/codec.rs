//! The wire codec: metadata written to headers — one per field, or packed into one header holding a
//! JSON object — and read back, strictly (a value that does not parse is an error) or leniently (what
//! parses is kept, for a poison event's DLQ entry).
//!
//! Separate from the data types and the names because it is the one place that knows the wire format:
//! the field order, the limits on lengths, the packed form and the layout of a map broker's headers.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::types::{
    DeadInfo, DeadReason, MetadataError, Origin, OriginTimestamp, RetryMetadata, TimestampKind,
    truncate_utf8,
};
use super::{MAX_ERROR_BYTES, MAX_PACKED_BYTES, MAX_VALUE_BYTES, PACKED, PREFIX, names};
use crate::headers::Headers;
use crate::time::{Timestamp, duration_ms};

/// How metadata is laid out in headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// One header per field.
    Headers,
    /// All fields in one `x-retry` header holding a JSON object (for brokers with few attributes).
    Single,
}

/// One field's value, borrowed from the metadata, before it is written out.
enum Value<'a> {
    Text(&'a str),
    Number(u64),
    Signed(i64),
}

impl Value<'_> {
    fn to_text(&self) -> String {
        match self {
            Value::Text(s) => (*s).to_string(),
            Value::Number(n) => n.to_string(),
            Value::Signed(n) => n.to_string(),
        }
    }
}

/// Calls `emit` for every field that is set, in a fixed order, without allocating.
#[inline]
fn for_each_field(meta: &RetryMetadata, mut emit: impl FnMut(&'static str, Value<'_>)) {
    if let Some(id) = &meta.event_id {
        emit(names::EVENT_ID, Value::Text(id));
    }
    emit(names::ATTEMPTS, Value::Number(meta.attempts.into()));
    if meta.retries > 0 {
        emit(names::RETRIES, Value::Number(meta.retries.into()));
    }
    if let Some(t) = meta.first_seen {
        emit(names::FIRST_SEEN, Value::Number(t.as_millis()));
    }
    if let Some(t) = meta.due_at {
        emit(names::DUE_AT, Value::Number(t.as_millis()));
    }
    if let Some(o) = &meta.origin {
        emit(names::ORIGIN_TOPIC, Value::Text(&o.topic));
        if let Some(p) = o.partition {
            emit(names::ORIGIN_PARTITION, Value::Signed(p.into()));
        }
        if let Some(off) = o.offset {
            emit(names::ORIGIN_OFFSET, Value::Signed(off));
        }
        if let Some(t) = o.timestamp {
            emit(names::ORIGIN_TIMESTAMP, Value::Number(t.at.as_millis()));
            emit(names::ORIGIN_TIMESTAMP_TYPE, Value::Text(t.kind.as_str()));
        }
    }
    if let Some(e) = &meta.last_error {
        emit(
            names::LAST_ERROR,
            Value::Text(truncate_utf8(e, MAX_ERROR_BYTES)),
        );
    }
    if let Some(k) = meta.error_kind {
        emit(names::ERROR_KIND, Value::Text(k.as_str()));
    }
    if let Some(d) = meta.last_delay {
        emit(names::LAST_DELAY, Value::Number(duration_ms(d)));
    }
    if meta.replay_count > 0 {
        emit(names::REPLAY_COUNT, Value::Number(meta.replay_count.into()));
    }
    if let Some(t) = meta.replayed_at {
        emit(names::REPLAYED_AT, Value::Number(t.as_millis()));
    }
    if let Some(p) = &meta.parked_behind {
        emit(names::PARKED_BEHIND, Value::Text(p));
    }
    if let Some(d) = &meta.dead {
        emit(names::DEAD_REASON, Value::Text(d.reason.as_str()));
        emit(names::DEAD_AT, Value::Number(d.at.as_millis()));
        emit(names::DEAD_CONSUMER, Value::Text(&d.consumer));
    }
    if let Some(from) = &meta.migrated_from {
        emit(names::MIGRATED_FROM, Value::Text(from));
    }
}

/// Receives encoded metadata fields one by one — typically a broker client's header builder, so an
/// adapter writes metadata straight into its native headers with no intermediate copies.
pub trait HeaderSink {
    /// One header: a metadata name and its value's bytes (UTF-8 text).
    fn header(&mut self, name: &'static str, value: &[u8]);
}

impl HeaderSink for Headers {
    fn header(&mut self, name: &'static str, value: &[u8]) {
        self.push(name, Bytes::copy_from_slice(value));
    }
}

/// Writes every set metadata field into `sink`, one header per field, in a fixed order; allocates
/// nothing itself.
pub fn encode_into<S: HeaderSink + ?Sized>(meta: &RetryMetadata, sink: &mut S) {
    for_each_field(meta, |name, value| match value {
        Value::Text(s) => sink.header(name, s.as_bytes()),
        Value::Number(n) => sink.header(name, itoa::Buffer::new().format(n).as_bytes()),
        Value::Signed(n) => sink.header(name, itoa::Buffer::new().format(n).as_bytes()),
    });
}

/// Encodes metadata as one header per field, followed by the producer's headers in their order.
pub fn encode(meta: &RetryMetadata, foreign: &Headers) -> Headers {
    encode_with(meta, foreign, Packing::Headers)
}

/// Encodes metadata with the given packing, followed by the producer's headers in their order.
pub fn encode_with(meta: &RetryMetadata, foreign: &Headers, packing: Packing) -> Headers {
    let mut out = Headers::with_capacity(16 + foreign.len());
    match packing {
        Packing::Headers => encode_into(meta, &mut out),
        Packing::Single => out.push(PACKED, encode_packed(meta)),
    }
    for (name, value) in foreign.iter_owned() {
        out.push(name, value);
    }
    out
}

/// Encodes metadata as the JSON object of the packed form.
pub fn encode_packed(meta: &RetryMetadata) -> Bytes {
    encode_packed_with_layout(meta, None)
}

fn encode_packed_with_layout(meta: &RetryMetadata, layout: Option<&str>) -> Bytes {
    let mut map = serde_json::Map::new();
    for_each_field(meta, |name, value| {
        map.insert(
            name.trim_start_matches(PREFIX).to_string(),
            serde_json::Value::String(value.to_text()),
        );
    });
    if let Some(layout) = layout {
        map.insert(
            crate::layout::LAYOUT.trim_start_matches(PREFIX).to_string(),
            serde_json::Value::String(layout.to_string()),
        );
    }
    Bytes::from(serde_json::Value::Object(map).to_string())
}

/// Metadata and producer headers for a broker whose headers are a map (AMQP tables, SQS attributes,
/// Pulsar properties): the SDK's headers — the metadata fields, with `packing`, and where needed the
/// [layout](crate::layout) that restores the producer's order and repeated names — and the producer's
/// headers to write natively, the first value of each name. [`decode`] puts it all back.
pub fn encode_for_map<'a>(
    meta: &RetryMetadata,
    producer: &'a Headers,
    packing: Packing,
) -> (Headers, Vec<(&'a str, &'a Bytes)>) {
    let split = crate::layout::split(producer);
    let mut sdk = Headers::with_capacity(20);
    match packing {
        Packing::Headers => {
            encode_into(meta, &mut sdk);
            if let Some(layout) = split.layout {
                sdk.push(crate::layout::LAYOUT, layout);
            }
        }
        Packing::Single => sdk.push(
            PACKED,
            encode_packed_with_layout(meta, split.layout.as_deref()),
        ),
    }
    (sdk, split.unique)
}

/// Splits headers into the SDK's metadata and the producer's own headers.
///
/// Unknown names inside the namespace are kept as producer headers (a newer SDK's fields survive an older
/// consumer). Fails on a value that is too long, not UTF-8, or not of its field's type.
pub fn decode(headers: &Headers) -> Result<(RetryMetadata, Headers), MetadataError> {
    let (mut meta, mut foreign) = (RetryMetadata::default(), Headers::new());
    decode_into(headers, &mut meta, &mut foreign)?;
    Ok((meta, foreign))
}

/// [`decode`] into `meta` and `foreign` (default values, as [`RetryMetadata::default`] and
/// [`Headers::new`] make them): the event a consumer decodes is built where it stays, not moved from a
/// returned pair (a copy of the whole event, per event, which the runtime bench shows among its largest
/// costs).
pub(crate) fn decode_into(
    headers: &Headers,
    meta: &mut RetryMetadata,
    foreign: &mut Headers,
) -> Result<(), MetadataError> {
    let mut first_error = None;
    decode_with(headers, meta, foreign, |e| {
        first_error.get_or_insert(e);
        false
    });
    first_error.map_or(Ok(()), Err)
}

/// Decodes what can be decoded: a malformed field is skipped (and its header dropped) instead of failing
/// the whole, and every problem is returned. For poison events, so their DLQ entry keeps the event id,
/// origin and history that did parse.
pub fn decode_lenient(headers: &Headers) -> (RetryMetadata, Headers, Vec<MetadataError>) {
    let mut errors = Vec::new();
    let (mut meta, mut foreign) = (RetryMetadata::default(), Headers::new());
    decode_with(headers, &mut meta, &mut foreign, |e| {
        errors.push(e);
        true
    });
    (meta, foreign, errors)
}

/// The decoding loop, into `meta` and `foreign`; `on_error` records a problem and says whether to go on.
fn decode_with(
    headers: &Headers,
    meta: &mut RetryMetadata,
    foreign: &mut Headers,
    mut on_error: impl FnMut(MetadataError) -> bool,
) {
    let mut parts = Parts::default();
    for (owned_name, value) in headers.entries() {
        let name = owned_name.as_ref();
        let applied = if name == PACKED {
            decode_packed(value, meta, &mut parts).map(|()| true)
        } else if name == crate::layout::LAYOUT {
            parts.layout = Some(value.clone());
            Ok(true)
        } else if name.starts_with(PREFIX) {
            apply(meta, &mut parts, name, value)
        } else {
            Ok(false)
        };
        match applied {
            Ok(true) => {}
            Ok(false) => foreign.push(owned_name.clone(), value.clone()),
            Err(e) => {
                if !on_error(e) {
                    return;
                }
            }
        }
    }
    match parts.dead() {
        Ok(info) => meta.dead = info,
        Err(e) => {
            if !on_error(e) {
                return;
            }
        }
    }
    match parts.origin_timestamp() {
        Ok(Some(t)) => meta.origin.get_or_insert_with(Origin::default).timestamp = Some(t),
        Ok(None) => {}
        Err(e) => {
            if !on_error(e) {
                return;
            }
        }
    }
    if let Some(layout) = parts.layout {
        // A layout that does not parse leaves the headers as the broker gave them (and makes the event
        // poison, with the reason): nothing of the producer's is dropped.
        match crate::layout::restore(foreign, &layout) {
            Ok(restored) => *foreign = restored,
            Err(problem) => {
                on_error(MetadataError {
                    header: crate::layout::LAYOUT.to_string(),
                    problem,
                });
            }
        }
    }
}

/// The metadata fields, for decoding by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    EventId,
    Attempts,
    Retries,
    FirstSeen,
    DueAt,
    OriginTopic,
    OriginPartition,
    OriginOffset,
    OriginTimestamp,
    OriginTimestampType,
    LastError,
    FailureKind,
    LastDelay,
    ReplayCount,
    ReplayedAt,
    ParkedBehind,
    MigratedFrom,
    DeadReason,
    DeadAt,
    DeadConsumer,
}

const FIELDS: [(&str, Field); 20] = [
    (names::EVENT_ID, Field::EventId),
    (names::ATTEMPTS, Field::Attempts),
    (names::RETRIES, Field::Retries),
    (names::FIRST_SEEN, Field::FirstSeen),
    (names::DUE_AT, Field::DueAt),
    (names::ORIGIN_TOPIC, Field::OriginTopic),
    (names::ORIGIN_PARTITION, Field::OriginPartition),
    (names::ORIGIN_OFFSET, Field::OriginOffset),
    (names::ORIGIN_TIMESTAMP, Field::OriginTimestamp),
    (names::ORIGIN_TIMESTAMP_TYPE, Field::OriginTimestampType),
    (names::LAST_ERROR, Field::LastError),
    (names::ERROR_KIND, Field::FailureKind),
    (names::LAST_DELAY, Field::LastDelay),
    (names::REPLAY_COUNT, Field::ReplayCount),
    (names::REPLAYED_AT, Field::ReplayedAt),
    (names::PARKED_BEHIND, Field::ParkedBehind),
    (names::MIGRATED_FROM, Field::MigratedFrom),
    (names::DEAD_REASON, Field::DeadReason),
    (names::DEAD_AT, Field::DeadAt),
    (names::DEAD_CONSUMER, Field::DeadConsumer),
];

/// Whether `name` is written by the SDK's metadata codec (a field, the packed form, the layout): a copy
/// of a message writes these anew, and keeps every other header — unknown names in the SDK's namespace
/// too (a newer SDK's fields survive an older consumer).
pub fn is_sdk_field(name: &str) -> bool {
    name == PACKED || name == names::LAYOUT || field_of(name).is_some()
}

/// The field a header name denotes; only names of equal length are compared byte by byte.
fn field_of(name: &str) -> Option<Field> {
    let len = name.len();
    FIELDS
        .iter()
        .find(|(n, _)| n.len() == len && *n == name)
        .map(|&(_, f)| f)
}

fn check_length(name: &str, value: &[u8], max: usize) -> Result<(), MetadataError> {
    if value.len() > max {
        return Err(MetadataError {
            header: name.to_string(),
            problem: format!("is {} bytes (limit {max})", value.len()),
        });
    }
    Ok(())
}

fn decode_packed(
    value: &Bytes,
    meta: &mut RetryMetadata,
    parts: &mut Parts,
) -> Result<(), MetadataError> {
    check_length(
        PACKED,
        value,
        MAX_PACKED_BYTES + crate::layout::MAX_LAYOUT_BYTES,
    )?;
    let text = text(PACKED, value)?;
    let bad = |problem: String| MetadataError {
        header: PACKED.to_string(),
        problem,
    };
    let parsed: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("is not a JSON object: {e}")))?;
    let serde_json::Value::Object(map) = parsed else {
        return Err(bad("is not a JSON object".to_string()));
    };
    for (short, v) in map {
        let name = format!("{PREFIX}{short}");
        if name == crate::layout::LAYOUT {
            let serde_json::Value::String(layout) = v else {
                return Err(bad("field \"layout\" is not a string".to_string()));
            };
            parts.layout = Some(Bytes::from(layout));
            continue;
        }
        if field_of(&name).is_none() {
            continue;
        }
        let serde_json::Value::String(s) = v else {
            return Err(bad(format!("field {short:?} is not a string")));
        };
        if s.len() > MAX_VALUE_BYTES {
            return Err(bad(format!(
                "field {short:?} is {} bytes (limit {MAX_VALUE_BYTES})",
                s.len()
            )));
        }
        apply(meta, parts, &name, s.as_bytes())?;
    }
    Ok(())
}

/// Fields decoded apart and combined at the end: the dead-letter record, the origin's timestamp, the
/// layout of the producer's headers.
#[derive(Default)]
struct Parts {
    reason: Option<DeadReason>,
    at: Option<Timestamp>,
    consumer: Option<String>,
    timestamp: Option<Timestamp>,
    timestamp_kind: Option<TimestampKind>,
    layout: Option<Bytes>,
}

impl Parts {
    fn origin_timestamp(&self) -> Result<Option<OriginTimestamp>, MetadataError> {
        match (self.timestamp, self.timestamp_kind) {
            (None, None) => Ok(None),
            (Some(at), kind) => Ok(Some(OriginTimestamp {
                at,
                kind: kind.unwrap_or(TimestampKind::CreateTime),
            })),
            (None, Some(_)) => Err(MetadataError {
                header: names::ORIGIN_TIMESTAMP.to_string(),
                problem: "is missing while its type is present".to_string(),
            }),
        }
    }

    fn dead(&self) -> Result<Option<DeadInfo>, MetadataError> {
        match (self.reason, self.at, self.consumer.clone()) {
            (None, None, None) => Ok(None),
            (Some(reason), at, consumer) => Ok(Some(DeadInfo {
                reason,
                at: at.unwrap_or_default(),
                consumer: consumer.unwrap_or_default(),
            })),
            (None, _, _) => Err(MetadataError {
                header: names::DEAD_REASON.to_string(),
                problem: "is missing while other dead-letter fields are present".to_string(),
            }),
        }
    }
}

fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit()
            .then_some(())
            .and_then(|()| acc.checked_mul(10)?.checked_add(u64::from(b - b'0')))
    })
}

fn not_a_number(name: &str, bytes: &[u8]) -> MetadataError {
    MetadataError {
        header: name.to_string(),
        problem: format!(
            "is not a valid number: {:?}",
            truncate_utf8(&String::from_utf8_lossy(bytes), 64)
        ),
    }
}

/// Parses an unsigned decimal straight from the header bytes (no UTF-8 pass, no allocation).
fn number<T: TryFrom<u64>>(name: &str, bytes: &[u8]) -> Result<T, MetadataError> {
    digits(bytes)
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| not_a_number(name, bytes))
}

/// Parses a signed decimal straight from the header bytes.
fn signed<T: TryFrom<i64>>(name: &str, bytes: &[u8]) -> Result<T, MetadataError> {
    let value = match bytes.split_first() {
        Some((b'-', rest)) => digits(rest).and_then(|n| i64::try_from(n).ok()).map(|n| -n),
        _ => digits(bytes).and_then(|n| i64::try_from(n).ok()),
    };
    value
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| not_a_number(name, bytes))
}

fn text<'a>(name: &str, bytes: &'a [u8]) -> Result<&'a str, MetadataError> {
    std::str::from_utf8(bytes).map_err(|_| MetadataError {
        header: name.to_string(),
        problem: "is not UTF-8 text".to_string(),
    })
}

/// Applies one header to the metadata; `Ok(false)` when the name is not a metadata field.
fn apply(
    meta: &mut RetryMetadata,
    parts: &mut Parts,
    name: &str,
    value: &[u8],
) -> Result<bool, MetadataError> {
    let Some(field) = field_of(name) else {
        return Ok(false);
    };
    check_length(name, value, MAX_VALUE_BYTES)?;
    let text = |v| text(name, v);
    match field {
        Field::EventId => meta.event_id = Some(Arc::from(text(value)?)),
        Field::Attempts => meta.attempts = number(name, value)?,
        Field::Retries => meta.retries = number(name, value)?,
        Field::FirstSeen => meta.first_seen = Some(Timestamp::from_millis(number(name, value)?)),
        Field::DueAt => meta.due_at = Some(Timestamp::from_millis(number(name, value)?)),
        Field::ReplayedAt => {
            meta.replayed_at = Some(Timestamp::from_millis(number(name, value)?));
        }
        Field::OriginTopic => {
            meta.origin.get_or_insert_with(Origin::default).topic = text(value)?.into()
        }
        Field::OriginPartition => {
            meta.origin.get_or_insert_with(Origin::default).partition = Some(signed(name, value)?)
        }
        Field::OriginOffset => {
            meta.origin.get_or_insert_with(Origin::default).offset = Some(signed(name, value)?)
        }
        Field::OriginTimestamp => {
            parts.timestamp = Some(Timestamp::from_millis(number(name, value)?))
        }
        Field::OriginTimestampType => {
            parts.timestamp_kind = Some(text(value)?.parse().map_err(|problem| MetadataError {
                header: name.to_string(),
                problem,
            })?)
        }
        Field::LastError => meta.last_error = Some(text(value)?.to_string()),
        Field::FailureKind => {
            meta.error_kind = Some(text(value)?.parse().map_err(
                |e: crate::classify::UnknownFailureKind| {
                    MetadataError {
                        header: name.to_string(),
                        // Quoting the start of a forged value only, as for numbers.
                        problem: crate::classify::UnknownFailureKind(
                            truncate_utf8(&e.0, 64).to_string(),
                        )
                        .to_string(),
                    }
                },
            )?)
        }
        Field::LastDelay => meta.last_delay = Some(Duration::from_millis(number(name, value)?)),
        Field::ReplayCount => meta.replay_count = number(name, value)?,
        Field::ParkedBehind => meta.parked_behind = Some(text(value)?.to_string()),
        Field::MigratedFrom => meta.migrated_from = Some(text(value)?.to_string()),
        Field::DeadReason => {
            parts.reason = Some(text(value)?.parse().map_err(|problem| MetadataError {
                header: name.to_string(),
                problem,
            })?)
        }
        Field::DeadAt => parts.at = Some(Timestamp::from_millis(number(name, value)?)),
        Field::DeadConsumer => parts.consumer = Some(text(value)?.to_string()),
    }
    Ok(true)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::classify::FailureKind;
    use proptest::prelude::*;

    #[test]
    fn every_sdk_header_name_is_listed_once_in_the_namespace() {
        let mut seen = std::collections::HashSet::new();
        for name in names::ALL {
            assert!(name == PACKED || name.starts_with(PREFIX), "{name}");
            assert!(seen.insert(name), "{name} is listed twice");
        }
        // The fields are the codec's, in its order, and lead the full list.
        let codec: Vec<&str> = FIELDS.iter().map(|(n, _)| *n).collect();
        assert_eq!(codec, names::FIELDS);
        assert_eq!(names::ALL[..names::FIELDS.len()], names::FIELDS);
        for name in names::ALL {
            assert_eq!(names::interned(name), Some(name));
            let written_by_codec =
                names::FIELDS.contains(&name) || name == names::PACKED || name == names::LAYOUT;
            assert_eq!(is_sdk_field(name), written_by_codec, "{name}");
        }
    }

    fn full() -> RetryMetadata {
        RetryMetadata {
            event_id: Some("evt-42".into()),
            attempts: 3,
            retries: 2,
            first_seen: Some(Timestamp::from_millis(1_700_000_000_000)),
            due_at: Some(Timestamp::from_millis(1_700_000_005_000)),
            origin: Some(
                Origin::new("orders")
                    .at(3, 12_345)
                    .with_timestamp(OriginTimestamp {
                        at: Timestamp::from_millis(1_699_999_999_000),
                        kind: TimestampKind::LogAppendTime,
                    }),
            ),
            last_error: Some("connection refused: héllo".into()),
            error_kind: Some(FailureKind::Deferred),
            last_delay: Some(Duration::from_millis(5_000)),
            replay_count: 1,
            replayed_at: Some(Timestamp::from_millis(1_700_000_001_000)),
            parked_behind: Some("evt-41".into()),
            dead: Some(DeadInfo {
                reason: DeadReason::Exhausted,
                at: Timestamp::from_millis(1_700_000_009_000),
                consumer: "orders-svc-1".into(),
            }),
            migrated_from: Some("rabbitmq:orders:5f1c".into()),
        }
    }

    #[test]
    fn both_packings_round_trip_and_keep_foreign_headers() {
        let foreign = Headers::new()
            .with("traceparent", "00-abc")
            .with("bin", Bytes::from_static(&[0, 0xff]))
            .with("x-retry-from-the-future", "kept");
        for packing in [Packing::Headers, Packing::Single] {
            let encoded = encode_with(&full(), &foreign, packing);
            let (meta, rest) = decode(&encoded).unwrap();
            assert_eq!(meta, full(), "{packing:?}");
            assert_eq!(rest, foreign, "{packing:?}");
        }
        assert_eq!(
            encode_with(&full(), &foreign, Packing::Single).len(),
            1 + foreign.len()
        );
    }

    #[test]
    fn map_brokers_get_order_and_repeats_back_in_both_packings() {
        let producer = Headers::new()
            .with("zulu", Bytes::from_static(&[0xff]))
            .with("alpha", "a")
            .with("zulu", "z2");
        for packing in [Packing::Headers, Packing::Single] {
            let (sdk, unique) = encode_for_map(&full(), &producer, packing);
            // What a map broker gives back: its own (sorted) order, one value per name.
            let mut native: Vec<(String, Bytes)> = unique
                .iter()
                .map(|(n, v)| (n.to_string(), (*v).clone()))
                .chain(sdk.iter_owned().map(|(n, v)| (n.into_owned(), v)))
                .collect();
            native.sort();
            let (meta, back) = decode(&native.into_iter().collect()).unwrap();
            assert_eq!(meta, full(), "{packing:?}");
            assert_eq!(back, producer, "{packing:?}");
        }
    }

    #[test]
    fn a_broken_layout_keeps_every_header_and_makes_the_event_poison() {
        let h = Headers::new()
            .with("b", "2")
            .with("a", "1")
            .with(crate::layout::LAYOUT, "not json");
        assert!(decode(&h).is_err());
        let (_, foreign, errors) = decode_lenient(&h);
        assert_eq!(foreign, Headers::new().with("b", "2").with("a", "1"));
        assert_eq!(errors[0].header, crate::layout::LAYOUT);
    }

    #[test]
    fn malformed_values_are_errors_not_resets() {
        let h = Headers::new().with(names::ATTEMPTS, "abc");
        let err = decode(&h).unwrap_err();
        assert_eq!(err.header, names::ATTEMPTS);
        assert!(err.to_string().contains("not a valid number"), "{err}");

        let h = Headers::new().with(names::EVENT_ID, vec![b'a'; 1 << 20]);
        let err = decode(&h).unwrap_err();
        assert!(err.to_string().contains("1048576 bytes"), "{err}");

        let h = Headers::new().with(names::ERROR_KIND, "fatal");
        assert!(decode(&h).is_err());

        let h = Headers::new().with(names::LAST_ERROR, Bytes::from_static(&[0xff, 0xfe]));
        assert!(decode(&h).unwrap_err().to_string().contains("UTF-8"));

        let h = Headers::new().with(PACKED, "[1,2]");
        assert!(decode(&h).is_err());

        let h = Headers::new().with(names::DEAD_AT, "5");
        assert_eq!(decode(&h).unwrap_err().header, names::DEAD_REASON);
    }

    /// Fuzzing finding (`metadata_headers`): a poison reason quoted a forged value whole — 4 KiB, and
    /// more once escaped — crowding the other reasons out of the DLQ entry's last error.
    #[test]
    fn a_poison_reason_quotes_only_the_start_of_a_forged_value() {
        for name in [
            names::DEAD_REASON,
            names::ORIGIN_TIMESTAMP_TYPE,
            names::ERROR_KIND,
        ] {
            let h = Headers::new().with(name, "\u{1}".repeat(MAX_VALUE_BYTES));
            let err = decode(&h).unwrap_err();
            assert_eq!(err.header, name);
            assert!(err.to_string().len() < 512, "{name}: {err}");
        }
        let layout = format!("{{\"names\":\"{}\"}}", "a".repeat(60_000));
        let h = Headers::new().with(crate::layout::LAYOUT, layout);
        let err = decode(&h).unwrap_err();
        assert_eq!(err.header, crate::layout::LAYOUT);
        assert!(err.to_string().len() < 512, "{err}");
    }

    #[test]
    fn lenient_decoding_keeps_what_parses() {
        let h = Headers::new()
            .with(names::EVENT_ID, "evt-9")
            .with(names::ATTEMPTS, "abc")
            .with(names::ORIGIN_TOPIC, "orders")
            .with(names::RETRIES, vec![b'1'; 5000])
            .with("x-retry-from-the-future", "kept")
            .with("trace", "t");
        let (meta, foreign, errors) = decode_lenient(&h);
        assert_eq!(meta.event_id.as_deref(), Some("evt-9"));
        assert_eq!(meta.origin.map(|o| o.topic).as_deref(), Some("orders"));
        assert_eq!((meta.attempts, meta.retries), (0, 0));
        let names: Vec<&str> = foreign.iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["x-retry-from-the-future", "trace"],
            "bad fields dropped, others kept"
        );
        let headers: Vec<&str> = errors.iter().map(|e| e.header.as_str()).collect();
        assert_eq!(headers, [names::ATTEMPTS, names::RETRIES]);
        assert!(decode(&h).is_err(), "strict decoding still refuses it");
    }

    #[test]
    fn replay_reset_keeps_identity_and_counts_replays() {
        let mut m = full();
        m.reset_for_replay(Timestamp::from_millis(1_800_000_000_000));
        assert_eq!((m.attempts, m.retries, m.replay_count), (0, 0, 2));
        assert_eq!(
            m.replayed_at,
            Some(Timestamp::from_millis(1_800_000_000_000))
        );
        assert_eq!(m.event_id.as_deref(), Some("evt-42"));
        assert!(m.dead.is_none() && m.due_at.is_none());
        assert!(m.origin.is_some() && m.first_seen.is_some());
    }

    proptest! {
        #[test]
        fn decode_never_panics(pairs in proptest::collection::vec(
            (prop::sample::select(FIELDS.iter().map(|(n, _)| *n).chain([PACKED, "other"]).collect::<Vec<_>>()),
             proptest::collection::vec(any::<u8>(), 0..64)), 0..8)) {
            let headers: Headers = pairs.into_iter().map(|(n, v)| (n.to_string(), Bytes::from(v))).collect();
            let _ = decode(&headers);
        }

        #[test]
        fn foreign_headers_pass_byte_for_byte(pairs in proptest::collection::vec(
            ("[a-w][a-z0-9-]{0,12}", proptest::collection::vec(any::<u8>(), 0..32)), 0..6)) {
            let foreign: Headers = pairs.into_iter().map(|(n, v)| (n, Bytes::from(v))).collect();
            let (_, back) = decode(&encode(&full(), &foreign)).unwrap();
            prop_assert_eq!(back, foreign);
        }
    }
}
