//! Entry points for the fuzz targets and their corpus replay; not part of the API.

use event_retry_core::event::RawMessage;
use event_retry_core::time::Timestamp;

use crate::codec::{Chunks, Copied};

/// A record as the consumer reads it: its parts copied as from librdkafka, then decoded. Returns the
/// event as it travelled and its route's due times, if it had a route.
pub fn decode_record(
    payload: &[u8],
    key: Option<&[u8]>,
    headers: &[(&str, Option<&[u8]>)],
    create_time: Option<i64>,
) -> (RawMessage, Option<(Timestamp, Timestamp)>) {
    let timestamp = create_time.map_or(
        rdkafka::Timestamp::NotAvailable,
        rdkafka::Timestamp::CreateTime,
    );
    let copied = Copied::from_parts(
        payload,
        key,
        || headers.iter().copied(),
        timestamp,
        &mut Chunks::default(),
    );
    let decoded = copied.decode();
    let route = decoded.route.map(|r| (r.due, r.hop_due));
    (decoded.raw, route)
}
