//! Events as Pulsar messages, and copies that keep everything the producer set.
//!
//! Pulsar properties are text, so the SDK's metadata (text already) and every producer header that is
//! valid UTF-8 travel as they are; a binary header travels as base64 and is named in `x-retry-binary`
//! (names separated by newlines), so it comes back byte for byte. The client writes properties from a
//! map — one value per name, in no set order — so the first value of each name is a property and the
//! [layout](event_retry_core::layout) (`x-retry-layout`) restores the producer's order and repeated names.
//! A new message's key is its partition key (base64, with Pulsar's own flag, when it is not UTF-8).
//!
//! A copy (a retry, a dead letter, a replay, a release) keeps the original's [`Envelope`]: its
//! properties, partition key (and its base64 flag) and ordering key each as they were — absent stays
//! absent — and its event time. Only the SDK's own properties are written anew. The handler's key is the
//! partition key, or the ordering key when the message has only that.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use event_retry_core::adapter::Native;
use event_retry_core::error::{Error, Kind};
use event_retry_core::event::{Event, RawMessage};
use event_retry_core::headers::Headers;
use event_retry_core::metadata::{self, Packing};
use pulsar::producer;
use pulsar::proto::MessageMetadata;

/// What a received message carried besides its payload, kept so that a copy writes it again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Envelope {
    /// Every property, the SDK's included, in the message's order.
    properties: Vec<(String, String)>,
    partition_key: Option<String>,
    partition_key_b64_encoded: Option<bool>,
    ordering_key: Option<Vec<u8>>,
    event_time: Option<u64>,
}

impl Envelope {
    /// The envelope of a received message.
    pub(crate) fn of(metadata: &MessageMetadata) -> Self {
        Self {
            properties: metadata
                .properties
                .iter()
                .map(|kv| (kv.key.clone(), kv.value.clone()))
                .collect(),
            partition_key: metadata.partition_key.clone(),
            partition_key_b64_encoded: metadata.partition_key_b64_encoded,
            ordering_key: metadata.ordering_key.clone(),
            event_time: metadata.event_time,
        }
    }
}

impl Envelope {
    /// What the envelope holds beyond payload, key and properties: the event time, and an ordering key
    /// a message has beside its partition key.
    pub(crate) fn native(&self) -> Native {
        let mut native = Native::default();
        if let Some(t) = self.event_time.filter(|t| *t > 0) {
            native.property("pulsar.event-time", t.to_string());
        }
        if let (Some(ordering), Some(_)) = (&self.ordering_key, &self.partition_key) {
            native.property(
                "pulsar.ordering-key",
                String::from_utf8(ordering.clone()).unwrap_or_else(|_| STANDARD.encode(ordering)),
            );
        }
        native
    }
}

/// Properties the SDK writes anew on every message: its metadata, the layout, a dead letter's group.
/// (`x-retry-binary` stays: it describes the producer's properties, which a copy keeps.)
fn is_rewritten(name: &str) -> bool {
    metadata::is_sdk_field(name) || name == metadata::names::GROUP
}

