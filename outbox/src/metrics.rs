//! The outbox's metrics, through the `metrics` facade (any exporter the service installs).
//!
//! | name | type | labels |
//! |---|---|---|
//! | `event_retry_outbox_pending` | gauge | rows `PENDING` or `CLAIMED` |
//! | `event_retry_outbox_oldest_pending_age_seconds` | gauge | age of the oldest waiting row |
//! | `event_retry_outbox_dead` | gauge | rows `DEAD` |
//! | `event_retry_outbox_published_total` | counter | `topic` |
//! | `event_retry_outbox_failed_attempts_total` | counter | `topic`, `failure` (`broker_down`, `retry`, `permanent`) |
//! | `event_retry_outbox_dead_total` | counter | `topic` |
//! | `event_retry_outbox_commit_to_publish_seconds` | histogram | `topic`: enqueue to broker confirmation |
//! | `event_retry_inbox_rows` | gauge | `consumer`, `state` (`done`, `in_progress`): the inbox's size |
//! | `event_retry_inbox_purged_total` | counter | `consumer`: inbox rows forgotten after the retention |
//!
//! The outbox gauges are refreshed by each relay every 5 s from one `GROUP BY state` query; the inbox's
//! by its purge, every minute unless told.

use std::time::Duration;

use ::metrics::{counter, gauge, histogram};
use event_retry_core::time::Timestamp;

use crate::store::Counts;

/// Rows waiting to be published.
pub const PENDING: &str = "event_retry_outbox_pending";
/// Age of the oldest waiting row, in seconds.
pub const OLDEST_PENDING_AGE: &str = "event_retry_outbox_oldest_pending_age_seconds";
/// Rows `DEAD`.
pub const DEAD: &str = "event_retry_outbox_dead";
/// Rows published.
pub const PUBLISHED_TOTAL: &str = "event_retry_outbox_published_total";
/// Failed publish attempts.
pub const FAILED_ATTEMPTS_TOTAL: &str = "event_retry_outbox_failed_attempts_total";
/// Rows moved to `DEAD`.
pub const DEAD_TOTAL: &str = "event_retry_outbox_dead_total";
/// Enqueue to broker confirmation.
pub const COMMIT_TO_PUBLISH: &str = "event_retry_outbox_commit_to_publish_seconds";

/// Inbox rows, by state.
pub const INBOX_ROWS: &str = "event_retry_inbox_rows";
/// Inbox rows purged after the retention.
pub const INBOX_PURGED_TOTAL: &str = "event_retry_inbox_purged_total";

/// Sets a consumer's inbox gauges: `done` ids whose effects committed, `in_progress` ids a delivery
/// holds.
pub(crate) fn inbox_gauges(consumer: &str, done: u64, in_progress: u64) {
    let consumer = consumer.to_string();
    gauge!(INBOX_ROWS, "consumer" => consumer.clone(), "state" => "done").set(done as f64);
    gauge!(INBOX_ROWS, "consumer" => consumer, "state" => "in_progress").set(in_progress as f64);
}

pub(crate) fn inbox_purged(consumer: &str, rows: u64) {
    counter!(INBOX_PURGED_TOTAL, "consumer" => consumer.to_string()).increment(rows);
}

pub(crate) fn gauges(counts: &Counts, now: Timestamp) {
    gauge!(PENDING).set(counts.pending as f64);
    gauge!(DEAD).set(counts.dead as f64);
    let age = counts
        .oldest_pending
        .map_or(Duration::ZERO, |oldest| now.since(oldest));
    gauge!(OLDEST_PENDING_AGE).set(age.as_secs_f64());
}

pub(crate) fn published(topic: &str, latency: Duration) {
    counter!(PUBLISHED_TOTAL, "topic" => topic.to_string()).increment(1);
    histogram!(COMMIT_TO_PUBLISH, "topic" => topic.to_string()).record(latency.as_secs_f64());
}

pub(crate) fn failed_attempt(topic: &str, failure: &'static str) {
    counter!(FAILED_ATTEMPTS_TOTAL, "topic" => topic.to_string(), "failure" => failure)
        .increment(1);
}

pub(crate) fn dead(topic: &str) {
    counter!(DEAD_TOTAL, "topic" => topic.to_string()).increment(1);
}
