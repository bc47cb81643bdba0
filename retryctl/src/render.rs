//! How `retryctl` shows things to a person — times in UTC with their age, durations such as
//! `2h 8m 15s`, counted nouns ("1 dead letter"), bytes as text where they are text and hex where they
//! are not, JSON payloads pretty-printed — and the JSON a script reads instead (`--json`). Nothing here
//! prints Rust's debug formatting.

use std::time::{Duration, SystemTime};

use event_retry::DeadLetter;
use event_retry_core::time::Timestamp;
use serde_json::{Value, json};

use crate::CliError;

/// A duration for people: `500ms`, `1m 5s`, `2h 8m 15s` (to the millisecond).
pub fn duration(d: Duration) -> String {
    let ms = Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    if ms.is_zero() {
        return "0s".into();
    }
    humantime::format_duration(ms).to_string()
}

/// A time for people: RFC 3339 in UTC, to the second.
pub fn time(t: Timestamp) -> String {
    humantime::format_rfc3339_seconds(t.to_system_time()).to_string()
}

/// Counts as a one-line bar chart (`▁▂▃▄▅▆▇█`, a space for none), scaled to the largest.
pub fn sparkline(counts: &[usize]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = counts.iter().copied().max().unwrap_or(0);
    counts
        .iter()
        .map(|&n| match n {
            0 => ' ',
            n => BARS[n * (BARS.len() - 1) / max.max(1)],
        })
        .collect()
}

/// A time with how long ago it was: `2026-11-24T10:00:00Z (3h 12m ago)`.
pub fn time_ago(t: Timestamp) -> String {
    let now = Timestamp::now();
    if t > now {
        return format!("{} (in {})", time(t), duration(t.since(now)));
    }
    let ago = now.since(t);
    // Seconds are enough for an age.
    format!(
        "{} ({} ago)",
        time(t),
        duration(Duration::from_secs(ago.as_secs()))
    )
}

/// `n` of a noun, with the plural when `n` is not 1: `counted(1, "dead letter", "dead letters")`.
pub fn counted(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Bytes as text when they are UTF-8 without control characters (tabs and line breaks allowed), else
/// as hex (`0xff01`).
pub fn text_or_hex(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text)
            if !text
                .chars()
                .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r')) =>
        {
            text.to_string()
        }
        _ => hex(bytes),
    }
}

/// `0x` and two hex digits per byte.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(2 + bytes.len() * 2);
    out.push_str("0x");
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// How a payload is best shown: `json` (pretty-printed), `text` or `hex`, and the text.
pub fn payload(bytes: &[u8]) -> (&'static str, String) {
    if let Ok(value) = serde_json::from_slice::<Value>(bytes)
        && (value.is_object() || value.is_array())
        && let Ok(pretty) = serde_json::to_string_pretty(&value)
    {
        return ("json", pretty);
    }
    let shown = text_or_hex(bytes);
    if shown.starts_with("0x") && std::str::from_utf8(bytes).is_err() {
        ("hex", shown)
    } else {
        ("text", shown)
    }
}

/// Bytes in JSON: a string when they are UTF-8, else `{"hex": "…"}`.
pub fn bytes_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::String(text.to_string()),
        Err(_) => json!({ "hex": hex(bytes).trim_start_matches("0x") }),
    }
}

/// A time in JSON: RFC 3339 with milliseconds, and the epoch milliseconds.
pub fn time_json(t: Option<Timestamp>) -> Value {
    match t {
        Some(t) => json!({
            "utc": humantime::format_rfc3339_millis(t.to_system_time()).to_string(),
            "epoch_ms": t.as_millis(),
        }),
        None => Value::Null,
    }
}

