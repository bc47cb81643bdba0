//! The event as handlers see it, and the raw message as brokers carry it.
//!
//! A broker message is payload bytes, an optional key and a list of headers. The SDK keeps its own
//! bookkeeping ([`RetryMetadata`]) in headers of its own namespace and leaves everything else — payload, key and
//! the producer's headers — byte for byte as it found it, on every hop and into the DLQ.

use std::borrow::Cow;

use bytes::Bytes;

use crate::metadata::{self, MetadataError, RetryMetadata};

/// Ordered message headers; names may repeat and values are arbitrary bytes.
///
/// Names are kept as `Cow<'static, str>` so the SDK's own (static) names cost no allocation per message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers(Vec<(Cow<'static, str>, Bytes)>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// No headers, with room for `n`.
    pub fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }

    /// Appends a header (keeping any earlier one of the same name).
    pub fn push(&mut self, name: impl Into<Cow<'static, str>>, value: impl Into<Bytes>) {
        self.0.push((name.into(), value.into()));
    }

    /// Appends a header, builder style.
    pub fn with(mut self, name: impl Into<Cow<'static, str>>, value: impl Into<Bytes>) -> Self {
        self.push(name, value);
        self
    }

    pub(crate) fn entries(&self) -> &[(Cow<'static, str>, Bytes)] {
        &self.0
    }

    /// Every (name, value) pair in order, as owned (cheaply cloned) values.
    pub fn iter_owned(&self) -> impl Iterator<Item = (Cow<'static, str>, Bytes)> + '_ {
        self.0.iter().cloned()
    }

    /// The last value of `name`, if present.
    pub fn get(&self, name: &str) -> Option<&Bytes> {
        self.0.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Every (name, value) pair in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Bytes)> {
        self.0.iter().map(|(n, v)| (n.as_ref(), v))
    }

    /// The number of headers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Removes every header whose name matches `predicate`.
    pub fn retain(&mut self, mut predicate: impl FnMut(&str, &Bytes) -> bool) {
        self.0.retain(|(n, v)| predicate(n, v));
    }
}

impl FromIterator<(String, Bytes)> for Headers {
    fn from_iter<I: IntoIterator<Item = (String, Bytes)>>(iter: I) -> Self {
        Self(iter.into_iter().map(|(n, v)| (Cow::Owned(n), v)).collect())
    }
}

impl IntoIterator for Headers {
    type Item = (Cow<'static, str>, Bytes);
    type IntoIter = std::vec::IntoIter<(Cow<'static, str>, Bytes)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// A message as it travels on a broker: payload, key and all headers, the SDK's metadata included.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawMessage {
    /// The payload bytes.
    pub payload: Bytes,
    /// The partition/routing key, where the broker has one.
    pub key: Option<Bytes>,
    /// Every header, the SDK's own and the producer's.
    pub headers: Headers,
}

/// An event: the producer's payload, key and headers, and the SDK's metadata kept apart from them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// The payload bytes, never altered by the SDK.
    pub payload: Bytes,
    /// The key, never altered by the SDK.
    pub key: Option<Bytes>,
    /// The producer's own headers (everything outside the SDK's namespace), never altered by the SDK.
    pub headers: Headers,
    /// The SDK's retry bookkeeping.
    pub meta: RetryMetadata,
}

impl Event {
    /// A new event carrying `payload`, with no key, no headers and fresh metadata.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Self {
            payload: payload.into(),
            ..Self::default()
        }
    }

    /// Sets the key.
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Adds a producer header.
    pub fn with_header(
        mut self,
        name: impl Into<Cow<'static, str>>,
        value: impl Into<Bytes>,
    ) -> Self {
        self.headers.push(name, value);
        self
    }

    /// Sets the event id (used for idempotency and tracing); without one the broker's message id is used.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.meta.event_id = Some(id.into());
        self
    }

    /// The event id, if known.
    pub fn id(&self) -> Option<&str> {
        self.meta.event_id.as_deref()
    }

    /// Encodes the event into a broker message with the metadata as individual headers.
    pub fn to_raw(&self) -> RawMessage {
        RawMessage {
            payload: self.payload.clone(),
            key: self.key.clone(),
            headers: metadata::encode(&self.meta, &self.headers),
        }
    }

    /// Decodes a broker message; malformed or oversized metadata is an error naming the header and why.
    pub fn from_raw(raw: RawMessage) -> Result<Self, MetadataError> {
        let (meta, headers) = metadata::decode(&raw.headers)?;
        Ok(Self {
            payload: raw.payload,
            key: raw.key,
            headers,
            meta,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn headers_keep_order_and_duplicates() {
        let h = Headers::new()
            .with("a", "1")
            .with("b", Bytes::from_static(&[0, 255]))
            .with("a", "2");
        assert_eq!(h.len(), 3);
        assert_eq!(h.get("a").unwrap().as_ref(), b"2");
        let names: Vec<_> = h.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["a", "b", "a"]);
    }

    #[test]
    fn raw_round_trip_is_byte_for_byte() {
        let mut e = Event::new(Bytes::from_static(&[0xff, 0x00, 0xfe]))
            .with_key(Bytes::from_static(&[1, 2, 3]))
            .with_header("trace", Bytes::from_static(&[0x80, 0x81]))
            .with_header("trace", "second")
            .with_id("evt-1");
        e.meta.attempts = 2;
        let back = Event::from_raw(e.to_raw()).unwrap();
        assert_eq!(back, e);
    }
}
