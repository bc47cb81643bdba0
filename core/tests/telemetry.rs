//! The runtime records its metrics through the `metrics` facade: attempts, retries scheduled, dead letters
//! by reason and failure group, success after retry, handler latency and retry lateness.

use std::time::Duration;

use event_retry_core::prelude::*;
use event_retry_core::telemetry;
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

type Sample = (
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
);

/// The sum of a counter, or the number of samples of a histogram, over the series matching `label`.
fn counter(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> u64 {
    samples
        .iter()
        .filter(|(key, ..)| key.key().name() == name)
        .filter(|(key, ..)| {
            label.is_none_or(|(k, v)| key.key().labels().any(|l| l.key() == k && l.value() == v))
        })
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(n) => *n,
            DebugValue::Histogram(samples) => samples.len() as u64,
            DebugValue::Gauge(_) => 0,
        })
        .sum()
}

#[test]
fn the_runtime_records_its_metrics() -> Result<(), Box<dyn std::error::Error>> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let groups = runtime.block_on(async {
        let broker = Broker::memory();
        let handle = broker
            .consumer("metrics")
            .policy(RetryPolicy::parse("20ms x2")?)
            .start(handler_fn(|event: Event, ctx: Context| async move {
                match (event.payload.as_ref(), ctx.attempt) {
                    (b"flaky", 1) => Err(HandlerError::deferred("not yet")),
                    (b"bad", _) => Err(HandlerError::non_retryable("malformed")),
                    _ => Ok(()),
                }
            }))
            .await?;
        let producer = broker.producer();
        producer.publish("metrics", Event::new("flaky")).await?;
        producer.publish("metrics", Event::new("bad")).await?;
        tokio::time::timeout(
            Duration::from_secs(5),
            handle.wait_until(|s| s.succeeded == 1 && s.dead_lettered == 1),
        )
        .await?;
        handle.shutdown().await?;
        // The failure group the DLQ shows for the dead letter: the metric must name the same one.
        let groups = broker
            .dead_letters()
            .groups("metrics", &DlqFilter::all())
            .await?;
        Ok::<_, Box<dyn std::error::Error>>(groups)
    })?;
    let [group] = groups.as_slice() else {
        return Err(format!("{} failure groups, want 1", groups.len()).into());
    };

    // One snapshot: taking it drains histograms.
    let snapshot = snapshotter.snapshot().into_vec();
    let topic = Some(("topic", "metrics"));
    assert_eq!(
        counter(
            &snapshot,
            telemetry::DEAD_LETTERS,
            Some(("fingerprint", group.fingerprint.as_str()))
        ),
        1,
        "the dead letter is counted under the fingerprint the DLQ shows ({})",
        group.fingerprint
    );
    assert_eq!(counter(&snapshot, telemetry::ATTEMPTS, topic), 3);
    assert_eq!(counter(&snapshot, telemetry::RETRIES_SCHEDULED, topic), 1);
    assert_eq!(counter(&snapshot, telemetry::SUCCESS_AFTER_RETRY, topic), 1);
    assert_eq!(
        counter(
            &snapshot,
            telemetry::DEAD_LETTERS,
            Some(("reason", "non_retryable"))
        ),
        1
    );
    assert_eq!(
        counter(
            &snapshot,
            telemetry::DEAD_LETTERS,
            Some(("reason", "exhausted"))
        ),
        0
    );
    assert_eq!(
        counter(&snapshot, telemetry::HANDLER_SECONDS, topic),
        3,
        "one latency sample per call"
    );
    assert_eq!(
        counter(&snapshot, telemetry::LATENESS_SECONDS, topic),
        1,
        "one lateness sample per retry"
    );
    Ok(())
}
