//! Entry points for the fuzz targets and their corpus replay; not part of the API.

use bytes::Bytes;
use event_retry_core::adapter::Native;
use event_retry_core::event::RawMessage;
use pulsar::proto::{KeyValue, MessageMetadata};

/// A received message's keys: its partition key (and whether it is base64), its ordering key.
#[derive(Clone, Debug, Default)]
pub struct Keys {
    /// The partition key.
    pub partition_key: Option<String>,
    /// Whether the partition key is base64 (binary keys).
    pub partition_key_b64_encoded: Option<bool>,
    /// The ordering key.
    pub ordering_key: Option<Vec<u8>>,
    /// The event time.
    pub event_time: Option<u64>,
}

/// A received message with `properties` in their order: the message the runtime decodes and what a
/// DLQ entry shows of its envelope.
pub fn decode_message(
    data: &[u8],
    properties: &[(String, String)],
    keys: Keys,
) -> (RawMessage, Native) {
    let metadata = MessageMetadata {
        properties: properties
            .iter()
            .map(|(key, value)| KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        partition_key: keys.partition_key,
        partition_key_b64_encoded: keys.partition_key_b64_encoded,
        ordering_key: keys.ordering_key,
        event_time: keys.event_time,
        ..MessageMetadata::default()
    };
    let native = crate::codec::Envelope::of(&metadata).native();
    (
        crate::codec::decode(Bytes::copy_from_slice(data), &metadata),
        native,
    )
}
