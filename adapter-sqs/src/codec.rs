//! Events as SQS messages.
//!
//! The SDK's metadata travels packed in one `x-retry` attribute (SQS allows 10 attributes per message);
//! the key in `x-retry-key`; each producer header in an attribute of its own name, as a String when it is
//! text SQS accepts and as Binary otherwise, so every value comes back byte for byte. The body is the
//! payload when it is text SQS accepts; otherwise it is base64 and `x-retry-body` says so. Attribute names
//! come back sorted (SQS returns them as a map), and a name may appear once.

use std::collections::HashMap;

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{Message, MessageAttributeValue};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use retry_core::error::{Error, Kind};
use retry_core::event::{Event, RawMessage};
use retry_core::headers::Headers;
use retry_core::metadata::{self, Packing};

/// The attribute carrying the key.
pub(crate) const KEY: &str = "x-retry-key";
/// The attribute saying how the body encodes the payload (`base64` or `empty`).
pub(crate) const BODY: &str = "x-retry-body";
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

/// Encodes `event` (metadata packed) for sending.
pub(crate) fn encode(event: &Event) -> Result<Outgoing, Error> {
    let headers = metadata::encode_with(event.metadata(), &event.headers, Packing::Single);
    encode_raw(&RawMessage {
        payload: event.payload.clone(),
        key: event.key.clone(),
        headers,
    })
}

/// Encodes a message as it travelled (headers already encoded).
pub(crate) fn encode_raw(raw: &RawMessage) -> Result<Outgoing, Error> {
    let mut attributes = HashMap::new();
    for (name, v) in raw.headers.iter() {
        if !valid_name(name) || name == KEY || name == BODY {
            return Err(Error::new(
                Kind::InvalidInput,
                format!(
                    "header {name:?} cannot be an SQS message attribute name (letters, digits, '_', '-', '.'; \
                 not AWS./Amazon.; not {KEY} or {BODY})"
                ),
            ));
        }
        if attributes.insert(name.to_string(), value(v)?).is_some() {
            return Err(Error::new(
                Kind::InvalidInput,
                format!("header {name:?} appears twice; SQS message attributes are unique by name"),
            ));
        }
    }
    if let Some(key) = &raw.key {
        attributes.insert(KEY.to_string(), value(key)?);
    }
    let body = if raw.payload.is_empty() {
        attributes.insert(BODY.to_string(), value(b"empty")?);
        "-".to_string()
    } else if let Some(text) = sqs_text(&raw.payload) {
        text.to_string()
    } else {
        attributes.insert(BODY.to_string(), value(b"base64")?);
        STANDARD.encode(&raw.payload)
    };
    if attributes.len() > MAX_ATTRIBUTES {
        let mut names: Vec<&String> = attributes.keys().collect();
        names.sort();
        return Err(Error::new(
            Kind::InvalidInput,
            format!(
                "SQS carries at most {MAX_ATTRIBUTES} message attributes; this message needs {}: {names:?}",
                attributes.len()
            ),
        ));
    }
    Ok(Outgoing { body, attributes })
}

/// The message a receive returned, with its attributes as headers (sorted by name).
pub(crate) fn decode(message: &Message) -> RawMessage {
    let attributes = message.message_attributes();
    let mut names: Vec<&String> = attributes.map(|a| a.keys().collect()).unwrap_or_default();
    names.sort();
    let mut headers = Headers::with_capacity(names.len());
    let mut key = None;
    let mut body_encoding = None;
    for name in names {
        let Some(v) = attributes.and_then(|a| a.get(name)) else {
            continue;
        };
        match name.as_str() {
            KEY => key = Some(bytes_of(v)),
            BODY => body_encoding = Some(bytes_of(v)),
            _ => headers.push(name.clone(), bytes_of(v)),
        }
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
    RawMessage {
        payload,
        key,
        headers,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn received(out: Outgoing) -> Message {
        Message::builder()
            .body(out.body)
            .set_message_attributes(Some(out.attributes))
            .build()
    }

    #[test]
    fn binary_payload_key_and_headers_round_trip() {
        let mut event = Event::new(Bytes::from_static(&[0xff, 0x00, 0x80]))
            .with_key(Bytes::from_static(&[0x00, 0xff]))
            .with_header("a-bin", Bytes::from_static(&[0xfe, 0x00]))
            .with_header("b-text", "héllo")
            .with_header("c-empty", "")
            .with_id("e1");
        retry_core::adapter::metadata_mut(&mut event).attempts = 2;
        let out = encode(&event).unwrap();
        assert_ne!(
            out.body.as_bytes(),
            &[0xff, 0x00, 0x80],
            "binary body is encoded"
        );
        let raw = decode(&received(out));
        let back = Event::from_raw(raw).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn text_payload_is_the_body() {
        let out = encode(&Event::new("{\"a\":1}")).unwrap();
        assert_eq!(out.body, "{\"a\":1}");
        assert!(!out.attributes.contains_key(BODY));
        let empty = encode(&Event::new("")).unwrap();
        assert_eq!(decode(&received(empty)).payload, Bytes::new());
    }

    #[test]
    fn what_sqs_cannot_carry_is_refused_with_the_reason() {
        let mut many = Event::new("x");
        for i in 0..10 {
            many = many.with_header(format!("h{i}"), "v");
        }
        assert!(
            encode(&many)
                .unwrap_err()
                .to_string()
                .contains("at most 10")
        );
        let bad_name = Event::new("x").with_header("AWS.trace", "v");
        assert!(encode(&bad_name).is_err());
        let twice = Event::new("x").with_header("h", "1").with_header("h", "2");
        assert!(encode(&twice).unwrap_err().to_string().contains("twice"));
    }
}
