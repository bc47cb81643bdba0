//! Events as AMQP messages: the payload is the body, headers are the header table, the key travels in
//! `x-retry-key`, and the broker's own dead-letter headers (`x-death`, ...) never enter an event.
//!
//! Header values are written as long strings, which carry any bytes. An AMQP header table is a map, so a
//! name that repeats is written once as an array of its values (in order) and read back as repeated
//! headers; names come back in the table's order (sorted), not the producer's. A header another producer
//! wrote with a non-string type is handed over as its text form.

use bytes::Bytes;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use retry_core::event::RawMessage;
use retry_core::headers::Headers;

/// The header carrying the event's key (AMQP has no key).
pub(crate) const KEY_HEADER: &str = "x-retry-key";

/// Headers RabbitMQ adds when it dead-letters; a copy must not carry them on (attempts are ours).
fn is_broker_header(name: &str) -> bool {
    matches!(
        name,
        "x-death"
            | "x-first-death-exchange"
            | "x-first-death-queue"
            | "x-first-death-reason"
            | "x-last-death-exchange"
            | "x-last-death-queue"
            | "x-last-death-reason"
            | "x-delivery-count"
    )
}

/// The AMQP properties of `raw`: persistent, its headers and key, and `message_id`.
pub(crate) fn properties(raw: &RawMessage, message_id: &str) -> BasicProperties {
    let mut table = FieldTable::default();
    let mut names: Vec<&str> = Vec::with_capacity(raw.headers.len());
    for (name, _) in raw.headers.iter() {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    for name in names {
        let values: Vec<&Bytes> = raw
            .headers
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .collect();
        let value = match values.as_slice() {
            [one] => long_string(one),
            many => AMQPValue::FieldArray(FieldArray::from(
                many.iter().map(|v| long_string(v)).collect::<Vec<_>>(),
            )),
        };
        table.insert(ShortString::from(name), value);
    }
    if let Some(key) = &raw.key {
        table.insert(ShortString::from(KEY_HEADER), long_string(key));
    }
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(message_id))
        .with_headers(table)
}

fn long_string(bytes: &Bytes) -> AMQPValue {
    AMQPValue::LongString(LongString::from(bytes.to_vec()))
}

/// The message a delivery carries, without the broker's dead-letter headers.
pub(crate) fn raw_message(body: Vec<u8>, properties: &BasicProperties) -> RawMessage {
    let mut headers = Headers::new();
    let mut key = None;
    if let Some(table) = properties.headers() {
        for (name, value) in table.inner() {
            let name = name.as_str();
            if is_broker_header(name) {
                continue;
            }
            if name == KEY_HEADER {
                key = Some(bytes_of(value));
                continue;
            }
            match value {
                AMQPValue::FieldArray(items) => {
                    for item in items.as_slice() {
                        headers.push(name.to_string(), bytes_of(item));
                    }
                }
                other => headers.push(name.to_string(), bytes_of(other)),
            }
        }
    }
    RawMessage {
        payload: Bytes::from(body),
        key,
        headers,
    }
}

fn bytes_of(value: &AMQPValue) -> Bytes {
    match value {
        AMQPValue::LongString(s) => Bytes::copy_from_slice(s.as_bytes()),
        AMQPValue::ShortString(s) => Bytes::copy_from_slice(s.as_str().as_bytes()),
        AMQPValue::ByteArray(b) => Bytes::copy_from_slice(b.as_slice()),
        AMQPValue::Boolean(b) => Bytes::from(b.to_string()),
        AMQPValue::ShortShortInt(n) => Bytes::from(n.to_string()),
        AMQPValue::ShortShortUInt(n) => Bytes::from(n.to_string()),
        AMQPValue::ShortInt(n) => Bytes::from(n.to_string()),
        AMQPValue::ShortUInt(n) => Bytes::from(n.to_string()),
        AMQPValue::LongInt(n) => Bytes::from(n.to_string()),
        AMQPValue::LongUInt(n) => Bytes::from(n.to_string()),
        AMQPValue::LongLongInt(n) => Bytes::from(n.to_string()),
        AMQPValue::Timestamp(n) => Bytes::from(n.to_string()),
        AMQPValue::Float(n) => Bytes::from(n.to_string()),
        AMQPValue::Double(n) => Bytes::from(n.to_string()),
        other => Bytes::from(format!("{other:?}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_bytes_key_and_repeats() {
        let raw = RawMessage {
            payload: Bytes::from_static(&[0, 255, 128]),
            key: Some(Bytes::from_static(&[0x00, 0xff, b'k'])),
            headers: Headers::new()
                .with("b-bin", Bytes::from_static(&[0xff, 0x00]))
                .with("a-rep", "one")
                .with("a-rep", "two"),
        };
        let props = properties(&raw, "id-1");
        assert_eq!(props.delivery_mode(), &Some(2));
        let back = raw_message(raw.payload.to_vec(), &props);
        assert_eq!(back.payload, raw.payload);
        assert_eq!(back.key, raw.key);
        let got: Vec<(&str, &[u8])> = back.headers.iter().map(|(n, v)| (n, v.as_ref())).collect();
        assert_eq!(
            got,
            [
                ("a-rep", &b"one"[..]),
                ("a-rep", b"two"),
                ("b-bin", &[0xff, 0x00])
            ]
        );
    }

    #[test]
    fn broker_dead_letter_headers_are_dropped() {
        let mut table = FieldTable::default();
        table.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::default()),
        );
        table.insert(
            "x-first-death-queue".into(),
            AMQPValue::LongString("q".into()),
        );
        table.insert("n".into(), AMQPValue::LongInt(7));
        let back = raw_message(Vec::new(), &BasicProperties::default().with_headers(table));
        let got: Vec<(&str, &[u8])> = back.headers.iter().map(|(n, v)| (n, v.as_ref())).collect();
        assert_eq!(got, [("n", &b"7"[..])]);
    }
}