/// `2026-11-24T10:00:00Z`, or a duration ago (`90s`, `2h`, `1d`).
pub fn parse_time(text: &str) -> Result<Timestamp, CliError> {
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        return Ok(Timestamp::from_system_time(t));
    }
    let ago: Duration = humantime::parse_duration(text).map_err(|_| {
        CliError::Usage(format!(
            "{text:?} is neither a time (2026-11-24T10:00:00Z) nor a duration ago (2h)"
        ))
    })?;
    Ok(Timestamp::from_system_time(
        SystemTime::now()
            .checked_sub(ago)
            .unwrap_or(SystemTime::UNIX_EPOCH),
    ))
}

/// A dead letter's fields for people, in the order `dlq show` and the console show them: its ids, key
/// and group, why and when it died, its history, its origin and its replays ("-" where there is none).
pub fn entry_fields(entry: &DeadLetter) -> Vec<(&'static str, String)> {
    let e = &entry.event;
    let m = e.metadata();
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let dead = m.dead.as_ref();
    vec![
        ("id", entry.id.clone()),
        ("event id", opt(m.event_id.as_deref().map(str::to_string))),
        ("key", opt(e.key.as_deref().map(text_or_hex))),
        ("consumer group", opt(entry.group.clone())),
        ("dead", opt(dead.map(|d| d.reason.to_string()))),
        ("dead at", opt(dead.map(|d| time_ago(d.at)))),
        ("dead-lettered by", opt(dead.map(|d| d.consumer.clone()))),
        (
            "error kind",
            opt(m.error_kind.map(|k| k.as_str().to_string())),
        ),
        ("last error", opt(m.last_error.clone())),
        ("attempts", m.attempts.to_string()),
        ("retries", m.retries.to_string()),
        ("first seen", opt(m.first_seen.map(time_ago))),
        ("last delay", opt(m.last_delay.map(duration))),
        (
            "origin",
            opt(m.origin.as_ref().map(|o| match (o.partition, o.offset) {
                (Some(p), Some(off)) => format!("{} (partition {p}, offset {off})", o.topic),
                _ => o.topic.to_string(),
            })),
        ),
        ("replays", m.replay_count.to_string()),
        ("replayed at", opt(m.replayed_at.map(time_ago))),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_a_person_writes_them() {
        assert_eq!(duration(Duration::from_secs(2047)), "34m 7s");
        assert_eq!(duration(Duration::from_secs(7695)), "2h 8m 15s");
        assert_eq!(duration(Duration::from_millis(500)), "500ms");
        assert_eq!(duration(Duration::ZERO), "0s");
        assert_eq!(duration(Duration::from_micros(1_500_700)), "1s 500ms");
    }

    #[test]
    fn times_parse_as_instants_or_durations_ago_and_show_their_age() {
        let t = parse_time("2026-11-24T10:00:00Z").unwrap();
        assert_eq!(time(t), "2026-11-24T10:00:00Z");
        let ago = parse_time("2h").unwrap();
        let expected = Timestamp::now().minus(Duration::from_secs(7200));
        assert!(ago.since(expected) < Duration::from_secs(5));
        assert!(time_ago(ago).ends_with("ago)"), "{}", time_ago(ago));
        assert!(time_ago(ago).contains("2h"), "{}", time_ago(ago));
        assert!(parse_time("yesterday-ish").is_err());
    }

    #[test]
    fn bytes_show_as_text_json_or_hex() {
        assert_eq!(counted(1, "dead letter", "dead letters"), "1 dead letter");
        assert_eq!(counted(0, "dead letter", "dead letters"), "0 dead letters");
        assert_eq!(text_or_hex(&[0xff, 0x01]), "0xff01");
        assert_eq!(text_or_hex(b"a\x00b"), "0x610062");
        assert_eq!(text_or_hex(b"customer-0"), "customer-0");
        let (kind, shown) = payload(br#"{"id":1,"items":[2]}"#);
        assert_eq!(kind, "json");
        assert!(shown.contains("\n  \"id\": 1"), "{shown}");
        assert_eq!(payload(b"plain").0, "text");
        assert_eq!(payload(&[0xff]).0, "hex");
        assert_eq!(bytes_json(&[0xff]), json!({"hex": "ff"}));
    }
}
