//! Entry points for the fuzz targets and their corpus replay; not part of the API.

use std::collections::HashMap;

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};
use event_retry_core::adapter::Native;
use event_retry_core::event::RawMessage;

/// One message attribute as a receive returns it: its name, data type, string and binary values.
pub type Attribute = (String, String, Option<String>, Option<Vec<u8>>);

/// A received message with `body`, `attributes` (the packed `x-retry` metadata among them) and the
/// FIFO group `group`: the message the runtime decodes and the data types a DLQ entry shows.
pub fn decode_message(
    body: &str,
    attributes: &[Attribute],
    group: Option<&str>,
) -> (RawMessage, Native) {
    let mut map = HashMap::new();
    for (name, data_type, string, binary) in attributes {
        let mut value = MessageAttributeValue::builder().data_type(data_type);
        if let Some(s) = string {
            value = value.string_value(s);
        }
        if let Some(b) = binary {
            value = value.binary_value(Blob::new(b.clone()));
        }
        if let Ok(value) = value.build() {
            map.insert(name.clone(), value);
        }
    }
    let mut message = Message::builder()
        .body(body)
        .set_message_attributes(Some(map));
    if let Some(group) = group {
        message = message.attributes(MessageSystemAttributeName::MessageGroupId, group);
    }
    let decoded = crate::codec::decode(&message.build());
    (decoded.raw, decoded.attributes.native())
}
