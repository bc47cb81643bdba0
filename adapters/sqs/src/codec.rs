//! Events as SQS messages, and copies that keep every attribute's data type.
//!
//! The SDK's metadata travels packed in one `x-retry` attribute (SQS allows 10 attributes per message);
//! the key in `x-retry-key`; each producer header in an attribute of its own name, as a String when it is
//! text SQS accepts and as Binary otherwise, so every value comes back byte for byte (a header whose name
//! SQS refuses as an attribute name travels inside `x-retry`, as below). The body is the
//! payload when it is text SQS accepts; otherwise it is base64 and `x-retry-body` says so. SQS returns
//! attributes as a map, so the first value of each name is an attribute and the
//! [layout](event_retry_core::layout) inside `x-retry` restores the producer's order and repeated names.
//!
//! A copy (a dead letter, a carried retry, a replay) writes the original's attributes again with their
//! own data types (`Number`, `Binary` holding text, custom labels such as `String.x`); a handler sees
//! each value's bytes. When the producer used all ten attributes, the ones that no longer fit beside the
//! SDK's travel inside `x-retry` with their data types, and every receive through the SDK restores them.

use std::collections::HashMap;

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use event_retry_core::adapter::Native;
use event_retry_core::error::{Error, Kind};
use event_retry_core::event::{Event, RawMessage};
use event_retry_core::headers::Headers;
use event_retry_core::metadata::{self, Packing};

/// SQS's limit on attributes per message.
pub(crate) const MAX_ATTRIBUTES: usize = 10;
/// The data type of an empty value (SQS refuses empty attribute values).
const EMPTY: &str = "String.empty";

/// A message ready to send.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) body: String,
    pub(crate) attributes: HashMap<String, MessageAttributeValue>,
}

/// Whether SQS accepts `text` as a body or String value (XML 1.0 characters).
fn sqs_text(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.chars()
        .all(|c| matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}'))
        .then_some(text)
}

/// Whether SQS accepts `name` as a message attribute name.
fn valid_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.is_empty()
        && name.len() <= 256
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
}

fn value(bytes: &[u8]) -> Result<MessageAttributeValue, Error> {
    let built = if bytes.is_empty() {
        MessageAttributeValue::builder()
            .data_type(EMPTY)
            .string_value("-")
            .build()
    } else if let Some(text) = sqs_text(bytes) {
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value(text)
            .build()
    } else {
        MessageAttributeValue::builder()
            .data_type("Binary")
            .binary_value(Blob::new(bytes.to_vec()))
            .build()
    };
    built
        .map_err(|e| Error::from_source(Kind::Other, e).with_operation("build a message attribute"))
}

fn bytes_of(value: &MessageAttributeValue) -> Bytes {
    if value.data_type() == EMPTY {
        return Bytes::new();
    }
    if let Some(b) = value.binary_value() {
        return Bytes::copy_from_slice(b.as_ref());
    }
    value
        .string_value()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .unwrap_or_default()
}

/// A received message's own attributes — the producer's, each with its SQS data type (`String`,
/// `Number`, `Binary`, or a custom label such as `Number.int`), those the SDK's metadata carried
/// restored — sorted by name: what a copy of the message writes again.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Attributes(Vec<(String, MessageAttributeValue)>);

impl Attributes {
    /// The data type of each attribute that is not one the SDK writes itself (`String`, `Binary`):
    /// `Number`, and custom labels such as `Number.int` or `String.x`.
    pub(crate) fn native(&self) -> Native {
        let mut native = Native::default();
        for (name, value) in &self.0 {
            let kind = value.data_type();
            if !matches!(kind, "String" | "Binary" | EMPTY) {
                native.header_type(name, kind);
            }
        }
        native
    }
}

