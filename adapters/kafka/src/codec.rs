//! Events as Kafka records, and the adapter's routing headers.
//!
//! Kafka headers are ordered, may repeat and carry any bytes, so an event's headers (the SDK's metadata
//! included) travel exactly as they are. A header with a null value reaches the handler empty, and every
//! copy the adapter makes of the record writes it null again ([`Nulls`]). A copy is stamped anew (the
//! broker's retention counts from a record's timestamp); the original's timestamp and its type travel in
//! the SDK's metadata (`x-retry-origin-timestamp`, `x-retry-origin-timestamp-type`). A record on its
//! way through the delay ladder carries three more headers, which the adapter reads and strips before
//! the runtime sees the record: where it goes when due, when it is due, and when it may leave the level
//! it sits in. A dead letter carries the consumer group that dead-lettered it.

use std::borrow::Cow;

use bytes::BytesMut;
use event_retry_core::event::RawMessage;
use event_retry_core::headers::Headers as EventHeaders;
use event_retry_core::metadata::{OriginTimestamp, TimestampKind, names};
use event_retry_core::time::Timestamp;
use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};

/// Where a delayed record is going, read from its routing headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    /// The topic it goes to once due.
    pub(crate) to: String,
    /// When it is due.
    pub(crate) due: Timestamp,
    /// When it may leave its current level.
    pub(crate) hop_due: Timestamp,
}

/// A record read from Kafka: the event as it travelled, and its routing headers if it had them.
#[derive(Clone, Debug)]
pub(crate) struct Decoded {
    pub(crate) raw: RawMessage,
    pub(crate) nulls: Nulls,
    pub(crate) route: Option<Route>,
    pub(crate) group: Option<String>,
    pub(crate) timestamp: Option<OriginTimestamp>,
}

/// A record to produce: the event as it travels, and which of its headers are null.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Outbound<'a> {
    pub(crate) raw: &'a RawMessage,
    pub(crate) nulls: &'a Nulls,
}

/// The headers of a record whose value was null (Kafka tells a null value from an empty one; an event's
/// headers hold bytes), by name and occurrence of the name, so a copy writes them null again. Empty for
/// almost every record, and then free.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Nulls(Vec<(String, usize)>);

impl Nulls {
    /// The names of the null headers, once each, in the order they came.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        let mut seen = std::collections::HashSet::new();
        self.0
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(move |n| seen.insert(*n))
    }

    /// Whether the `nth` header named `name` (counting from 0) was null.
    fn contains(&self, name: &str, nth: usize) -> bool {
        self.0.iter().any(|(n, i)| n == name && *i == nth)
    }
}

/// How many headers before `index` in `headers` are named `name`.
fn occurrence<'a>(mut names: impl Iterator<Item = &'a str>, index: usize, name: &str) -> usize {
    names.by_ref().take(index).filter(|n| *n == name).count()
}

/// The headers of `raw` (null where `nulls` says the original's were), plus `extra` after them.
pub(crate) fn headers(raw: &RawMessage, nulls: &Nulls, extra: &[(&str, &[u8])]) -> OwnedHeaders {
    let mut out = OwnedHeaders::new_with_capacity(raw.headers.len() + extra.len());
    for (index, (name, value)) in raw.headers.iter().enumerate() {
        let null = !nulls.0.is_empty()
            && value.is_empty()
            && nulls.contains(
                name,
                occurrence(raw.headers.iter().map(|(n, _)| n), index, name),
            );
        out = out.insert(Header {
            key: name,
            value: (!null).then_some(value.as_ref()),
        });
    }
    for (name, value) in extra {
        out = out.insert(Header {
            key: name,
            value: Some(*value),
        });
    }
    out
}

/// The routing headers of a record going to `to`, due at `due`, allowed out of its level at `hop_due`.
pub(crate) fn route_headers(route: &Route) -> [(&'static str, Vec<u8>); 3] {
    [
        (names::ROUTE_TO, route.to.clone().into_bytes()),
        (
            names::ROUTE_DUE,
            route.due.as_millis().to_string().into_bytes(),
        ),
        (
            names::HOP_DUE,
            route.hop_due.as_millis().to_string().into_bytes(),
        ),
    ]
}

fn millis(value: &[u8]) -> Option<Timestamp> {
    std::str::from_utf8(value)
        .ok()?
        .parse()
        .ok()
        .map(Timestamp::from_millis)
}

fn header_name(name: &str) -> Cow<'static, str> {
    match names::ALL.iter().find(|k| **k == name) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(name.to_string()),
    }
}

