//! Dead letter queue operations: list, show, replay, purge — the same on every broker.
//!
//! An SRE triaging at night should not need to know how a broker stores dead letters. Each transport
//! implements [`DeadLetterQueue`]; entries are addressed by the *source* topic they were consumed from and
//! an entry id the transport chooses (an offset, a message id). Replay sends the event back to its origin
//! with the payload, key and producer headers unedited, attempts restarted and the replay count raised, and
//! removes (or marks) the entry only after the broker confirmed the replayed copy.

use async_trait::async_trait;
use bytes::Bytes;

use crate::classify::ErrorKind;
use crate::event::Event;
use crate::time::Timestamp;
use crate::transport::TransportError;

/// One dead letter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The transport's id for the entry (stable until the entry is removed).
    pub id: String,
    /// The event, with its dead-letter metadata (`event.meta.dead`).
    pub event: Event,
}

impl DeadLetter {
    /// What a replay sends back, and where: the event with its payload, key and headers unedited, its
    /// attempts restarted and its replay count raised ([`crate::metadata::RetryMetadata::reset_for_replay`]),
    /// and the topic it was dead-lettered from (`source_topic` when its metadata names none).
    pub fn for_replay(&self, source_topic: &str) -> (Event, String) {
        let mut event = self.event.clone();
        event.meta.reset_for_replay();
        let origin = event
            .meta
            .origin
            .as_ref()
            .map_or(source_topic, |o| o.topic.as_str())
            .to_string();
        (event, origin)
    }
}

/// Which dead letters an operation applies to; an empty filter selects all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DlqFilter {
    /// Only these entry ids.
    pub ids: Option<Vec<String>>,
    /// Only entries whose last error was of this kind.
    pub error_kind: Option<ErrorKind>,
    /// Only entries with this key.
    pub key: Option<Bytes>,
    /// Only entries dead-lettered at or after this time.
    pub since: Option<Timestamp>,
    /// Only entries dead-lettered before this time.
    pub until: Option<Timestamp>,
    /// At most this many entries.
    pub limit: Option<usize>,
}

impl DlqFilter {
    /// Selects every entry.
    pub fn all() -> Self {
        Self::default()
    }

    /// Selects one entry by id.
    pub fn id(id: impl Into<String>) -> Self {
        Self {
            ids: Some(vec![id.into()]),
            ..Self::default()
        }
    }

    /// Whether `entry` passes the filter (ignoring `limit`).
    pub fn matches(&self, entry: &DeadLetter) -> bool {
        let meta = &entry.event.meta;
        let dead_at = meta.dead.as_ref().map(|d| d.at);
        self.ids.as_ref().is_none_or(|ids| ids.contains(&entry.id))
            && self.error_kind.is_none_or(|k| meta.error_kind == Some(k))
            && self
                .key
                .as_ref()
                .is_none_or(|k| entry.event.key.as_ref() == Some(k))
            && self.since.is_none_or(|t| dead_at.is_some_and(|d| d >= t))
            && self.until.is_none_or(|t| dead_at.is_some_and(|d| d < t))
    }
}

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Entries sent back to their origin (and removed or marked in the DLQ).
    pub replayed: usize,
    /// Ids of the entries replayed, in order.
    pub ids: Vec<String>,
}

/// The operator view of a transport's dead letter queues.
#[async_trait]
pub trait DeadLetterQueue: Send + Sync {
    /// Entries dead-lettered from `source_topic`, oldest first.
    async fn list(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<Vec<DeadLetter>, TransportError>;

    /// One entry with all its metadata (by default, [`DeadLetterQueue::list`] filtered by its id).
    async fn show(
        &self,
        source_topic: &str,
        id: &str,
    ) -> Result<Option<DeadLetter>, TransportError> {
        Ok(self.list(source_topic, &DlqFilter::id(id)).await?.pop())
    }

    /// Sends the selected entries back to their origin (payload unedited, attempts restarted, replay count
    /// raised) and removes or marks each only after its copy was confirmed.
    async fn replay(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<ReplayReport, TransportError>;

    /// Removes (or marks as purged) the selected entries; returns how many.
    async fn purge(&self, source_topic: &str, filter: &DlqFilter) -> Result<usize, TransportError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{DeadInfo, DeadReason};

    fn entry(id: &str, kind: ErrorKind, at: u64) -> DeadLetter {
        let mut event = Event::new("p").with_key("k1");
        event.meta.error_kind = Some(kind);
        event.meta.dead = Some(DeadInfo {
            reason: DeadReason::Exhausted,
            at: Timestamp::from_millis(at),
            consumer: "c".into(),
        });
        DeadLetter {
            id: id.into(),
            event,
        }
    }

    #[test]
    fn filters_combine() {
        let e = entry("7", ErrorKind::Deferred, 1_000);
        assert!(DlqFilter::all().matches(&e));
        assert!(DlqFilter::id("7").matches(&e));
        assert!(!DlqFilter::id("8").matches(&e));
        let by_kind = DlqFilter {
            error_kind: Some(ErrorKind::NonRetryable),
            ..DlqFilter::all()
        };
        assert!(!by_kind.matches(&e));
        let by_key = DlqFilter {
            key: Some(Bytes::from_static(b"k1")),
            ..DlqFilter::all()
        };
        assert!(by_key.matches(&e));
        let window = DlqFilter {
            since: Some(Timestamp::from_millis(500)),
            until: Some(Timestamp::from_millis(1_000)),
            ..DlqFilter::all()
        };
        assert!(!window.matches(&e), "until is exclusive");
    }
}
