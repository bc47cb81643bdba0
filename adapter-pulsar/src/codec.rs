//! Events as Pulsar messages.
//!
//! Pulsar properties are text, so the SDK's metadata (text already) and every producer header that is
//! valid UTF-8 travel as they are; a binary header travels as base64 and is named in `x-retry-binary`
//! (names separated by newlines), so it comes back byte for byte. The key is the partition key (base64
//! with Pulsar's own flag when it is not UTF-8) and the ordering key (its bytes, which Key_Shared
//! subscriptions hash). Properties come back sorted by name, and a name may appear once (for the SDK's
//! reserved `x-retry-*` names, the last value wins).

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use pulsar::producer;
use pulsar::proto::MessageMetadata;
use retry_core::error::{Error, Kind};
use retry_core::event::RawMessage;
use retry_core::headers::Headers;
use retry_core::metadata;

/// The property naming the headers sent as base64.
pub(crate) const BINARY: &str = "x-retry-binary";
/// The property of a dead letter naming the consumer group that dead-lettered it (a replay goes back to
/// that group's retry topic).
pub(crate) const GROUP: &str = "x-retry-group";

/// A producer message for `raw`, to be delivered at `deliver_at` (ms since the epoch) if given.
pub(crate) fn encode(
    raw: &RawMessage,
    deliver_at: Option<i64>,
) -> Result<producer::Message, Error> {
    let mut properties = HashMap::with_capacity(raw.headers.len() + 1);
    let mut binary = Vec::new();
    for (name, value) in raw.headers.iter() {
        if name == BINARY || name.contains('\n') {
            return Err(Error::new(
                Kind::InvalidInput,
                format!("header name {name:?} cannot be a Pulsar property"),
            ));
        }
        let text = match std::str::from_utf8(value) {
            Ok(text) => text.to_string(),
            Err(_) => {
                binary.push(name);
                STANDARD.encode(value)
            }
        };
        // A producer's own `x-retry-*` header after the SDK's metadata wins, as a later header does on
        // every broker (and a malformed one makes the event poison); any other repeat is refused.
        if properties.insert(name.to_string(), text).is_some()
            && !name.starts_with(metadata::PREFIX)
        {
            return Err(Error::new(
                Kind::InvalidInput,
                format!("header {name:?} appears twice; Pulsar properties are unique by name"),
            ));
        }
    }
    if !binary.is_empty() {
        properties.insert(BINARY.to_string(), binary.join("\n"));
    }
    let (partition_key, b64) = match &raw.key {
        None => (None, None),
        Some(key) => match std::str::from_utf8(key) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (Some(STANDARD.encode(key)), Some(true)),
        },
    };
    Ok(producer::Message {
        payload: raw.payload.to_vec(),
        properties,
        partition_key,
        partition_key_b64_encoded: b64,
        ordering_key: raw.key.as_ref().map(|k| k.to_vec()),
        deliver_at_time: deliver_at,
        ..producer::Message::default()
    })
}

/// The message a consumer received.
pub(crate) fn decode(data: Vec<u8>, metadata: &MessageMetadata) -> RawMessage {
    let binary: Vec<&str> = metadata
        .properties
        .iter()
        .find(|kv| kv.key == BINARY)
        .map(|kv| kv.value.split('\n').collect())
        .unwrap_or_default();
    let mut props: Vec<(&String, &String)> = metadata
        .properties
        .iter()
        .filter(|kv| kv.key != BINARY)
        .map(|kv| (&kv.key, &kv.value))
        .collect();
    props.sort();
    let mut headers = Headers::with_capacity(props.len());
    for (name, value) in props {
        let bytes = if binary.contains(&name.as_str()) {
            STANDARD
                .decode(value)
                .map(Bytes::from)
                .unwrap_or_else(|_| Bytes::copy_from_slice(value.as_bytes()))
        } else {
            Bytes::copy_from_slice(value.as_bytes())
        };
        headers.push(name.clone(), bytes);
    }
    let key = match (&metadata.ordering_key, &metadata.partition_key) {
        (Some(bytes), _) => Some(Bytes::copy_from_slice(bytes)),
        (None, Some(key)) if metadata.partition_key_b64_encoded() => {
            STANDARD.decode(key).ok().map(Bytes::from)
        }
        (None, Some(key)) => Some(Bytes::copy_from_slice(key.as_bytes())),
        (None, None) => None,
    };
    RawMessage {
        payload: Bytes::from(data),
        key,
        headers,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use pulsar::proto::KeyValue;

    fn received(m: producer::Message) -> RawMessage {
        let metadata = MessageMetadata {
            properties: m
                .properties
                .into_iter()
                .map(|(key, value)| KeyValue { key, value })
                .collect(),
            partition_key: m.partition_key,
            partition_key_b64_encoded: m.partition_key_b64_encoded,
            ordering_key: m.ordering_key,
            ..MessageMetadata::default()
        };
        decode(m.payload, &metadata)
    }

    #[test]
    fn binary_headers_and_keys_round_trip() {
        let raw = RawMessage {
            payload: Bytes::from_static(&[0, 255]),
            key: Some(Bytes::from_static(&[0x00, 0xff, b'k'])),
            headers: Headers::new()
                .with("a-bin", Bytes::from_static(&[0xff, 0x00]))
                .with("b-text", "héllo"),
        };
        let back = received(encode(&raw, Some(42)).unwrap());
        assert_eq!(back, raw);
    }

    #[test]
    fn text_keys_are_plain_partition_keys() {
        let raw = RawMessage {
            payload: Bytes::from_static(b"x"),
            key: Some(Bytes::from_static(b"customer-1")),
            headers: Headers::new(),
        };
        let m = encode(&raw, None).unwrap();
        assert_eq!(m.partition_key.as_deref(), Some("customer-1"));
        assert_eq!(m.partition_key_b64_encoded, None);
        assert_eq!(received(m), raw);
    }

    #[test]
    fn repeated_headers_are_refused() {
        let raw = RawMessage {
            payload: Bytes::new(),
            key: None,
            headers: Headers::new().with("h", "1").with("h", "2"),
        };
        assert!(encode(&raw, None).is_err());
    }
}
