//! Failure groups: the dead letters that died of one cause, under one short fingerprint.
//!
//! After an outage a DLQ holds thousands of entries from a handful of causes, and an operator needs the
//! causes, not the entries. A fingerprint is computed when an entry is read — from the error kind, the
//! last error's message with its volatile parts normalised, the topic the event was consumed from and
//! the consumer group — so entries written by any earlier version group too, and the same cause gives
//! the same fingerprint on every broker and in every process (FNV-1a over those fields: no randomised
//! hasher). The error's Rust type is not in an entry's metadata, so it is not part of the fingerprint.
//!
//! The message is normalised so that "order 1234 not found" and "order 98 not found" are one cause:
//! quoted values, timestamps, UUIDs, IP addresses, hexadecimal ids (a token of hex digits mixing a
//! digit and a letter a–f, `0x` or not) and numbers become placeholders.

use std::collections::HashMap;
use std::fmt;
use std::sync::LazyLock;

use regex::Regex;

use super::DeadLetter;
use crate::classify::FailureKind;
use crate::time::Timestamp;

/// A failure group's id: 12 hexadecimal characters, stable across brokers, processes and versions.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint of a failure: its error kind, its last error's message (normalised here), the
    /// topic the event was consumed from and the consumer group, where known.
    pub fn of(kind: Option<FailureKind>, message: &str, topic: &str, group: Option<&str>) -> Self {
        let mut hash = Fnv::new();
        hash.field(kind.map_or("", FailureKind::as_str));
        hash.field(&normalize(message));
        hash.field(topic);
        hash.field(group.unwrap_or(""));
        Fingerprint(format!("{:012x}", hash.0 >> 16))
    }

    /// The fingerprint as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// 64-bit FNV-1a, each field followed by a separator byte no UTF-8 text holds.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn field(&mut self, text: &str) {
        for byte in text.bytes().chain([0xff]) {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The patterns replaced, in order, and their placeholders.
static VOLATILE: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    [
        (r#""[^"]*"|'[^']*'|`[^`]*`"#, "<q>"),
        (
            r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?",
            "<time>",
        ),
        (
            r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b",
            "<uuid>",
        ),
        (r"\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b", "<ip>"),
        (r"(?i)\b(0x)?[0-9a-f]*\d[0-9a-f]*[a-f][0-9a-f]*\b", "<hex>"),
        (r"(?i)\b(0x)?[0-9a-f]*[a-f][0-9a-f]*\d[0-9a-f]*\b", "<hex>"),
        (r"\d+(\.\d+)?", "<n>"),
    ]
    .into_iter()
    .map(|(pattern, placeholder)| {
        let regex = Regex::new(pattern).unwrap_or_else(|e| unreachable!("{pattern}: {e}"));
        (regex, placeholder)
    })
    .collect()
});

