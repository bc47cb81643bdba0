//! Metric names and the points where the runtime records them.
//!
//! Metrics go through the `metrics` facade, so a service picks its exporter (Prometheus, StatsD, ...) and pays
//! nothing when it installs none. Every metric carries a `topic` label; dead letters also carry the `reason`
//! (a small fixed set, safe as a label). Retry lateness — how long after its due time a retry actually ran —
//! is a first-class metric: it is how an operator sees a delay mechanism that fires late.

use std::time::Duration;

use metrics::{counter, histogram};

use crate::metadata::DeadReason;

/// Handler calls (counter).
pub const ATTEMPTS: &str = "event_retry_attempts_total";
/// Retries scheduled through the broker (counter).
pub const RETRIES_SCHEDULED: &str = "event_retry_retries_scheduled_total";
/// In-place retries (counter).
pub const IN_PLACE_RETRIES: &str = "event_retry_in_place_retries_total";
/// Events dead-lettered, by `reason` (counter).
pub const DEAD_LETTERS: &str = "event_retry_dead_letters_total";
/// Events that succeeded after at least one failed attempt (counter).
pub const SUCCESS_AFTER_RETRY: &str = "event_retry_success_after_retry_total";
/// Blocking holds (counter); consumption is paused while one lasts.
pub const HOLDS: &str = "event_retry_holds_total";
/// Duplicate deliveries skipped through the idempotency store (counter).
pub const DUPLICATES_SKIPPED: &str = "event_retry_duplicates_skipped_total";
/// Settle operations (ack, retry copy, DLQ copy) the broker did not accept (counter).
pub const SETTLE_ERRORS: &str = "event_retry_settle_errors_total";
/// Handler latency in seconds (histogram).
pub const HANDLER_SECONDS: &str = "event_retry_handler_seconds";
/// Retry lateness in seconds: how long after its due time a retry ran (histogram).
pub const LATENESS_SECONDS: &str = "event_retry_lateness_seconds";

pub(crate) fn attempt(topic: &str, handler_time: Duration) {
    counter!(ATTEMPTS, "topic" => topic.to_string()).increment(1);
    histogram!(HANDLER_SECONDS, "topic" => topic.to_string()).record(handler_time.as_secs_f64());
}

pub(crate) fn retry_scheduled(topic: &str) {
    counter!(RETRIES_SCHEDULED, "topic" => topic.to_string()).increment(1);
}

pub(crate) fn in_place_retry(topic: &str) {
    counter!(IN_PLACE_RETRIES, "topic" => topic.to_string()).increment(1);
}

pub(crate) fn dead_letter(topic: &str, reason: DeadReason) {
    counter!(DEAD_LETTERS, "topic" => topic.to_string(), "reason" => reason.as_str()).increment(1);
}

pub(crate) fn success_after_retry(topic: &str) {
    counter!(SUCCESS_AFTER_RETRY, "topic" => topic.to_string()).increment(1);
}

pub(crate) fn hold(topic: &str) {
    counter!(HOLDS, "topic" => topic.to_string()).increment(1);
}

pub(crate) fn duplicate_skipped(topic: &str) {
    counter!(DUPLICATES_SKIPPED, "topic" => topic.to_string()).increment(1);
}

pub(crate) fn settle_error(topic: &str) {
    counter!(SETTLE_ERRORS, "topic" => topic.to_string()).increment(1);
}

pub(crate) fn lateness(topic: &str, late_by: Duration) {
    histogram!(LATENESS_SECONDS, "topic" => topic.to_string()).record(late_by.as_secs_f64());
}
