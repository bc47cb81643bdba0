//! Events as AMQP messages, and copies that keep everything the producer set.
//!
//! A new message (the SDK's producer): the payload is the body, the event's headers are long strings in
//! the header table — the first value of each name, with the [layout](event_retry_core::layout) of names out
//! of order or repeated in `x-retry-layout` — the key travels in `x-retry-key`, and the SDK's metadata
//! in `x-retry-*` headers.
//!
//! A copy (a retry through the delay ladder, a dead letter, a replay) starts from the original
//! message's own properties: every header keeps its AMQP type and value (booleans, integers of every
//! width, floats, decimals, timestamps, void, nested tables and arrays, byte arrays), and so do content
//! type and encoding, correlation id, reply-to, type, app id, timestamp, priority, message id and user id.
//! Only the SDK's own headers are written anew. Three things a copy cannot carry as they are: a copy is
//! always persistent (it must survive a broker restart); an `expiration` would let the broker drop the
//! copy from the delay ladder or the DLQ, so it travels as the `x-retry-amqp-expiration` header; and a
//! `user-id` RabbitMQ checks against the publishing connection's user, so when it names another user it
//! travels as `x-retry-amqp-user-id`. The broker's own dead-letter headers (`x-death`, …) never enter an
//! event or a copy.
//!
//! A handler sees header values as bytes: strings as they are, other types in their text form (`42`,
//! `true`, `12.34`, nested tables and arrays as JSON).

use bytes::Bytes;
use event_retry_core::adapter::Native;
use event_retry_core::event::{Event, RawMessage};
use event_retry_core::headers::Headers;
use event_retry_core::metadata::{self, Packing};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