/// A received message: what the runtime decodes, and what a copy of it keeps.
#[derive(Debug)]
pub(crate) struct Decoded {
    /// The event as it travelled (the SDK's metadata among its headers).
    pub(crate) raw: RawMessage,
    /// Its attributes, for copies.
    pub(crate) attributes: Attributes,
    /// Whether it is a copy the adapter sent to carry a retry.
    pub(crate) copy: bool,
}

/// Whether `name` is one of the adapter's own attributes, which no producer header may take.
fn is_adapter_attribute(name: &str) -> bool {
    name == metadata::PACKED
        || name == metadata::names::KEY
        || name == metadata::names::BODY
        || name == metadata::names::COPY
}

/// The packed field listing the producer's attributes that did not fit beside the SDK's own.
const OVERFLOW: &str = "attributes";

/// Encodes `event` for sending: a copy of a message whose attributes are `native`, or a new message
/// (each header a String, or Binary when it is not text SQS accepts). `copy` marks a copy that carries
/// a retry. The SDK's metadata goes packed in `x-retry`; when the producer's attributes and the SDK's
/// together exceed SQS's ten, the producer's last ones (by name) travel inside `x-retry` too, with their
/// data types, and come back as attributes on every receive through the SDK. On a FIFO queue (`fifo`) a
/// key that is its own message group travels as the group alone.
pub(crate) fn encode(
    event: &Event,
    native: Option<&Attributes>,
    copy: bool,
    fifo: bool,
) -> Result<Outgoing, Error> {
    let (sdk, unique) = metadata::encode_for_map(event.metadata(), &event.headers, Packing::Single);
    let own: Vec<(String, MessageAttributeValue)> = match native {
        Some(native) => native.0.clone(),
        None => {
            let mut own = Vec::with_capacity(unique.len());
            for (name, v) in unique {
                if is_adapter_attribute(name) {
                    return Err(Error::new(
                        Kind::InvalidInput,
                        format!(
                            "header {name:?} is one of the adapter's own SQS message attributes ({}, \
                             {}, {}, {})",
                            metadata::PACKED,
                            metadata::names::KEY,
                            metadata::names::BODY,
                            metadata::names::COPY
                        ),
                    ));
                }
                own.push((name.to_string(), value(v)?));
            }
            own.sort_by(|a, b| a.0.cmp(&b.0));
            own
        }
    };
    let mut attributes = HashMap::with_capacity(MAX_ATTRIBUTES);
    // A key that a receive would read back from the message group alone need not travel twice.
    let key_is_group = |key: &Bytes| {
        fifo && !key.starts_with(UNKEYED_GROUP.as_bytes())
            && group_of(Some(key)).is_some_and(|g| g.as_bytes() == key.as_ref())
    };
    if let Some(key) = &event.key
        && !key_is_group(key)
    {
        attributes.insert(metadata::names::KEY.to_string(), value(key)?);
    }
    let body = if event.payload.is_empty() {
        attributes.insert(metadata::names::BODY.to_string(), value(b"empty")?);
        "-".to_string()
    } else if let Some(text) = sqs_text(&event.payload) {
        text.to_string()
    } else {
        attributes.insert(metadata::names::BODY.to_string(), value(b"base64")?);
        STANDARD.encode(&event.payload)
    };
    if copy {
        attributes.insert(metadata::names::COPY.to_string(), value(b"1")?);
    }
    // A header whose name SQS refuses as an attribute name (a Kafka header `trace id`, say) travels
    // inside `x-retry` with the ones that do not fit.
    let (mut own, mut overflow): (Vec<_>, Vec<_>) =
        own.into_iter().partition(|(name, _)| valid_name(name));
    let room = MAX_ATTRIBUTES - attributes.len() - 1;
    if own.len() > room {
        overflow.extend(own.split_off(room));
    }
    let packed = sdk.get(metadata::PACKED).cloned().unwrap_or_default();
    let packed = if overflow.is_empty() {
        packed
    } else {
        with_overflow(&packed, &overflow)?
    };
    attributes.insert(metadata::PACKED.to_string(), value(&packed)?);
    attributes.extend(own);
    Ok(Outgoing { body, attributes })
}

