//! The metadata's data: what the SDK records about an event (its id, attempts, origin, last error,
//! death), and the error a header that does not parse becomes.
//!
//! Separate from the codec because the runtime, the DLQ tools and the adapters work with these values
//! without caring how they are written to headers.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::MAX_ERROR_BYTES;
use crate::classify::FailureKind;
use crate::time::Timestamp;

/// Where an event was first consumed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Origin {
    /// Topic or queue name (shared: a consumer's deliveries all name the same one).
    pub topic: Arc<str>,
    /// Partition, where the broker has partitions.
    pub partition: Option<i32>,
    /// Offset, where the broker has offsets.
    pub offset: Option<i64>,
    /// The record's own timestamp, where the broker stamps records (Kafka).
    pub timestamp: Option<OriginTimestamp>,
}

impl Origin {
    /// An origin in `topic`.
    pub fn new(topic: impl Into<Arc<str>>) -> Self {
        Self {
            topic: topic.into(),
            ..Self::default()
        }
    }

    /// At `offset` of `partition`.
    pub fn at(mut self, partition: i32, offset: i64) -> Self {
        self.partition = Some(partition);
        self.offset = Some(offset);
        self
    }

    /// With the record's own timestamp.
    pub fn with_timestamp(mut self, timestamp: OriginTimestamp) -> Self {
        self.timestamp = Some(timestamp);
        self
    }
}

/// A record's own timestamp, and who set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OriginTimestamp {
    /// The time.
    pub at: Timestamp,
    /// Who set it.
    pub kind: TimestampKind,
}

/// Who set a record's timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimestampKind {
    /// The producer, when it created the record.
    CreateTime,
    /// The broker, when it appended the record to its log.
    LogAppendTime,
}

impl TimestampKind {
    /// The stable name in metadata: `create-time` or `log-append-time`.
    pub fn as_str(self) -> &'static str {
        match self {
            TimestampKind::CreateTime => "create-time",
            TimestampKind::LogAppendTime => "log-append-time",
        }
    }
}

impl FromStr for TimestampKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "create-time" => Ok(TimestampKind::CreateTime),
            "log-append-time" => Ok(TimestampKind::LogAppendTime),
            // A forged header may hold kilobytes: the reason quotes its start only.
            other => Err(format!(
                "unknown timestamp type {:?}",
                truncate_utf8(other, 64)
            )),
        }
    }
}

/// Why an event was dead-lettered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeadReason {
    /// The handler's error was non-retryable.
    NonRetryable,
    /// The retry policy was spent.
    Exhausted,
    /// The policy's total time budget (`max-elapsed`) ran out.
    BudgetElapsed,
    /// The message could not be decoded (malformed metadata or payload).
    Poison,
    /// It was parked behind an event of the same key that was dead-lettered.
    ParkedBehindDead,
}

impl DeadReason {
    /// Every reason, in a stable order.
    pub const ALL: [DeadReason; 5] = [
        DeadReason::NonRetryable,
        DeadReason::Exhausted,
        DeadReason::BudgetElapsed,
        DeadReason::Poison,
        DeadReason::ParkedBehindDead,
    ];

    /// The stable name used in metadata and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::NonRetryable => "non_retryable",
            DeadReason::Exhausted => "exhausted",
            DeadReason::BudgetElapsed => "budget_elapsed",
            DeadReason::Poison => "poison",
            DeadReason::ParkedBehindDead => "parked_behind_dead",
        }
    }
}

impl fmt::Display for DeadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeadReason {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeadReason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown dead-letter reason {:?}", truncate_utf8(s, 64)))
    }
}

/// What a DLQ entry records about its death.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadInfo {
    /// Why.
    pub reason: DeadReason,
    /// When.
    pub at: Timestamp,
    /// Which consumer (its configured name).
    pub consumer: String,
}

/// The SDK's bookkeeping for one event; travels with it on every hop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetryMetadata {
    /// Event id (the producer's, or the broker's message id when the producer set none); shared, so
    /// every copy of the event and every handler context carries it without an allocation of its own.
    pub event_id: Option<Arc<str>>,
    /// Handler calls that failed so far.
    pub attempts: u32,
    /// Retries scheduled through the broker so far (the policy's position).
    pub retries: u32,
    /// When the SDK first saw the event.
    pub first_seen: Option<Timestamp>,
    /// When the current delivery was due (set when a retry is scheduled).
    pub due_at: Option<Timestamp>,
    /// Where the event was first consumed.
    pub origin: Option<Origin>,
    /// The last handler error, at most [`MAX_ERROR_BYTES`].
    pub last_error: Option<String>,
    /// The kind of the last handler error.
    pub error_kind: Option<FailureKind>,
    /// The last delay applied.
    pub last_delay: Option<Duration>,
    /// How many times an operator replayed the event.
    pub replay_count: u32,
    /// When an operator last replayed it; a policy's `max-elapsed` budget counts from here, the history
    /// (`first_seen`) stays.
    pub replayed_at: Option<Timestamp>,
    /// The event id this event is parked behind (per-key ordering).
    pub parked_behind: Option<String>,
    /// Set on DLQ entries.
    pub dead: Option<DeadInfo>,
    /// On a DLQ entry moved from another broker, the entry it was copied from
    /// (`<transport>:<source topic>:<entry id>`): a migration run again finds what it already copied.
    pub migrated_from: Option<String>,
}

impl RetryMetadata {
    /// Records the last error, cut to [`MAX_ERROR_BYTES`] at a character boundary.
    pub fn set_last_error(&mut self, message: &str) {
        self.last_error = Some(truncate_utf8(message, MAX_ERROR_BYTES).to_string());
    }

    /// Resets the retry history for an operator replay at `now`: attempts and policy position restart,
    /// the replay count goes up and the time budget starts again from `now` (`replayed_at`); the event
    /// id, first-seen time and origin stay.
    pub fn reset_for_replay(&mut self, now: Timestamp) {
        self.replayed_at = Some(now);
        self.attempts = 0;
        self.retries = 0;
        self.due_at = None;
        self.last_delay = None;
        self.parked_behind = None;
        self.dead = None;
        self.migrated_from = None;
        self.replay_count = self.replay_count.saturating_add(1);
    }
}

/// Metadata that could not be decoded: the event is poison.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("metadata header {header} {problem}")]
pub struct MetadataError {
    /// The offending header's name.
    pub header: String,
    /// What is wrong with it.
    pub problem: String,
}

/// Cuts `s` to at most `max` bytes without splitting a character.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn last_error_is_bounded_at_a_char_boundary() {
        let mut m = RetryMetadata::default();
        m.set_last_error(&"é".repeat(2_000));
        let e = m.last_error.unwrap();
        assert!(e.len() <= MAX_ERROR_BYTES);
        assert_eq!(e.chars().count(), MAX_ERROR_BYTES / 2);
    }
}
