//! An outbox row as stored and shown, and how an event's headers are kept in one column.
//!
//! Headers are stored as a JSON array of `[name, value]` pairs in order, repeats kept; a value that is not
//! UTF-8 is stored as `{"b64": "…"}`. JSON rather than a binary blob, so an operator reading the table with
//! `psql` or `sqlite3` sees the headers as they were sent.

use base64::Engine;
use bytes::Bytes;
use event_retry_core::event::Event;
use event_retry_core::headers::Headers;
use event_retry_core::time::Timestamp;
use serde_json::Value;

use crate::lifecycle::State;

/// One row of the outbox: the event and the seed's bookkeeping fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxRow {
    /// The row id; rows of one key are published in id order when ordering is on.
    pub id: i64,
    /// The event id consumers deduplicate on; the same on every publish of the row.
    pub event_id: String,
    /// Where the event is published.
    pub topic: String,
    /// The event's key.
    pub key: Option<Bytes>,
    /// The payload bytes.
    pub payload: Bytes,
    /// The producer's headers, in order.
    pub headers: Headers,
    /// Why the `headers` column does not decode, if it does not (a foreign writer's row): the relay
    /// sends such a row to `DEAD` with this reason, and operators see it.
    pub headers_error: Option<String>,
    /// Where the row is in its life.
    pub state: State,
    /// Failed publish attempts since it was enqueued or last replayed.
    pub attempts: u32,
    /// How many times an operator replayed it from `DEAD`.
    pub replay_count: u32,
    /// When it may be published (next): no relay claims it earlier.
    pub available_at: Timestamp,
    /// When a relay last claimed it.
    pub claimed_at: Option<Timestamp>,
    /// When the current claim's lease expires (only while `CLAIMED`).
    pub lease_until: Option<Timestamp>,
    /// The claim holding it (relay and claim number; only while `CLAIMED`).
    pub claimed_by: Option<String>,
    /// The last publish error, bounded in length.
    pub last_error: Option<String>,
    /// When it was enqueued (the business transaction's time).
    pub created_at: Timestamp,
    /// When the broker confirmed it.
    pub published_at: Option<Timestamp>,
    /// When it went `DEAD`.
    pub dead_at: Option<Timestamp>,
}

impl OutboxRow {
    /// The event as it is published: payload, key, headers and the row's event id.
    pub fn event(&self) -> Event {
        let mut event = Event::new(self.payload.clone()).with_id(self.event_id.clone());
        event.key = self.key.clone();
        event.headers = self.headers.clone();
        event
    }
}

/// Encodes headers for the `headers` column.
pub(crate) fn encode_headers(headers: &Headers) -> String {
    let pairs: Vec<Value> = headers
        .iter()
        .map(|(name, value)| {
            let value = match std::str::from_utf8(value) {
                Ok(text) => Value::String(text.to_string()),
                Err(_) => serde_json::json!({
                    "b64": base64::engine::general_purpose::STANDARD.encode(value)
                }),
            };
            Value::Array(vec![Value::String(name.to_string()), value])
        })
        .collect();
    Value::Array(pairs).to_string()
}

/// Decodes the `headers` column; a column another writer filled with something else is an error that
/// says what is wrong (the relay sends such a row to `DEAD` with that reason).
pub(crate) fn decode_headers(text: &str) -> Result<Headers, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("the headers column is not JSON: {e}"))?;
    let Value::Array(pairs) = value else {
        return Err("the headers column is not a JSON array of [name, value] pairs".into());
    };
    let mut headers = Headers::with_capacity(pairs.len());
    for (i, pair) in pairs.into_iter().enumerate() {
        let bad = || format!("header {i} in the headers column is not a [name, value] pair");
        let Value::Array(mut parts) = pair else {
            return Err(bad());
        };
        if parts.len() != 2 {
            return Err(bad());
        }
        let value = parts.pop().ok_or_else(bad)?;
        let Some(Value::String(name)) = parts.pop() else {
            return Err(bad());
        };
        let bytes = match value {
            Value::String(text) => Bytes::from(text),
            Value::Object(map) => match map.get("b64") {
                Some(Value::String(b64)) => base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map(Bytes::from)
                    .map_err(|e| format!("header {name:?}: bad base64: {e}"))?,
                _ => return Err(bad()),
            },
            _ => return Err(bad()),
        };
        headers.push(name, bytes);
    }
    Ok(headers)
}

/// Cuts an error message to `max` bytes on a character boundary, marking the cut.
pub(crate) fn bounded(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_in_order_with_repeats_and_binary() {
        let headers = Headers::new()
            .with("b", "2")
            .with("a", "1")
            .with("b", "3")
            .with("bin", Bytes::from_static(&[0, 159, 146, 150]))
            .with("empty", "");
        let text = encode_headers(&headers);
        assert_eq!(decode_headers(&text).unwrap(), headers);
        assert!(text.starts_with(r#"[["b","2"],["a","1"]"#), "{text}");
    }

    #[test]
    fn foreign_columns_are_refused_with_a_reason() {
        assert!(decode_headers("{").unwrap_err().contains("not JSON"));
        assert!(decode_headers("{}").unwrap_err().contains("array"));
        assert!(decode_headers("[[1,2]]").unwrap_err().contains("header 0"));
        assert!(
            decode_headers(r#"[["a",{"b64":"!!"}]]"#)
                .unwrap_err()
                .contains("base64")
        );
        assert_eq!(decode_headers("[]").unwrap(), Headers::new());
    }

    #[test]
    fn long_errors_are_cut_on_a_character() {
        assert_eq!(bounded("short", 10), "short");
        let cut = bounded("ééééé", 6);
        assert!(cut.len() <= 6 && cut.ends_with("..."), "{cut}");
    }
}