/// The packed metadata `packed` with `overflow` (attributes that did not fit) added to it.
fn with_overflow(
    packed: &[u8],
    overflow: &[(String, MessageAttributeValue)],
) -> Result<Bytes, Error> {
    let mut object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(packed)
        .map_err(|e| Error::from_source(Kind::Other, e).with_operation("pack attributes"))?;
    let list: Vec<serde_json::Value> = overflow
        .iter()
        .map(|(name, v)| {
            serde_json::json!({
                "name": name,
                "type": v.data_type(),
                "string": v.string_value(),
                "binary": v.binary_value().map(|b| STANDARD.encode(b.as_ref())),
            })
        })
        .collect();
    object.insert(OVERFLOW.into(), list.into());
    Ok(Bytes::from(serde_json::Value::Object(object).to_string()))
}

/// `packed` without the attributes it carries.
fn without_overflow(packed: &[u8]) -> Option<Bytes> {
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(packed).ok()?;
    object.remove(OVERFLOW);
    Some(Bytes::from(serde_json::Value::Object(object).to_string()))
}

/// The attributes carried inside packed metadata, if any (a malformed list is left to the metadata
/// decoder, which names the problem).
fn overflow_of(packed: &[u8]) -> Vec<(String, MessageAttributeValue)> {
    #[derive(serde::Deserialize)]
    struct Carried {
        name: String,
        #[serde(rename = "type")]
        data_type: String,
        string: Option<String>,
        binary: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Packed {
        #[serde(default)]
        attributes: Vec<Carried>,
    }
    let Ok(packed) = serde_json::from_slice::<Packed>(packed) else {
        return Vec::new();
    };
    packed
        .attributes
        .into_iter()
        .filter_map(|c| {
            let mut b = MessageAttributeValue::builder().data_type(c.data_type);
            if let Some(s) = c.string {
                b = b.string_value(s);
            }
            if let Some(bin) = c.binary {
                b = b.binary_value(Blob::new(STANDARD.decode(bin).ok()?));
            }
            Some((c.name, b.build().ok()?))
        })
        .collect()
}

/// The message a receive returned, its attributes as headers (sorted by name).
pub(crate) fn decode(message: &Message) -> Decoded {
    let mut own: Vec<(String, MessageAttributeValue)> = Vec::new();
    let mut sdk: Vec<(String, Bytes)> = Vec::new();
    let mut key = None;
    let mut body_encoding = None;
    let mut copy = false;
    for (name, v) in message.message_attributes().into_iter().flatten() {
        match name.as_str() {
            metadata::names::KEY => key = Some(bytes_of(v)),
            metadata::names::BODY => body_encoding = Some(bytes_of(v)),
            metadata::names::COPY => copy = true,
            metadata::PACKED => {
                let packed = bytes_of(v);
                let overflow = overflow_of(&packed);
                // The carried attributes are restored here; the metadata decoder gets the rest, so
                // large attributes do not count against its limits.
                let packed = if overflow.is_empty() {
                    packed
                } else {
                    without_overflow(&packed).unwrap_or(packed)
                };
                own.extend(overflow);
                sdk.push((name.clone(), packed));
            }
            other if metadata::is_sdk_field(other) => sdk.push((name.clone(), bytes_of(v))),
            _ => own.push((name.clone(), v.clone())),
        }
    }
    own.sort_by(|a, b| a.0.cmp(&b.0));
    sdk.sort();
    let mut headers = Headers::with_capacity(sdk.len() + own.len());
    for (name, v) in sdk {
        headers.push(name, v);
    }
    for (name, v) in &own {
        headers.push(name.clone(), bytes_of(v));
    }
    // A FIFO message's group is its key (unless the adapter gave a keyless message a group of its own).
    if key.is_none() {
        key = message
            .attributes()
            .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
            .filter(|g| !g.starts_with(UNKEYED_GROUP))
            .map(|g| Bytes::copy_from_slice(g.as_bytes()));
    }
    let body = message.body().unwrap_or_default();
    let payload = match body_encoding.as_deref() {
        Some(b"empty") => Bytes::new(),
        Some(b"base64") => STANDARD
            .decode(body)
            .map(Bytes::from)
            .unwrap_or_else(|_| Bytes::copy_from_slice(body.as_bytes())),
        _ => Bytes::copy_from_slice(body.as_bytes()),
    };
    Decoded {
        raw: RawMessage {
            payload,
            key,
            headers,
        },
        attributes: Attributes(own),
        copy,
    }
}

/// The prefix of the message group the adapter gives a FIFO message without a key (a group of its own,
/// so it waits behind nothing), which a receive reads as "no key".
pub(crate) const UNKEYED_GROUP: &str = "x-retry-unkeyed-";

/// The FIFO message group for a key: the key itself when SQS accepts it, its hex digits otherwise.
pub(crate) fn group_of(key: Option<&[u8]>) -> Option<String> {
    let key = key?;
    let printable =
        !key.is_empty() && key.len() <= 128 && key.iter().all(|b| (0x21..=0x7e).contains(b));
    Some(if printable {
        String::from_utf8_lossy(key).into_owned()
    } else {
        key.iter().take(64).map(|b| format!("{b:02x}")).collect()
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_keys_sqs_accepts() {
        assert_eq!(
            group_of(Some(b"customer-7")),
            Some("customer-7".to_string())
        );
        assert_eq!(group_of(Some(&[0, 255])), Some("00ff".to_string()));
        assert_eq!(group_of(None), None);
    }

    fn received(out: Outgoing) -> Message {
        Message::builder()
            .body(out.body)
            .set_message_attributes(Some(out.attributes))
            .build()
    }

    fn typed(data_type: &str, text: Option<&str>, binary: Option<&[u8]>) -> MessageAttributeValue {
        let mut b = MessageAttributeValue::builder().data_type(data_type);
        if let Some(t) = text {
            b = b.string_value(t);
        }
        if let Some(bin) = binary {
            b = b.binary_value(Blob::new(bin.to_vec()));
        }
        b.build().unwrap()
    }

    #[test]
    fn binary_payload_key_and_headers_round_trip() {
        let mut event = Event::new(Bytes::from_static(&[0xff, 0x00, 0x80]))
            .with_key(Bytes::from_static(&[0x00, 0xff]))
            .with_header("b-text", "héllo")
            .with_header("a-bin", Bytes::from_static(&[0xfe, 0x00]))
            .with_header("c-empty", "")
            .with_header("b-text", "again")
            .with_id("e1");
        event_retry_core::adapter::metadata_mut(&mut event).attempts = 2;
        let out = encode(&event, None, false, false).unwrap();
        assert_ne!(
            out.body.as_bytes(),
            &[0xff, 0x00, 0x80],
            "binary body is encoded"
        );
        let decoded = decode(&received(out));
        assert!(!decoded.copy);
        assert_eq!(Event::from_raw(decoded.raw).unwrap(), event);
    }

    #[test]
    fn text_payload_is_the_body() {
        let out = encode(&Event::new("{\"a\":1}"), None, false, false).unwrap();
        assert_eq!(out.body, "{\"a\":1}");
        assert!(!out.attributes.contains_key(metadata::names::BODY));
        let empty = encode(&Event::new(""), None, false, false).unwrap();
        assert_eq!(decode(&received(empty)).raw.payload, Bytes::new());
    }

    #[test]
    fn a_copy_keeps_data_types_and_ten_attributes_fit() {
        // A producer that used all ten attributes, with SQS's data types and custom labels.
        let mut attributes: HashMap<String, MessageAttributeValue> = (0..7)
            .map(|i| (format!("s{i}"), typed("String", Some("v"), None)))
            .collect();
        attributes.insert("num".into(), typed("Number.int", Some("12.50"), None));
        attributes.insert("bin".into(), typed("Binary", None, Some(b"text in binary")));
        attributes.insert("custom".into(), typed("String.x", Some("y"), None));
        let original = Message::builder()
            .body("payload")
            .set_message_attributes(Some(attributes.clone()))
            .build();
        let decoded = decode(&original);
        let event = Event::from_raw(decoded.raw).unwrap();
        assert_eq!(event.headers.len(), 10);
        assert_eq!(event.headers.get("num").unwrap().as_ref(), b"12.50");
        let mut dead = event.clone();
        event_retry_core::adapter::metadata_mut(&mut dead).attempts = 1;
        let out = encode(&dead, Some(&decoded.attributes), true, false).unwrap();
        assert_eq!(out.attributes.len(), MAX_ATTRIBUTES);
        let back = decode(&received(out));
        assert!(back.copy);
        assert_eq!(
            back.attributes, decoded.attributes,
            "every type, the packed ones too"
        );
        let again = Event::from_raw(back.raw).unwrap();
        assert_eq!(again.headers, event.headers);
        assert_eq!(again.metadata().attempts, 1);
    }

    #[test]
    fn a_fifo_key_that_looks_unkeyed_and_large_carried_attributes_come_back() {
        let key = format!("{}x", UNKEYED_GROUP);
        let mut event = Event::new("p").with_key(key.clone());
        for i in 0..10 {
            event = event.with_header(format!("h{i}"), "v".repeat(20_000));
        }
        let out = encode(&event, None, false, true).unwrap();
        assert!(
            out.attributes.contains_key(metadata::names::KEY),
            "the key travels as itself"
        );
        let back = Event::from_raw(decode(&received(out)).raw).unwrap();
        assert_eq!(back.key.as_deref(), Some(key.as_bytes()));
        assert_eq!(
            back.headers, event.headers,
            "80 kB carried in x-retry is not poison"
        );
    }

    #[test]
    fn header_names_sqs_refuses_travel_inside_the_metadata() {
        let event = Event::new("x")
            .with_header("AWS.trace", "v")
            .with_header("trace id", Bytes::from_static(&[0xff]))
            .with_header("plain", "p");
        let out = encode(&event, None, false, false).unwrap();
        assert!(out.attributes.contains_key("plain"));
        assert!(
            !out.attributes.contains_key("AWS.trace") && !out.attributes.contains_key("trace id")
        );
        let decoded = decode(&received(out));
        assert_eq!(Event::from_raw(decoded.raw).unwrap().headers, event.headers);
        // A copy (a dead letter, a replay) keeps carrying them there.
        let copy = encode(&event, Some(&decoded.attributes), true, false).unwrap();
        assert!(!copy.attributes.contains_key("trace id"));
        assert_eq!(
            Event::from_raw(decode(&received(copy)).raw)
                .unwrap()
                .headers,
            event.headers
        );
    }

    #[test]
    fn native_names_the_data_types_the_sdk_does_not_write() {
        let mut attributes: HashMap<String, MessageAttributeValue> = HashMap::new();
        attributes.insert("n".into(), typed("Number.int", Some("12"), None));
        attributes.insert("s".into(), typed("String", Some("v"), None));
        attributes.insert("b".into(), typed("Binary", None, Some(b"x")));
        let message = Message::builder()
            .body("p")
            .set_message_attributes(Some(attributes))
            .build();
        let native = decode(&message).attributes.native();
        assert_eq!(
            native.header_types,
            [("n".to_string(), "Number.int".to_string())]
        );
    }

    #[test]
    fn the_adapters_own_attribute_names_are_refused_with_the_reason() {
        let sdk_name = Event::new("x").with_header(metadata::names::KEY, "v");
        let err = encode(&sdk_name, None, false, false).unwrap_err();
        assert!(err.to_string().contains("adapter's own"), "{err}");
    }
}
