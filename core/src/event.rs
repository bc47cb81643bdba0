//! The event as handlers see it, and the raw message as brokers carry it.
//!
//! A broker message is payload bytes, an optional key and a list of headers. The SDK keeps its own
//! bookkeeping ([`RetryMetadata`]) in headers of its own namespace and leaves everything else — payload, key and
//! the producer's headers — byte for byte as it found it, on every hop and into the DLQ.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;

use crate::headers::Headers;
use crate::metadata::{self, MetadataError, RetryMetadata};

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
    /// The SDK's retry bookkeeping: read it with [`Event::metadata`]; only the runtime and adapters
    /// write it.
    pub(crate) meta: RetryMetadata,
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
    pub fn with_id(mut self, id: impl AsRef<str>) -> Self {
        self.meta.event_id = Some(Arc::from(id.as_ref()));
        self
    }

    /// A JSON payload from `value`, with a `content-type: application/json` header.
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        Ok(Self::new(serde_json::to_vec(value)?).with_header("content-type", "application/json"))
    }

    /// The event id, if known.
    pub fn id(&self) -> Option<&str> {
        self.meta.event_id.as_deref()
    }

    /// The SDK's retry bookkeeping: attempts, first-seen and due times, origin, last error, replay count,
    /// and on a dead letter why and when it died.
    pub fn metadata(&self) -> &RetryMetadata {
        &self.meta
    }

    pub(crate) fn metadata_mut(&mut self) -> &mut RetryMetadata {
        &mut self.meta
    }

    pub(crate) fn from_parts(
        payload: Bytes,
        key: Option<Bytes>,
        headers: Headers,
        meta: RetryMetadata,
    ) -> Self {
        Self {
            payload,
            key,
            headers,
            meta,
        }
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