/// A producer message for `event`: a copy of the message whose envelope is `native`, or a new message;
/// delivered at `deliver_at` (ms since the epoch) if given, with the adapter's `extra` properties.
pub(crate) fn encode(
    event: &Event,
    native: Option<&Envelope>,
    deliver_at: Option<i64>,
    extra: &[(&str, &str)],
) -> Result<producer::Message, Error> {
    let (sdk, unique) =
        metadata::encode_for_map(event.metadata(), &event.headers, Packing::Headers);
    let mut properties = HashMap::with_capacity(unique.len() + sdk.len() + extra.len() + 1);
    for (name, value) in sdk.iter() {
        // The SDK's values are UTF-8 text (metadata::encode_into writes text only).
        properties.insert(
            name.to_string(),
            String::from_utf8_lossy(value).into_owned(),
        );
    }
    // A producer's own `x-retry-*` header is written after the SDK's metadata and wins, as a later header
    // does on every broker (and a malformed one makes the event poison).
    let mut message = match native {
        Some(native) => {
            for (name, value) in &native.properties {
                if !is_rewritten(name) {
                    properties.insert(name.clone(), value.clone());
                }
            }
            producer::Message {
                partition_key: native.partition_key.clone(),
                partition_key_b64_encoded: native.partition_key_b64_encoded,
                ordering_key: native.ordering_key.clone(),
                event_time: native.event_time,
                ..producer::Message::default()
            }
        }
        None => {
            let mut binary = Vec::new();
            for (name, value) in unique {
                if name == metadata::names::BINARY || name.contains('\n') {
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
                properties.insert(name.to_string(), text);
            }
            if !binary.is_empty() {
                properties.insert(metadata::names::BINARY.to_string(), binary.join("\n"));
            }
            let (partition_key, b64) = match &event.key {
                None => (None, None),
                Some(key) => match std::str::from_utf8(key) {
                    Ok(text) => (Some(text.to_string()), None),
                    Err(_) => (Some(STANDARD.encode(key)), Some(true)),
                },
            };
            producer::Message {
                partition_key,
                partition_key_b64_encoded: b64,
                ..producer::Message::default()
            }
        }
    };
    for (name, value) in extra {
        properties.insert((*name).to_string(), (*value).to_string());
    }
    message.payload = event.payload.to_vec();
    message.properties = properties;
    message.deliver_at_time = deliver_at;
    Ok(message)
}

/// An unchanged copy of a received message (a release): payload and envelope as they were, the SDK's
/// properties too.
pub(crate) fn unchanged(
    payload: &Bytes,
    native: &Envelope,
    deliver_at: Option<i64>,
) -> producer::Message {
    producer::Message {
        payload: payload.to_vec(),
        properties: native.properties.iter().cloned().collect(),
        partition_key: native.partition_key.clone(),
        partition_key_b64_encoded: native.partition_key_b64_encoded,
        ordering_key: native.ordering_key.clone(),
        event_time: native.event_time,
        deliver_at_time: deliver_at,
        ..producer::Message::default()
    }
}

/// The message a consumer received, as the runtime decodes it.
pub(crate) fn decode(data: Bytes, metadata: &MessageMetadata) -> RawMessage {
    let binary: Vec<&str> = metadata
        .properties
        .iter()
        .find(|kv| kv.key == metadata::names::BINARY)
        .map(|kv| kv.value.split('\n').collect())
        .unwrap_or_default();
    let mut props: Vec<(&String, &String)> = metadata
        .properties
        .iter()
        .filter(|kv| kv.key != metadata::names::BINARY && kv.key != metadata::names::GROUP)
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
    let key = match (&metadata.partition_key, &metadata.ordering_key) {
        (Some(key), _) if metadata.partition_key_b64_encoded() => {
            STANDARD.decode(key).ok().map(Bytes::from)
        }
        (Some(key), _) => Some(Bytes::copy_from_slice(key.as_bytes())),
        (None, Some(bytes)) => Some(Bytes::copy_from_slice(bytes)),
        (None, None) => None,
    };
    RawMessage {
        payload: data,
        key,
        headers,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn native_names_the_event_time_and_an_ordering_key_beside_the_partition_key() {
        let metadata = MessageMetadata {
            event_time: Some(1_700_000_000_000),
            partition_key: Some("k".into()),
            ordering_key: Some(b"o".to_vec()),
            ..MessageMetadata::default()
        };
        let native = Envelope::of(&metadata).native();
        assert_eq!(
            native.properties,
            [
                ("pulsar.event-time".to_string(), "1700000000000".to_string()),
                ("pulsar.ordering-key".to_string(), "o".to_string()),
            ]
        );
        assert!(
            Envelope::of(&MessageMetadata::default())
                .native()
                .is_empty()
        );
    }
    use pulsar::proto::KeyValue;

    fn metadata_of(m: &producer::Message) -> MessageMetadata {
        let mut properties: Vec<KeyValue> = m
            .properties
            .iter()
            .map(|(key, value)| KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect();
        properties.sort_by(|a, b| a.key.cmp(&b.key));
        MessageMetadata {
            properties,
            partition_key: m.partition_key.clone(),
            partition_key_b64_encoded: m.partition_key_b64_encoded,
            ordering_key: m.ordering_key.clone(),
            event_time: m.event_time,
            ..MessageMetadata::default()
        }
    }

    fn received(m: &producer::Message) -> Event {
        Event::from_raw(decode(Bytes::from(m.payload.clone()), &metadata_of(m))).unwrap()
    }

    #[test]
    fn binary_headers_keys_order_and_repeats_round_trip() {
        let event = Event::new(Bytes::from_static(&[0, 255]))
            .with_key(Bytes::from_static(&[0x00, 0xff, b'k']))
            .with_header("b-text", "héllo")
            .with_header("a-bin", Bytes::from_static(&[0xff, 0x00]))
            .with_header("b-text", Bytes::from_static(&[0x80]));
        let m = encode(&event, None, Some(42), &[]).unwrap();
        assert_eq!(m.partition_key_b64_encoded, Some(true));
        assert_eq!(m.ordering_key, None, "no ordering key is added");
        let back = received(&m);
        assert_eq!(back.payload, event.payload);
        assert_eq!(back.key, event.key);
        assert_eq!(back.headers, event.headers);
    }

    #[test]
    fn a_copy_keeps_both_keys_and_the_event_time() {
        let original = producer::Message {
            payload: b"x".to_vec(),
            properties: [("p".to_string(), "1".to_string())].into_iter().collect(),
            partition_key: Some("pk".into()),
            ordering_key: Some(vec![1, 2, 3]),
            event_time: Some(1_700_000_000_000),
            ..producer::Message::default()
        };
        let native = Envelope::of(&metadata_of(&original));
        let event = received(&original);
        assert_eq!(event.key.as_deref(), Some(&b"pk"[..]));
        let copy = encode(
            &event,
            Some(&native),
            None,
            &[(metadata::names::GROUP, "g")],
        )
        .unwrap();
        assert_eq!(copy.partition_key.as_deref(), Some("pk"));
        assert_eq!(copy.ordering_key, Some(vec![1, 2, 3]));
        assert_eq!(copy.event_time, Some(1_700_000_000_000));
        assert_eq!(copy.properties.get("p").map(String::as_str), Some("1"));
        assert_eq!(
            copy.properties
                .get(metadata::names::GROUP)
                .map(String::as_str),
            Some("g")
        );
        let bare = producer::Message {
            payload: b"y".to_vec(),
            ..producer::Message::default()
        };
        let copy = encode(
            &received(&bare),
            Some(&Envelope::of(&metadata_of(&bare))),
            None,
            &[],
        )
        .unwrap();
        assert_eq!((copy.partition_key, copy.ordering_key), (None, None));
    }
}
