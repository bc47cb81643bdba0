//! The targets on the Pulsar adapter: a received message's properties, and the adapter's options.

use event_retry_core::options::Options;
use event_retry_pulsar::PulsarConfig;
use event_retry_pulsar::fuzzing::{Keys, decode_message};

/// `pulsar_properties`: property lines `name: value` (`@partition-key:`, `@b64:` (any value: true),
/// `@ordering-key:` and `@event-time:` set the message's keys), then `---` and the payload. Never a
/// panic; the metadata then holds as in `metadata_headers`.
pub fn pulsar_properties(data: &[u8]) {
    let (head, payload) = crate::lines::split_body(data);
    let mut keys = Keys::default();
    let mut properties = Vec::new();
    for (name, value) in crate::lines::header_lines(head) {
        let text = value
            .as_deref()
            .map(|v| String::from_utf8_lossy(v).into_owned());
        match name.as_str() {
            "@partition-key" => keys.partition_key = text,
            "@b64" => keys.partition_key_b64_encoded = Some(value.is_some()),
            "@ordering-key" => keys.ordering_key = value,
            "@event-time" => keys.event_time = text.and_then(|t| t.parse().ok()),
            _ => properties.push((name, text.unwrap_or_default())),
        }
    }
    let (raw, native) = decode_message(payload.unwrap_or_default(), &properties, keys);
    let _ = native.describe();
    crate::core_targets::check_metadata(&raw.headers);
}

/// `options_url`, the Pulsar part.
pub fn pulsar_options(options: &Options) {
    let _ = PulsarConfig::from_options(options);
}
