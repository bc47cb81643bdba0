//! The targets on the Kafka adapter: a record's headers as the consumer decodes them, and the
//! adapter's options.

use event_retry_core::metadata::names;
use event_retry_core::options::Options;
use event_retry_kafka::KafkaConfig;
use event_retry_kafka::fuzzing::decode_record;

/// `kafka_headers`: header lines (a line without a colon is a null header; `@key:` gives the record's
/// key), then `---` and the payload. Never a panic; every header but the adapter's routing ones reaches
/// the event in order; the metadata then holds as in `metadata_headers`.
pub fn kafka_headers(data: &[u8]) {
    let (head, payload) = crate::lines::split_body(data);
    let lines = crate::lines::header_lines(head);
    let key = lines
        .iter()
        .find(|(name, _)| name == "@key")
        .and_then(|(_, v)| v.as_deref());
    let headers: Vec<(&str, Option<&[u8]>)> = lines
        .iter()
        .filter(|(name, _)| name != "@key")
        .map(|(name, value)| (name.as_str(), value.as_deref()))
        .collect();
    let (raw, route) = decode_record(
        payload.unwrap_or_default(),
        key,
        &headers,
        Some(1_700_000_000_000),
    );
    assert_eq!(raw.payload.as_ref(), payload.unwrap_or_default());
    assert_eq!(raw.key.as_deref(), key);
    let kept: Vec<(&str, &[u8])> = headers
        .iter()
        .filter(|(name, _)| {
            ![
                names::ROUTE_TO,
                names::ROUTE_DUE,
                names::HOP_DUE,
                names::GROUP,
            ]
            .contains(name)
        })
        .map(|(name, value)| (*name, value.unwrap_or_default()))
        .collect();
    let decoded: Vec<(&str, &[u8])> = raw.headers.iter().map(|(n, v)| (n, v.as_ref())).collect();
    assert_eq!(kept, decoded, "headers changed on the way");
    if let Some((due, hop_due)) = route {
        let now = event_retry_core::time::Timestamp::from_millis(1_700_000_000_000);
        let _ = (due.since(now), hop_due.since(now), due.to_system_time());
    }
    crate::core_targets::check_metadata(&raw.headers);
}

/// `options_url`, the Kafka part.
pub fn kafka_options(options: &Options) {
    let _ = KafkaConfig::from_options(options);
}