/// Headers RabbitMQ adds when it dead-letters, and the delay ladder's time of the next hop; a copy must
/// not carry them on (attempts are ours), and no handler sees them.
fn is_broker_header(name: &str) -> bool {
    name == metadata::names::HOP_DUE
        || matches!(
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

/// Headers the SDK writes anew on every message: its metadata, the layout, the key, a DLQ entry's id.
fn is_sdk_header(name: &str) -> bool {
    metadata::is_sdk_field(name)
        || name == metadata::names::KEY
        || name == metadata::names::DLQ_ENTRY
        || name == metadata::names::GROUP
}

/// The adapter's headers that keep what a copy cannot carry in its envelope; they stay on every copy.
fn is_carried(name: &str) -> bool {
    name == metadata::names::AMQP_EXPIRATION || name == metadata::names::AMQP_USER_ID
}

/// Headers no handler sees: the key (the event's key), a DLQ entry's id and group, and what a copy
/// carries for its envelope.
fn is_adapter_header(name: &str) -> bool {
    name == metadata::names::KEY
        || name == metadata::names::DLQ_ENTRY
        || name == metadata::names::GROUP
        || is_carried(name)
}

/// The properties of an unchanged copy of a message whose properties are `native` (a release through the
/// delay ladder): everything kept, the SDK's headers too, except what [`properties`] never carries.
pub(crate) fn unchanged(native: &BasicProperties, user: &str) -> BasicProperties {
    let mut table = FieldTable::default();
    if let Some(original) = native.headers() {
        for (name, value) in original.inner() {
            if !is_broker_header(name.as_str()) {
                table.insert(name.clone(), value.clone());
            }
        }
    }
    envelope(native.clone(), &mut table, user)
        .with_delivery_mode(2)
        .with_headers(table)
}

/// A copy's envelope: `props` without the expiration (kept in a header) and without a user id RabbitMQ
/// would refuse from this connection (kept in a header too).
fn envelope(mut props: BasicProperties, table: &mut FieldTable, user: &str) -> BasicProperties {
    if let Some(expiration) = props.expiration().clone() {
        table.insert(
            metadata::names::AMQP_EXPIRATION.into(),
            text(expiration.as_str()),
        );
        props = clear_expiration(props);
    }
    if let Some(user_id) = props.user_id().clone()
        && user_id.as_str() != user
    {
        table.insert(metadata::names::AMQP_USER_ID.into(), text(user_id.as_str()));
        props = clear_user_id(props);
    }
    props
}

/// The properties of `event` as a message: a copy of `native` (the original's properties) when there is
/// one, a new message with id `message_id` otherwise. `user` is the connection's user (RabbitMQ refuses
/// a `user-id` naming another); `extra` are adapter headers (a DLQ entry's id).
pub(crate) fn properties(
    event: &Event,
    native: Option<&BasicProperties>,
    message_id: &str,
    user: &str,
    extra: &[(&str, &str)],
) -> BasicProperties {
    let (sdk, unique) =
        metadata::encode_for_map(event.metadata(), &event.headers, Packing::Headers);
    let mut table = FieldTable::default();
    for (name, value) in sdk.iter() {
        table.insert(ShortString::from(name), long_string(value));
    }
    // A producer's own `x-retry-*` header is written after the SDK's metadata and wins, as a later header
    // does on every broker (and a malformed one makes the event poison).
    let mut props = match native {
        Some(native) => {
            // The original's headers, typed, without the SDK's (written anew below) or the broker's.
            if let Some(original) = native.headers() {
                for (name, value) in original.inner() {
                    if !is_sdk_header(name.as_str()) && !is_broker_header(name.as_str()) {
                        table.insert(name.clone(), value.clone());
                    }
                }
            }
            envelope(native.clone(), &mut table, user)
        }
        None => {
            for (name, value) in &unique {
                table.insert(ShortString::from(*name), long_string(value));
            }
            BasicProperties::default().with_message_id(ShortString::from(message_id))
        }
    };
    if let Some(key) = &event.key {
        table.insert(ShortString::from(metadata::names::KEY), long_string(key));
    }
    for (name, value) in extra {
        table.insert(ShortString::from(*name), text(value));
    }
    props = props.with_delivery_mode(2).with_headers(table);
    props
}

/// `props` without an expiration (lapin's builder can set a field but not clear it).
fn clear_expiration(props: BasicProperties) -> BasicProperties {
    rebuild(props, |p| p.expiration = None)
}

/// `props` without a user id.
fn clear_user_id(props: BasicProperties) -> BasicProperties {
    rebuild(props, |p| p.user_id = None)
}

/// The plain fields of a message's properties, to change one that lapin's builder cannot clear.
#[derive(Default)]
struct Fields {
    content_type: Option<ShortString>,
    content_encoding: Option<ShortString>,
    headers: Option<FieldTable>,
    delivery_mode: Option<u8>,
    priority: Option<u8>,
    correlation_id: Option<ShortString>,
    reply_to: Option<ShortString>,
    expiration: Option<ShortString>,
    message_id: Option<ShortString>,
    timestamp: Option<u64>,
    kind: Option<ShortString>,
    user_id: Option<ShortString>,
    app_id: Option<ShortString>,
    cluster_id: Option<ShortString>,
}

fn rebuild(props: BasicProperties, change: impl FnOnce(&mut Fields)) -> BasicProperties {
    let mut f = Fields {
        content_type: props.content_type().clone(),
        content_encoding: props.content_encoding().clone(),
        headers: props.headers().clone(),
        delivery_mode: *props.delivery_mode(),
        priority: *props.priority(),
        correlation_id: props.correlation_id().clone(),
        reply_to: props.reply_to().clone(),
        expiration: props.expiration().clone(),
        message_id: props.message_id().clone(),
        timestamp: *props.timestamp(),
        kind: props.kind().clone(),
        user_id: props.user_id().clone(),
        app_id: props.app_id().clone(),
        cluster_id: props.cluster_id().clone(),
    };
    change(&mut f);
    let mut out = BasicProperties::default();
    macro_rules! set {
        ($field:ident, $with:ident) => {
            if let Some(v) = f.$field {
                out = out.$with(v);
            }
        };
    }
    set!(content_type, with_content_type);
    set!(content_encoding, with_content_encoding);
    set!(headers, with_headers);
    set!(delivery_mode, with_delivery_mode);
    set!(priority, with_priority);
    set!(correlation_id, with_correlation_id);
    set!(reply_to, with_reply_to);
    set!(expiration, with_expiration);
    set!(message_id, with_message_id);
    set!(timestamp, with_timestamp);
    set!(kind, with_type);
    set!(user_id, with_user_id);
    set!(app_id, with_app_id);
    set!(cluster_id, with_cluster_id);
    out
}

fn long_string(bytes: &[u8]) -> AMQPValue {
    AMQPValue::LongString(LongString::from(bytes.to_vec()))
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// The message a delivery carries, as the runtime decodes it: the body, the key, and the header table
/// (without the broker's dead-letter headers) as byte values.
pub(crate) fn raw_message(body: Bytes, properties: &BasicProperties) -> RawMessage {
    let mut headers = Headers::new();
    let mut key = None;
    if let Some(table) = properties.headers() {
        for (name, value) in table.inner() {
            let name = name.as_str();
            if is_broker_header(name) {
                continue;
            }
            if name == metadata::names::KEY {
                key = Some(bytes_of(value));
                continue;
            }
            if is_adapter_header(name) {
                continue;
            }
            headers.push(name.to_string(), bytes_of(value));
        }
    }
    RawMessage {
        payload: body,
        key,
        headers,
    }
}

/// What a DLQ entry's message holds beyond body, key and header bytes, for people: its properties (as
/// the original's, where a copy keeps one in a header) and the AMQP type of each producer header that
/// is not a long string.
pub(crate) fn native(properties: &BasicProperties) -> Native {
    let mut native = Native::default();
    let header = |name: &str| {
        properties
            .headers()
            .as_ref()
            .and_then(|t| t.inner().get(name))
            .map(|v| String::from_utf8_lossy(&bytes_of(v)).into_owned())
    };
    let short = |v: &Option<ShortString>| v.as_ref().map(|s| s.as_str().to_string());
    // The SDK's producer writes the event id as the message id: not worth a word where it is just that.
    let message_id = short(properties.message_id())
        .filter(|id| Some(id.as_str()) != header(metadata::names::EVENT_ID).as_deref());
    let fields = [
        ("amqp.content-type", short(properties.content_type())),
        (
            "amqp.content-encoding",
            short(properties.content_encoding()),
        ),
        ("amqp.message-id", message_id),
        ("amqp.correlation-id", short(properties.correlation_id())),
        ("amqp.reply-to", short(properties.reply_to())),
        ("amqp.type", short(properties.kind())),
        ("amqp.app-id", short(properties.app_id())),
        ("amqp.cluster-id", short(properties.cluster_id())),
        (
            "amqp.user-id",
            header(metadata::names::AMQP_USER_ID).or_else(|| short(properties.user_id())),
        ),
        (
            "amqp.expiration",
            header(metadata::names::AMQP_EXPIRATION).or_else(|| short(properties.expiration())),
        ),
        (
            "amqp.priority",
            properties.priority().map(|p| p.to_string()),
        ),
        (
            "amqp.timestamp",
            properties.timestamp().map(|t| t.to_string()),
        ),
    ];
    for (name, value) in fields {
        if let Some(value) = value {
            native.property(name, value);
        }
    }
    if let Some(table) = properties.headers() {
        for (name, value) in table.inner() {
            let name = name.as_str();
            if is_broker_header(name) || is_sdk_header(name) || is_adapter_header(name) {
                continue;
            }
            if let Some(kind) = type_name(value) {
                native.header_type(name, kind);
            }
        }
    }
    native
}

/// The AMQP type of a header value, or `None` for a long string (the plain form).
fn type_name(value: &AMQPValue) -> Option<&'static str> {
    Some(match value {
        AMQPValue::LongString(_) => return None,
        AMQPValue::Boolean(_) => "boolean",
        AMQPValue::ShortShortInt(_) => "short-short-int",
        AMQPValue::ShortShortUInt(_) => "short-short-uint",
        AMQPValue::ShortInt(_) => "short-int",
        AMQPValue::ShortUInt(_) => "short-uint",
        AMQPValue::LongInt(_) => "long-int",
        AMQPValue::LongUInt(_) => "long-uint",
        AMQPValue::LongLongInt(_) => "long-long-int",
        AMQPValue::Float(_) => "float",
        AMQPValue::Double(_) => "double",
        AMQPValue::DecimalValue(_) => "decimal",
        AMQPValue::ShortString(_) => "short-string",
        AMQPValue::FieldArray(_) => "array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "table",
        AMQPValue::ByteArray(_) => "byte-array",
        AMQPValue::Void => "void",
    })
}

/// A header value as a handler sees it: bytes as they are, other types in their text form.
fn bytes_of(value: &AMQPValue) -> Bytes {
    match value {
        AMQPValue::LongString(s) => Bytes::copy_from_slice(s.as_bytes()),
        AMQPValue::ShortString(s) => Bytes::copy_from_slice(s.as_str().as_bytes()),
        AMQPValue::ByteArray(b) => Bytes::copy_from_slice(b.as_slice()),
        AMQPValue::DecimalValue(d) => Bytes::from(decimal(d.scale, d.value)),
        AMQPValue::Void => Bytes::new(),
        other => Bytes::from(json_of(other).to_string()),
    }
}

/// A value in JSON: numbers and booleans as themselves, decimals as their digits with the point in
/// place, text as strings, void as null, tables and arrays nested.
fn json_of(value: &AMQPValue) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        AMQPValue::Boolean(b) => J::from(*b),
        AMQPValue::ShortShortInt(n) => J::from(*n),
        AMQPValue::ShortShortUInt(n) => J::from(*n),
        AMQPValue::ShortInt(n) => J::from(*n),
        AMQPValue::ShortUInt(n) => J::from(*n),
        AMQPValue::LongInt(n) => J::from(*n),
        AMQPValue::LongUInt(n) => J::from(*n),
        AMQPValue::LongLongInt(n) => J::from(*n),
        AMQPValue::Timestamp(n) => J::from(*n),
        AMQPValue::Float(n) => J::from(*n),
        AMQPValue::Double(n) => J::from(*n),
        AMQPValue::DecimalValue(d) => J::String(decimal(d.scale, d.value)),
        AMQPValue::ShortString(s) => J::from(s.as_str()),
        AMQPValue::LongString(s) => J::from(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ByteArray(b) => J::from(String::from_utf8_lossy(b.as_slice()).into_owned()),
        AMQPValue::Void => J::Null,
        AMQPValue::FieldArray(items) => J::Array(items.as_slice().iter().map(json_of).collect()),
        AMQPValue::FieldTable(table) => J::Object(
            table
                .inner()
                .iter()
                .map(|(k, v)| (k.to_string(), json_of(v)))
                .collect(),
        ),
    }
}

/// `value` × 10^-`scale` in decimal digits: scale 2 of 1234 is `12.34`.
fn decimal(scale: u8, value: u32) -> String {
    let digits = value.to_string();
    let scale = usize::from(scale);
    if scale == 0 {
        return digits;
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    format!("{whole}.{fraction}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use lapin::types::{DecimalValue, FieldArray};

    fn round_trip(event: &Event, native: Option<&BasicProperties>) -> (BasicProperties, Event) {
        let props = properties(event, native, "id-1", "guest", &[]);
        let raw = raw_message(event.payload.clone(), &props);
        (props, Event::from_raw(raw).unwrap())
    }

    #[test]
    fn a_new_message_keeps_bytes_key_order_and_repeats() {
        let event = Event::new(Bytes::from_static(&[0, 255, 128]))
            .with_key(Bytes::from_static(&[0x00, 0xff, b'k']))
            .with_header("b-bin", Bytes::from_static(&[0xff, 0x00]))
            .with_header("a-rep", "one")
            .with_header("b-bin", "two")
            .with_header("empty", "");
        let (props, back) = round_trip(&event, None);
        assert_eq!(props.delivery_mode(), &Some(2));
        assert_eq!(
            props.message_id().as_ref().map(|s| s.as_str()),
            Some("id-1")
        );
        assert_eq!(back.payload, event.payload);
        assert_eq!(back.key, event.key);
        assert_eq!(back.headers, event.headers);
    }

    #[test]
    fn native_names_the_properties_and_the_typed_headers() {
        let mut table = FieldTable::default();
        table.insert("count".into(), AMQPValue::LongInt(7));
        table.insert("plain".into(), text("v"));
        table.insert("x-retry-event-id".into(), text("e1"));
        table.insert(metadata::names::AMQP_EXPIRATION.into(), text("60000"));
        table.insert("x-death".into(), AMQPValue::Void);
        let props = BasicProperties::default()
            .with_headers(table.clone())
            .with_priority(5)
            .with_content_type("application/json".into())
            .with_message_id("e1".into());
        let found = native(&props);
        assert_eq!(
            found.properties,
            [
                (
                    "amqp.content-type".to_string(),
                    "application/json".to_string()
                ),
                ("amqp.expiration".to_string(), "60000".to_string()),
                ("amqp.priority".to_string(), "5".to_string()),
            ],
            "the message id that is the event id is not listed"
        );
        assert_eq!(
            found.header_types,
            [("count".to_string(), "long-int".to_string())],
            "plain, SDK, adapter and broker headers are not listed"
        );
        let other_id = native(
            &BasicProperties::default()
                .with_headers(table)
                .with_message_id("m-9".into()),
        );
        assert_eq!(
            other_id.properties[0],
            ("amqp.message-id".to_string(), "m-9".to_string())
        );
    }

    #[test]
    fn a_copy_keeps_every_typed_header_and_property() {
        let mut table = FieldTable::default();
        table.insert("int".into(), AMQPValue::LongInt(-7));
        table.insert(
            "dec".into(),
            AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 1234,
            }),
        );
        table.insert("void".into(), AMQPValue::Void);
        table.insert(
            "empty-array".into(),
            AMQPValue::FieldArray(FieldArray::default()),
        );
        table.insert(
            "one".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::Boolean(true)])),
        );
        table.insert("x-death".into(), AMQPValue::Void);
        table.insert("x-retry-attempts".into(), text("3"));
        let native = BasicProperties::default()
            .with_headers(table)
            .with_content_type("application/json".into())
            .with_correlation_id("corr".into())
            .with_priority(7)
            .with_timestamp(1_700_000_000)
            .with_expiration("60000".into())
            .with_user_id("someone-else".into())
            .with_delivery_mode(1);
        let (event, _) = {
            let raw = raw_message(Bytes::from_static(b"p"), &native);
            (Event::from_raw(raw).unwrap(), ())
        };
        assert_eq!(event.headers.get("dec").unwrap().as_ref(), b"12.34");
        assert_eq!(event.headers.get("one").unwrap().as_ref(), b"[true]");
        assert_eq!(event.metadata().attempts, 3);
        let copy = properties(
            &event,
            Some(&native),
            "ignored",
            "guest",
            &[("x-retry-dlq-entry", "e1")],
        );
        let headers = copy.headers().as_ref().unwrap().inner();
        assert_eq!(headers.get("int"), Some(&AMQPValue::LongInt(-7)));
        assert_eq!(headers.get("void"), Some(&AMQPValue::Void));
        assert_eq!(
            headers.get("empty-array"),
            Some(&AMQPValue::FieldArray(FieldArray::default()))
        );
        assert!(
            headers.get("x-death").is_none(),
            "broker headers are dropped"
        );
        assert_eq!(headers.get("x-retry-attempts"), Some(&text("3")));
        assert_eq!(
            headers.get(metadata::names::AMQP_EXPIRATION),
            Some(&text("60000"))
        );
        assert_eq!(
            headers.get(metadata::names::AMQP_USER_ID),
            Some(&text("someone-else"))
        );
        assert_eq!(copy.expiration(), &None);
        assert_eq!(copy.user_id(), &None);
        assert_eq!(copy.delivery_mode(), &Some(2), "a copy is persistent");
        assert_eq!(copy.priority(), &Some(7));
        assert_eq!(copy.timestamp(), &Some(1_700_000_000));
        assert_eq!(
            copy.content_type().as_ref().map(|s| s.as_str()),
            Some("application/json")
        );
        assert_eq!(
            copy.correlation_id().as_ref().map(|s| s.as_str()),
            Some("corr")
        );
        assert!(copy.message_id().is_none(), "no id is added to a copy");
    }

    #[test]
    fn decimals_put_the_point_in_place() {
        assert_eq!(decimal(2, 1234), "12.34");
        assert_eq!(decimal(3, 5), "0.005");
        assert_eq!(decimal(0, 42), "42");
    }
}
