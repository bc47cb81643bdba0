//! Ordered headers with repeated names, on brokers whose headers are a map.
//!
//! Kafka keeps headers as an ordered list in which a name may repeat. AMQP header tables, SQS message
//! attributes and the properties the Pulsar client writes are maps: one value per name, in the map's own
//! order. An event moved between brokers, or sent round a retry ladder, must still come back with its
//! headers exactly as the producer wrote them, so on a map broker the first value of each name is written
//! natively (other applications read it as usual) and, only when the headers are not already in name
//! order with unique names, a small layout travels in the SDK's namespace: the names in their order and
//! the values of the repeats. Decoding puts the headers back in that order.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;

use crate::headers::Headers;

/// The header (or packed field) carrying a layout.
pub const LAYOUT: &str = crate::metadata::names::LAYOUT;

/// The longest layout accepted when decoding, in bytes.
pub const MAX_LAYOUT_BYTES: usize = 64 * 1024;

/// Producer headers split for a map: the first value of each name, in order of first appearance, and the
/// layout that restores the whole list (`None` when the names are unique and already in order).
#[derive(Debug)]
pub struct MapHeaders<'a> {
    /// One entry per name: its first value.
    pub unique: Vec<(&'a str, &'a Bytes)>,
    /// The layout text (JSON) to carry as [`LAYOUT`], if one is needed.
    pub layout: Option<String>,
}

/// Splits `headers` for a broker whose headers are a map.
pub fn split(headers: &Headers) -> MapHeaders<'_> {
    let mut unique: Vec<(&str, &Bytes)> = Vec::with_capacity(headers.len());
    let mut more = Vec::new();
    let mut in_order = true;
    let mut previous: Option<&str> = None;
    for (name, value) in headers.iter() {
        if previous.is_some_and(|p| p >= name) {
            in_order = false;
        }
        previous = Some(name);
        if unique.iter().any(|(n, _)| *n == name) {
            more.push(STANDARD.encode(value));
        } else {
            unique.push((name, value));
        }
    }
    let layout = (!in_order).then(|| {
        let names: Vec<&str> = headers.iter().map(|(n, _)| n).collect();
        let mut object = serde_json::Map::new();
        object.insert("names".into(), names.into());
        if !more.is_empty() {
            object.insert("more".into(), more.into());
        }
        serde_json::Value::Object(object).to_string()
    });
    MapHeaders { unique, layout }
}

/// Puts `native` — the headers as a map broker gave them back, one per name — into the order `layout`
/// records, with the repeated values it carries. A name the layout lists but the message no longer has
/// (removed on the way) is left out; a header the layout does not list (added on the way) comes last.
pub fn restore(native: &Headers, layout: &[u8]) -> Result<Headers, String> {
    if layout.len() > MAX_LAYOUT_BYTES {
        return Err(format!(
            "is {} bytes (limit {MAX_LAYOUT_BYTES})",
            layout.len()
        ));
    }
    #[derive(serde::Deserialize)]
    struct Parsed {
        names: Vec<String>,
        #[serde(default)]
        more: Vec<String>,
    }
    // serde's message quotes a string of the wrong type whole (up to the limit above): its start only.
    let parsed: Parsed = serde_json::from_slice(layout).map_err(|e| {
        let message = e.to_string();
        format!(
            "is not a valid layout: {}",
            crate::metadata::truncate_utf8(&message, 200)
        )
    })?;
    let mut firsts: HashMap<String, Bytes> = HashMap::with_capacity(native.len());
    let mut order: Vec<String> = Vec::with_capacity(native.len());
    for (name, value) in native.iter() {
        if let std::collections::hash_map::Entry::Vacant(slot) = firsts.entry(name.to_string()) {
            order.push(slot.key().clone());
            slot.insert(value.clone());
        }
    }
    let mut more = parsed.more.iter();
    let mut out = Headers::with_capacity(parsed.names.len());
    let mut listed: Vec<&str> = Vec::with_capacity(parsed.names.len());
    for name in &parsed.names {
        if listed.contains(&name.as_str()) {
            let encoded = more
                .next()
                .ok_or("lists more repeated values than it carries")?;
            let value = STANDARD
                .decode(encoded)
                .map_err(|e| format!("carries a repeated value that is not base64: {e}"))?;
            if order.iter().any(|n| n == name) {
                out.push(name.clone(), Bytes::from(value));
            }
        } else {
            listed.push(name);
            if let Some(value) = firsts.remove(name) {
                out.push(name.clone(), value);
            }
        }
    }
    if more.next().is_some() {
        return Err("carries more repeated values than it lists".into());
    }
    for name in order {
        if let Some(value) = firsts.remove(&name) {
            out.push(name, value);
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sorted_unique(h: &Headers) -> Headers {
        let split = split(h);
        let mut pairs: Vec<(String, Bytes)> = split
            .unique
            .iter()
            .map(|(n, v)| (n.to_string(), (*v).clone()))
            .collect();
        pairs.sort();
        pairs.into_iter().collect()
    }

    #[test]
    fn names_in_order_and_unique_need_no_layout() {
        let h = Headers::new().with("a", "1").with("b", "2");
        let s = split(&h);
        assert!(s.layout.is_none());
        assert_eq!(s.unique.len(), 2);
    }

    #[test]
    fn order_and_repeats_come_back_exactly() {
        let h = Headers::new()
            .with("zulu", Bytes::from_static(&[0xff, 0x00]))
            .with("alpha", "héllo")
            .with("zulu", "second")
            .with("empty", "")
            .with("alpha", Bytes::from_static(&[0x80]));
        let s = split(&h);
        let layout = s.layout.clone().unwrap();
        let unique: Vec<&str> = s.unique.iter().map(|(n, _)| *n).collect();
        assert_eq!(unique, ["zulu", "alpha", "empty"]);
        let back = restore(&sorted_unique(&h), layout.as_bytes()).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn headers_changed_on_the_way_are_kept() {
        let h = Headers::new().with("b", "1").with("a", "2").with("b", "3");
        let layout = split(&h).layout.unwrap();
        let native = Headers::new().with("a", "2").with("c", "new");
        let back = restore(&native, layout.as_bytes()).unwrap();
        let got: Vec<(&str, &[u8])> = back.iter().map(|(n, v)| (n, v.as_ref())).collect();
        assert_eq!(got, [("a", &b"2"[..]), ("c", b"new")]);
    }

    #[test]
    fn malformed_layouts_are_errors() {
        assert!(restore(&Headers::new(), b"[1]").is_err());
        assert!(restore(&Headers::new(), br#"{"names":["a","a"]}"#).is_err());
        assert!(restore(&Headers::new(), br#"{"names":["a"],"more":["AA=="]}"#).is_err());
        assert!(restore(&Headers::new(), br#"{"names":["a","a"],"more":["%%"]}"#).is_err());
        assert!(restore(&Headers::new(), &vec![b' '; MAX_LAYOUT_BYTES + 1]).is_err());
    }
}
