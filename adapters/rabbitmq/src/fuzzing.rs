//! Entry points for the fuzz targets and their corpus replay; not part of the API.

use bytes::Bytes;
use event_retry_core::adapter::Native;
use event_retry_core::event::RawMessage;
use lapin::BasicProperties;
use lapin::types::FieldTable;

/// A delivery whose header table is `table` in AMQP's wire encoding (a field table: its 4-byte length,
/// then each entry's short-string name, type tag and value — every AMQP value type): the message the
/// runtime decodes and what a DLQ entry shows of it; `None` when the table does not parse.
pub fn decode_delivery(body: &[u8], table: &[u8]) -> Option<(RawMessage, Native)> {
    let (_, table): (_, FieldTable) = lapin::types::parsing::parse_field_table(table).ok()?;
    let properties = BasicProperties::default().with_headers(table);
    Some((
        crate::codec::raw_message(Bytes::copy_from_slice(body), &properties),
        crate::codec::native(&properties),
    ))
}
