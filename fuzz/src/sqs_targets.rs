//! The targets on the SQS adapter: a received message's attributes, the packed `x-retry` one among
//! them, and the adapter's options.

use event_retry_core::options::Options;
use event_retry_sqs::SqsConfig;
use event_retry_sqs::fuzzing::{Attribute, decode_message};

/// `sqs_attributes`: attribute lines `name: value` (a `name#Type` line gives the data type, `String`
/// otherwise; a `Binary…` type takes the value's bytes; `@group:` is the FIFO group), then `---` and the
/// body. Never a panic; the metadata then holds as in `metadata_headers`.
pub fn sqs_attributes(data: &[u8]) {
    let (head, body) = crate::lines::split_body(data);
    let body = String::from_utf8_lossy(body.unwrap_or_default());
    let mut group = None;
    let mut attributes: Vec<Attribute> = Vec::new();
    for (name, value) in crate::lines::header_lines(head) {
        if name == "@group" {
            group = value.map(|v| String::from_utf8_lossy(&v).into_owned());
            continue;
        }
        let (name, data_type) = match name.split_once('#') {
            Some((name, t)) => (name.to_string(), t.to_string()),
            None => (name, "String".to_string()),
        };
        let (string, binary) = match value {
            Some(v) if data_type.starts_with("Binary") => (None, Some(v)),
            Some(v) => (Some(String::from_utf8_lossy(&v).into_owned()), None),
            None => (None, None),
        };
        attributes.push((name, data_type, string, binary));
    }
    let (raw, native) = decode_message(&body, &attributes, group.as_deref());
    let _ = native.describe();
    crate::core_targets::check_metadata(&raw.headers);
}

/// `options_url`, the SQS part.
pub fn sqs_options(options: &Options) {
    let _ = SqsConfig::from_options(options);
}
