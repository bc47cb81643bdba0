//! Events as Kafka records, and the adapter's routing headers.
//!
//! Kafka headers are ordered, may repeat and carry any bytes, so an event's headers (the SDK's metadata
//! included) travel exactly as they are; a header with a null value comes back empty. A record on its
//! way through the delay ladder carries three more headers, which the adapter reads and strips before
//! the runtime sees the record: where it goes when due, when it is due, and when it may leave the level
//! it sits in. A dead letter carries the consumer group that dead-lettered it.

use bytes::Bytes;
use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use retry_core::event::{Headers as EventHeaders, RawMessage};
use retry_core::time::Timestamp;

/// The topic a delayed record goes to once due (a group's retry topic).
pub(crate) const ROUTE_TO: &str = "x-retry-route-to";
/// When a delayed record is due, in ms since the epoch.
pub(crate) const ROUTE_DUE: &str = "x-retry-route-due";
/// When a record may leave the ladder level it sits in, in ms since the epoch.
pub(crate) const HOP_DUE: &str = "x-retry-hop-due";
/// The consumer group that dead-lettered a DLQ record.
pub(crate) const GROUP: &str = "x-retry-group";

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
    pub(crate) route: Option<Route>,
    pub(crate) group: Option<String>,
}

/// The headers of `raw`, plus `extra` after them.
pub(crate) fn headers(raw: &RawMessage, extra: &[(&str, &[u8])]) -> OwnedHeaders {
    let mut out = OwnedHeaders::new_with_capacity(raw.headers.len() + extra.len());
    for (name, value) in raw.headers.iter() {
        out = out.insert(Header {
            key: name,
            value: Some(value.as_ref()),
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
        (ROUTE_TO, route.to.clone().into_bytes()),
        (ROUTE_DUE, route.due.as_millis().to_string().into_bytes()),
        (HOP_DUE, route.hop_due.as_millis().to_string().into_bytes()),
    ]
}

fn millis(value: &[u8]) -> Option<Timestamp> {
    std::str::from_utf8(value)
        .ok()?
        .parse()
        .ok()
        .map(Timestamp::from_millis)
}

/// Reads a record; the routing headers and the group are taken out of the event's headers.
pub(crate) fn decode(message: &BorrowedMessage<'_>) -> Decoded {
    let mut headers = EventHeaders::new();
    let (mut to, mut due, mut hop_due, mut group) = (None, None, None, None);
    if let Some(hs) = message.headers() {
        for h in hs.iter() {
            let value = h.value.unwrap_or_default();
            match h.key {
                ROUTE_TO => to = std::str::from_utf8(value).ok().map(str::to_string),
                ROUTE_DUE => due = millis(value),
                HOP_DUE => hop_due = millis(value),
                GROUP => group = std::str::from_utf8(value).ok().map(str::to_string),
                name => headers.push(name.to_string(), Bytes::copy_from_slice(value)),
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
    Decoded {
        raw: RawMessage {
            payload: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
            key: message.key().map(Bytes::copy_from_slice),
            headers,
        },
        route,
        group,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let out = headers(&raw, &[(GROUP, b"billing")]);
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
                (GROUP.to_string(), b"billing".to_vec()),
            ]
        );
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
