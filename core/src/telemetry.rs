//! Metric names and the points where the runtime records them.
//!
//! Metrics go through the `metrics` facade, so a service picks its exporter (Prometheus, StatsD, ...) and pays
//! nothing when it installs none. Every metric carries a `topic` label; dead letters also carry the `reason`
//! (a small fixed set, safe as a label). Retry lateness — how long after its due time a retry actually ran —
//! is a first-class metric: it is how an operator sees a delay mechanism that fires late.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use metrics::{Counter, Histogram, counter, histogram};

use crate::metadata::DeadReason;

/// Handler calls (counter).
pub const ATTEMPTS: &str = "event_retry_attempts_total";
/// Retries scheduled through the broker (counter).
pub const RETRIES_SCHEDULED: &str = "event_retry_retries_scheduled_total";
/// In-place retries (counter).
pub const IN_PLACE_RETRIES: &str = "event_retry_in_place_retries_total";
/// Events dead-lettered, by `reason` and `fingerprint` (their failure group,
/// [`crate::dlq::Fingerprint`]; at most [`FINGERPRINTS_PER_CONSUMER`] per consumer, the rest `other`)
/// (counter).
pub const DEAD_LETTERS: &str = "event_retry_dead_letters_total";
/// Events that succeeded after at least one failed attempt (counter).
pub const SUCCESS_AFTER_RETRY: &str = "event_retry_success_after_retry_total";
/// Blocking holds (counter); consumption is paused while one lasts.
pub const HOLDS: &str = "event_retry_holds_total";
/// Duplicate deliveries skipped through the idempotency store (counter).
pub const DUPLICATES_SKIPPED: &str = "event_retry_duplicates_skipped_total";
/// Settle operations (ack, retry copy, DLQ copy) the broker did not accept (counter).
pub const SETTLE_ERRORS: &str = "event_retry_settle_errors_total";
/// Actions the runtime did not take because the event lifecycle refused their transition (counter): a
/// bug in the runtime when not zero; the delivery was given back to the broker instead.
pub const LIFECYCLE_VIOLATIONS: &str = "event_retry_lifecycle_violations_total";
/// Handler latency in seconds (histogram).
pub const HANDLER_SECONDS: &str = "event_retry_handler_seconds";
/// Retry lateness in seconds: how long after its due time a retry ran (histogram).
pub const LATENESS_SECONDS: &str = "event_retry_lateness_seconds";