/// `message` with its volatile parts replaced by placeholders (`<q>`, `<time>`, `<uuid>`, `<ip>`,
/// `<hex>`, `<n>`) and its whitespace collapsed: what one cause's messages share.
pub fn normalize(message: &str) -> String {
    let mut text = message.to_string();
    for (regex, placeholder) in VOLATILE.iter() {
        text = regex.replace_all(&text, *placeholder).into_owned();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl DeadLetter {
    /// The entry's failure group: its error kind, last error, origin topic and consumer group.
    pub fn fingerprint(&self) -> Fingerprint {
        let meta = self.event.metadata();
        Fingerprint::of(
            meta.error_kind,
            meta.last_error.as_deref().unwrap_or(""),
            meta.origin.as_ref().map_or("", |o| &*o.topic),
            self.group.as_deref(),
        )
    }
}

/// The dead letters of one cause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureGroup {
    /// The group's id, for `--group` and [`DlqFilter::fingerprint`](super::DlqFilter::fingerprint).
    pub fingerprint: Fingerprint,
    /// The error kind its entries failed with.
    pub error_kind: Option<FailureKind>,
    /// The last error's message, normalised: what its entries' messages share.
    pub pattern: String,
    /// The last error's message of the group's latest entry, as it was.
    pub sample_error: String,
    /// The id of the group's latest entry.
    pub sample_id: String,
    /// The topic its events were consumed from.
    pub topic: String,
    /// The consumer group that dead-lettered them, where the broker keeps one.
    pub group: Option<String>,
    /// How many entries.
    pub count: usize,
    /// When its entries were dead-lettered, earliest first (entries without a time are counted only).
    pub dead_at: Vec<Timestamp>,
    /// When the sample was dead-lettered.
    sample_at: Option<Timestamp>,
}

impl FailureGroup {
    /// When its first entry was dead-lettered.
    pub fn first_dead_at(&self) -> Option<Timestamp> {
        self.dead_at.first().copied()
    }

    /// When its latest entry was dead-lettered.
    pub fn last_dead_at(&self) -> Option<Timestamp> {
        self.dead_at.last().copied()
    }

    /// Entries dead-lettered in each of the `hours` hours up to `now`, oldest hour first (a chart of when
    /// the group's entries died).
    pub fn per_hour(&self, now: Timestamp, hours: usize) -> Vec<usize> {
        const HOUR: u64 = 3_600_000;
        let mut counts = vec![0; hours];
        let end = now.as_millis();
        for at in &self.dead_at {
            let age = end.saturating_sub(at.as_millis()) / HOUR;
            if let Some(slot) = usize::try_from(age)
                .ok()
                .filter(|&a| a < hours)
                .map(|a| hours - 1 - a)
            {
                counts[slot] += 1;
            }
        }
        counts
    }
}

/// Groups `entries` by fingerprint, the largest group first (then the most recent).
pub fn failure_groups(entries: &[DeadLetter]) -> Vec<FailureGroup> {
    let mut groups: HashMap<Fingerprint, FailureGroup> = HashMap::new();
    for entry in entries {
        let meta = entry.event.metadata();
        let dead_at = entry.dead().map(|d| d.at);
        let group = groups
            .entry(entry.fingerprint())
            .or_insert_with_key(|fingerprint| FailureGroup {
                fingerprint: fingerprint.clone(),
                error_kind: meta.error_kind,
                pattern: normalize(meta.last_error.as_deref().unwrap_or("")),
                sample_error: String::new(),
                sample_id: String::new(),
                topic: meta
                    .origin
                    .as_ref()
                    .map_or_else(String::new, |o| o.topic.to_string()),
                group: entry.group.clone(),
                count: 0,
                dead_at: Vec::new(),
                sample_at: None,
            });
        group.count += 1;
        let latest = match (dead_at, group.sample_at) {
            (Some(at), Some(last)) => at >= last,
            (_, None) => true,
            (None, Some(_)) => false,
        };
        if latest || group.sample_id.is_empty() {
            group.sample_id = entry.id.clone();
            group.sample_error = meta.last_error.clone().unwrap_or_default();
            group.sample_at = dead_at;
        }
        if let Some(at) = dead_at {
            group.dead_at.push(at);
        }
    }
    let mut groups: Vec<FailureGroup> = groups.into_values().collect();
    for group in &mut groups {
        group.dead_at.sort_unstable();
    }
    groups.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then(b.last_dead_at().cmp(&a.last_dead_at()))
            .then(a.fingerprint.cmp(&b.fingerprint))
    });
    groups
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::adapter::Native;
    use crate::event::Event;
    use crate::metadata::{DeadInfo, DeadReason, Origin};

    fn entry(id: &str, error: &str, kind: FailureKind, at_ms: u64) -> DeadLetter {
        let mut event = Event::new("p").with_id(id);
        let meta = event.metadata_mut();
        meta.last_error = Some(error.to_string());
        meta.error_kind = Some(kind);
        meta.origin = Some(Origin {
            topic: "orders".into(),
            partition: None,
            offset: None,
            timestamp: None,
        });
        meta.dead = Some(DeadInfo {
            reason: DeadReason::Exhausted,
            at: Timestamp::from_millis(at_ms),
            consumer: "c".into(),
        });
        DeadLetter {
            id: id.to_string(),
            event,
            group: Some("billing".into()),
            native: Native::default(),
        }
    }

    #[test]
    fn volatile_parts_are_normalised() {
        assert_eq!(
            normalize("order 1234 not found for user 'ann' at 2026-12-07T02:10:33Z"),
            "order <n> not found for user <q> at <time>"
        );
        assert_eq!(
            normalize("request 3f2a9c1e-0b7d-4c55-9e0a-1d2b3c4d5e6f to 10.0.0.7:5432 failed"),
            "request <uuid> to <ip> failed"
        );
        assert_eq!(
            normalize("txn 0x1f9a and trace deadbeef42 timed out after 30.5s"),
            "txn <hex> and trace <hex> timed out after <n>s"
        );
        // Words that are only hex letters stay words.
        assert_eq!(normalize("cafe  face   added"), "cafe face added");
    }

    #[test]
    fn one_cause_is_one_fingerprint_and_the_fields_tell_causes_apart() {
        let a = Fingerprint::of(
            Some(FailureKind::Deferred),
            "order 12 not found",
            "orders",
            Some("billing"),
        );
        let b = Fingerprint::of(
            Some(FailureKind::Deferred),
            "order 98765 not found",
            "orders",
            Some("billing"),
        );
        assert_eq!(a, b);
        assert_eq!(a.as_str().len(), 12);
        for other in [
            Fingerprint::of(
                Some(FailureKind::Transient),
                "order 12 not found",
                "orders",
                Some("billing"),
            ),
            Fingerprint::of(
                Some(FailureKind::Deferred),
                "stock 12 not found",
                "orders",
                Some("billing"),
            ),
            Fingerprint::of(
                Some(FailureKind::Deferred),
                "order 12 not found",
                "payments",
                Some("billing"),
            ),
            Fingerprint::of(
                Some(FailureKind::Deferred),
                "order 12 not found",
                "orders",
                None,
            ),
        ] {
            assert_ne!(a, other);
        }
        // Fixed across processes and versions: FNV-1a, no randomised hasher. These literals are the
        // FNV-1a 64 of the fields (each followed by 0xff), shifted right by 16: if either changes,
        // every operator's saved `--group` stops matching.
        assert_eq!(Fingerprint::of(None, "", "", None).as_str(), "994f76653e2a");
    }

    #[test]
    fn entries_group_by_cause_largest_first_with_times_and_a_sample() {
        let hour = 3_600_000;
        let entries = [
            entry("e1", "order 1 not found", FailureKind::Deferred, 10 * hour),
            entry(
                "e2",
                "payment gateway 502",
                FailureKind::Transient,
                11 * hour,
            ),
            entry(
                "e3",
                "order 2 not found",
                FailureKind::Deferred,
                12 * hour + 5,
            ),
            entry("e4", "order 3 not found", FailureKind::Deferred, 11 * hour),
        ];
        let groups = failure_groups(&entries);
        assert_eq!(groups.len(), 2);
        let orders = &groups[0];
        assert_eq!(orders.count, 3);
        assert_eq!(orders.pattern, "order <n> not found");
        assert_eq!(orders.sample_id, "e3", "the latest entry");
        assert_eq!(orders.sample_error, "order 2 not found");
        assert_eq!(
            orders.first_dead_at(),
            Some(Timestamp::from_millis(10 * hour))
        );
        assert_eq!(
            orders.last_dead_at(),
            Some(Timestamp::from_millis(12 * hour + 5))
        );
        assert_eq!(
            (orders.topic.as_str(), orders.group.as_deref()),
            ("orders", Some("billing"))
        );
        assert_eq!(orders.fingerprint, entries[0].fingerprint());
        // One per hour from 10:00 to 12:00, in a chart of the 4 hours up to 12:30.
        assert_eq!(
            orders.per_hour(Timestamp::from_millis(12 * hour + hour / 2), 4),
            [0, 1, 1, 1]
        );
        assert_eq!(groups[1].count, 1);
        assert_eq!(groups[1].error_kind, Some(FailureKind::Transient));
    }
}