/// Reads a record; the routing headers and the group are taken out of the event's headers. The payload,
/// the key and the header values are copied into one buffer that they share: two allocations per record
/// (that buffer and the list of headers), made on the consumer thread and freed wherever the event ends —
/// each allocation that crosses threads so takes the allocator's slow path on both.
pub(crate) fn decode(message: &BorrowedMessage<'_>) -> Decoded {
    let (mut to, mut due, mut hop_due, mut group) = (None, None, None, None);
    let mut nulls = Nulls::default();
    let payload = message.payload().unwrap_or_default();
    let key = message.key();
    let hs = message.headers();
    // The first pass copies; the second slices the frozen buffer in the same order.
    let values = hs.as_ref().map_or(0, |hs| {
        hs.iter().map(|h| h.value.map_or(0, <[u8]>::len)).sum()
    });
    let mut buffer = BytesMut::with_capacity(payload.len() + key.map_or(0, <[u8]>::len) + values);
    buffer.extend_from_slice(payload);
    buffer.extend_from_slice(key.unwrap_or_default());
    let mut kept = 0;
    if let Some(hs) = &hs {
        for (index, h) in hs.iter().enumerate() {
            let value = h.value.unwrap_or_default();
            if h.value.is_none() {
                // Counted among the event's headers (the routing ones are not the event's).
                let nth = if is_routing(h.key) {
                    0
                } else {
                    occurrence(hs.iter().map(|h| h.key), index, h.key)
                };
                nulls.0.push((h.key.to_string(), nth));
            }
            match h.key {
                names::ROUTE_TO => to = std::str::from_utf8(value).ok().map(str::to_string),
                names::ROUTE_DUE => due = millis(value),
                names::HOP_DUE => hop_due = millis(value),
                names::GROUP => group = std::str::from_utf8(value).ok().map(str::to_string),
                _ => {
                    buffer.extend_from_slice(value);
                    kept += 1;
                }
            }
        }
    }
    let shared = buffer.freeze();
    let mut at = payload.len();
    let key = key.map(|k| {
        let slice = shared.slice(at..at + k.len());
        at += k.len();
        slice
    });
    let mut headers = EventHeaders::with_capacity(kept);
    if let Some(hs) = &hs {
        for h in hs.iter() {
            if !is_routing(h.key) {
                let len = h.value.map_or(0, <[u8]>::len);
                headers.push(header_name(h.key), shared.slice(at..at + len));
                at += len;
            }
        }
    }
    let route = match (to, due) {
        (Some(to), Some(due)) => Some(Route {
            to,
            due,
            hop_due: hop_due.unwrap_or(due),
        }),
        _ => None,
    };
    let timestamp = match message.timestamp() {
        rdkafka::Timestamp::CreateTime(ms) => Some((ms, TimestampKind::CreateTime)),
        rdkafka::Timestamp::LogAppendTime(ms) => Some((ms, TimestampKind::LogAppendTime)),
        rdkafka::Timestamp::NotAvailable => None,
    }
    .and_then(|(ms, kind)| {
        Some(OriginTimestamp {
            at: Timestamp::from_millis(u64::try_from(ms).ok()?),
            kind,
        })
    });
    Decoded {
        raw: RawMessage {
            payload: shared.slice(..payload.len()),
            key,
            headers,
        },
        nulls,
        route,
        group,
        timestamp,
    }
}

/// Whether `name` is one of the adapter's routing headers, which `decode` takes out of the event's.
fn is_routing(name: &str) -> bool {
    matches!(
        name,
        names::ROUTE_TO | names::ROUTE_DUE | names::HOP_DUE | names::GROUP
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn null_headers_are_named_once_each() {
        let nulls = Nulls(vec![("a".into(), 0), ("b".into(), 0), ("a".into(), 2)]);
        assert_eq!(nulls.names().collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn headers_keep_order_repeats_and_bytes() {
        let raw = RawMessage {
            payload: Bytes::from_static(b"p"),
            key: None,
            headers: EventHeaders::new()
                .with("a", Bytes::from_static(&[0xff, 0]))
                .with("a", "again")
                .with("b", ""),
        };
        let out = headers(&raw, &Nulls::default(), &[(names::GROUP, b"billing")]);
        let read: Vec<(String, Vec<u8>)> = out
            .iter()
            .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
            .collect();
        assert_eq!(
            read,
            vec![
                ("a".to_string(), vec![0xff, 0]),
                ("a".to_string(), b"again".to_vec()),
                ("b".to_string(), Vec::new()),
                (names::GROUP.to_string(), b"billing".to_vec()),
            ]
        );
    }

    #[test]
    fn null_values_are_written_null_again() {
        let raw = RawMessage {
            payload: Bytes::new(),
            key: None,
            headers: EventHeaders::new()
                .with("a", "")
                .with("a", "")
                .with("b", ""),
        };
        let nulls = Nulls(vec![("a".into(), 1), ("b".into(), 0)]);
        let out = headers(&raw, &nulls, &[]);
        let read: Vec<Option<&[u8]>> = out.iter().map(|h| h.value).collect();
        assert_eq!(read, [Some(&b""[..]), None, None]);
    }

    #[test]
    fn route_headers_read_back() {
        let route = Route {
            to: "orders.retry.g".into(),
            due: Timestamp::from_millis(2_000),
            hop_due: Timestamp::from_millis(1_500),
        };
        let hs = route_headers(&route);
        assert_eq!(hs[0].1, b"orders.retry.g");
        assert_eq!(millis(&hs[1].1), Some(route.due));
        assert_eq!(millis(&hs[2].1), Some(route.hop_due));
        assert_eq!(millis(b"x"), None);
    }
}