/// The `messaging.system` a transport is named by in the SDK's spans: the OpenTelemetry messaging
/// conventions' names (`aws_sqs` for SQS), the transport's own name otherwise.
pub fn messaging_system(transport: &'static str) -> &'static str {
    match transport {
        "sqs" => "aws_sqs",
        other => other,
    }
}

/// How many failure groups one consumer's dead-letter counter tells apart; the rest count as `other`
/// (a metric label's values must stay few).
pub const FINGERPRINTS_PER_CONSUMER: usize = 50;

/// The `fingerprint` of dead letters beyond [`FINGERPRINTS_PER_CONSUMER`].
const OTHER: &str = "other";

fn dead_letter_counter(topic: &str, reason: DeadReason, fingerprint: &str) -> Counter {
    counter!(
        DEAD_LETTERS,
        "topic" => topic.to_string(),
        "reason" => reason.as_str(),
        "fingerprint" => fingerprint.to_string()
    )
}

/// The metric handles of one consumer, registered once when it starts: the hot path then only
/// increments them, with no label to build or registry to search per event. Handles belong to the
/// recorder installed when they were registered, so a service installs its exporter before it starts its
/// consumers (as `event_retry::prometheus::serve` does when called first).
pub(crate) struct Telemetry {
    attempts: Counter,
    handler_seconds: Histogram,
    retries_scheduled: Counter,
    in_place_retries: Counter,
    topic: String,
    /// Per reason and fingerprint; `other` for each reason is registered at start (so each reason's
    /// series exists from the start) and takes what is beyond the cap.
    dead_letters: Mutex<HashMap<(DeadReason, String), Counter>>,
    success_after_retry: Counter,
    holds: Counter,
    duplicates_skipped: Counter,
    settle_errors: Counter,
    lifecycle_violations: Counter,
    lateness: Histogram,
}

impl Telemetry {
    /// The handles of the consumer of `topic`.
    pub(crate) fn new(topic: &str) -> Self {
        let topic = topic.to_string();
        let counter = |name: &'static str| counter!(name, "topic" => topic.clone());
        let histogram = |name: &'static str| histogram!(name, "topic" => topic.clone());
        Self {
            attempts: counter(ATTEMPTS),
            handler_seconds: histogram(HANDLER_SECONDS),
            retries_scheduled: counter(RETRIES_SCHEDULED),
            in_place_retries: counter(IN_PLACE_RETRIES),
            dead_letters: Mutex::new(
                DeadReason::ALL
                    .iter()
                    .map(|&reason| {
                        let counter = dead_letter_counter(&topic, reason, OTHER);
                        ((reason, OTHER.to_string()), counter)
                    })
                    .collect(),
            ),
            topic: topic.clone(),
            success_after_retry: counter(SUCCESS_AFTER_RETRY),
            holds: counter(HOLDS),
            duplicates_skipped: counter(DUPLICATES_SKIPPED),
            settle_errors: counter(SETTLE_ERRORS),
            lifecycle_violations: counter(LIFECYCLE_VIOLATIONS),
            lateness: histogram(LATENESS_SECONDS),
        }
    }

    pub(crate) fn attempt(&self, handler_time: Duration) {
        self.attempts.increment(1);
        self.handler_seconds.record(handler_time.as_secs_f64());
    }

    pub(crate) fn retry_scheduled(&self) {
        self.retries_scheduled.increment(1);
    }

    pub(crate) fn in_place_retry(&self) {
        self.in_place_retries.increment(1);
    }

    /// One event dead-lettered for `reason`, of the failure group `fingerprint`: counted under it while
    /// the consumer has seen fewer than [`FINGERPRINTS_PER_CONSUMER`] groups, under `other` after.
    pub(crate) fn dead_letter(&self, reason: DeadReason, fingerprint: &str) {
        let mut counters = self.dead_letters.lock().unwrap_or_else(|p| p.into_inner());
        let known = counters.contains_key(&(reason, fingerprint.to_string()));
        let groups = counters.len().saturating_sub(DeadReason::ALL.len());
        let label = if known || groups < FINGERPRINTS_PER_CONSUMER {
            fingerprint
        } else {
            OTHER
        };
        counters
            .entry((reason, label.to_string()))
            .or_insert_with(|| dead_letter_counter(&self.topic, reason, label))
            .increment(1);
    }

    pub(crate) fn success_after_retry(&self) {
        self.success_after_retry.increment(1);
    }

    pub(crate) fn hold(&self) {
        self.holds.increment(1);
    }

    pub(crate) fn duplicate_skipped(&self) {
        self.duplicates_skipped.increment(1);
    }

    pub(crate) fn settle_error(&self) {
        self.settle_errors.increment(1);
    }

    pub(crate) fn lifecycle_violation(&self) {
        self.lifecycle_violations.increment(1);
    }

    pub(crate) fn lateness(&self, late_by: Duration) {
        self.lateness.record(late_by.as_secs_f64());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    #[test]
    fn transports_are_named_as_the_messaging_conventions_name_them() {
        let names: Vec<&str> = ["kafka", "rabbitmq", "sqs", "pulsar", "memory"]
            .into_iter()
            .map(messaging_system)
            .collect();
        assert_eq!(names, ["kafka", "rabbitmq", "aws_sqs", "pulsar", "memory"]);
    }

    #[test]
    fn handles_count_under_the_topic_and_the_reason() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let t = Telemetry::new("orders");
            t.attempt(Duration::from_millis(3));
            t.dead_letter(DeadReason::Poison, "0123456789ab");
            t.dead_letter(DeadReason::Poison, "0123456789ab");
        });
        let counted: Vec<(String, Vec<String>, DebugValue)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                let labels = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (key.name().to_string(), labels, value)
            })
            .collect();
        let find = |name: &str, label: &str| {
            counted
                .iter()
                .find(|(n, l, _)| n == name && l.iter().any(|x| x == label))
                .map(|(_, _, v)| v)
        };
        assert_eq!(
            find(ATTEMPTS, "topic=orders"),
            Some(&DebugValue::Counter(1))
        );
        let find2 = |name: &str, a: &str, b: &str| {
            counted
                .iter()
                .find(|(n, l, _)| n == name && l.iter().any(|x| x == a) && l.iter().any(|x| x == b))
                .map(|(_, _, v)| v)
        };
        assert_eq!(
            find2(DEAD_LETTERS, "reason=poison", "fingerprint=0123456789ab"),
            Some(&DebugValue::Counter(2))
        );
        assert_eq!(
            find2(DEAD_LETTERS, "reason=exhausted", "fingerprint=other"),
            Some(&DebugValue::Counter(0))
        );
    }

    #[test]
    fn fingerprints_beyond_the_cap_count_as_other() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let t = Telemetry::new("orders");
            for i in 0..FINGERPRINTS_PER_CONSUMER + 5 {
                t.dead_letter(DeadReason::Exhausted, &format!("{i:012x}"));
            }
            // A group seen before the cap keeps its own series.
            t.dead_letter(DeadReason::Exhausted, &format!("{:012x}", 0));
        });
        let series: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == DEAD_LETTERS)
            .filter_map(|(key, _, _, value)| {
                let labels: Vec<_> = key.key().labels().collect();
                let reason = labels.iter().find(|l| l.key() == "reason")?.value();
                let fingerprint = labels.iter().find(|l| l.key() == "fingerprint")?.value();
                let DebugValue::Counter(n) = value else {
                    return None;
                };
                (reason == "exhausted").then(|| (fingerprint.to_string(), n))
            })
            .collect();
        // The cap's groups, and other (registered at start) with the 5 beyond it.
        assert_eq!(series.len(), FINGERPRINTS_PER_CONSUMER + 1, "{series:?}");
        assert!(series.contains(&("other".to_string(), 5)), "{series:?}");
        assert!(series.contains(&(format!("{:012x}", 0), 2)), "{series:?}");
    }
}
