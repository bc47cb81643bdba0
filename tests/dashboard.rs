//! The Grafana dashboard (`docs/grafana/event-retry.json`) queries only metrics the SDK exports, with
//! the labels it groups by, and shows every metric the SDK has: a consumer on the in-memory broker runs
//! every path that records one (success, an in-place retry, a retry through the broker, a dead letter,
//! a blocking hold, a duplicate, an unwritable DLQ) under the Prometheus exporter of
//! `event_retry::prometheus`, and the test reads the exporter's own output.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use event_retry::prelude::*;
use event_retry_core::adapter::Transport;
use event_retry_core::memory::MemoryTransport;
use event_retry_core::telemetry;

/// Every `event_retry_*` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("event_retry_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The label names inside every `by (...)` of `expr`.
fn grouped_by(expr: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    for part in expr.split("by (").skip(1) {
        if let Some(list) = part.split(')').next() {
            labels.extend(list.split(',').map(|l| l.trim().to_string()));
        }
    }
    labels
}

/// Every query of the dashboard: panel targets and template variables.
fn queries(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            out.push(target["expr"].as_str().expect("expr").to_string());
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if var["type"] == "query" {
            out.push(var["query"].as_str().expect("query").to_string());
        }
    }
    out
}

/// Runs every path that records a metric on one topic.
async fn exercise_every_path() {
    let memory = MemoryTransport::new();
    let broker = Broker::from(Arc::new(memory.clone()) as Arc<dyn Transport>);
    let handle = broker
        .consumer("dashboard")
        .policy(RetryPolicy::parse("20ms x1").expect("policy"))
        .in_place(RetryPolicy::parse("5ms x1").expect("policy"))
        .blocking(RetryPolicy::parse("20ms x5").expect("policy"))
        .idempotency(InMemoryIdempotencyStore::new(Duration::from_secs(60)))
        .start(handler_fn(move |event: Event, ctx: Context| async move {
            let id = event.id().unwrap_or_default().to_string();
            match (id.as_str(), ctx.attempt) {
                ("deferred", 1) => Err(HandlerError::deferred("stock not replicated yet")),
                ("transient", 1) => Err(HandlerError::transient("connection reset")),
                ("blocking", 1) => Err(HandlerError::blocking("database down")),
                ("dead" | "unwritable", _) => Err(HandlerError::non_retryable("bad order")),
                _ => Ok(()),
            }
        }))
        .await
        .expect("consumer");
    let producer = broker.producer();
    for id in ["ok", "deferred", "transient", "blocking", "dead"] {
        producer
            .publish("dashboard", Event::new("{}").with_id(id))
            .await
            .expect("publish");
    }
    let settled = handle.wait_until(|s| s.succeeded + s.dead_lettered >= 5);
    tokio::time::timeout(Duration::from_secs(10), settled)
        .await
        .expect("every path ran");
    // The same event again, once it was handled: skipped as a duplicate.
    producer
        .publish("dashboard", Event::new("{}").with_id("ok"))
        .await
        .expect("publish");
    tokio::time::timeout(
        Duration::from_secs(10),
        handle.wait_until(|s| s.duplicates_skipped >= 1),
    )
    .await
    .expect("a duplicate");
    // A DLQ that refuses the write: a settle error (the event stays unsettled until it heals).
    memory.set_dlq_writable("dashboard", false);
    producer
        .publish("dashboard", Event::new("{}").with_id("unwritable"))
        .await
        .expect("publish");
    tokio::time::timeout(
        Duration::from_secs(10),
        handle.wait_until(|s| s.settle_errors >= 1),
    )
    .await
    .expect("a settle error");
    memory.set_dlq_writable("dashboard", true);
    tokio::time::timeout(
        Duration::from_secs(10),
        handle.wait_until(|s| s.dead_lettered >= 2),
    )
    .await
    .expect("the DLQ healed");
    handle.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn the_dashboard_queries_only_what_the_exporter_serves() {
    let exporter = event_retry::prometheus::builder()
        .install_recorder()
        .expect("the only recorder of this test binary");
    exercise_every_path().await;
    let served = exporter.render();

    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/grafana/event-retry.json"
    ))
    .expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let queries = queries(&dashboard);
    assert!(queries.len() >= 10, "{queries:?}");
    let mut queried = BTreeSet::new();
    for expr in &queries {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "a query of no SDK metric: {expr}");
        for name in &names {
            let series: Vec<&str> = served
                .lines()
                .filter(|l| {
                    l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))
                })
                .collect();
            assert!(
                !series.is_empty(),
                "{name} (in {expr}) is not exported:\n{served}"
            );
            for label in grouped_by(expr) {
                assert!(
                    series.iter().all(|s| s.contains(&format!("{label}=\""))),
                    "{name} has no label {label} (in {expr}): {series:?}"
                );
            }
            queried.insert(name.trim_end_matches("_bucket").to_string());
        }
    }
    let every = [
        telemetry::ATTEMPTS,
        telemetry::RETRIES_SCHEDULED,
        telemetry::IN_PLACE_RETRIES,
        telemetry::DEAD_LETTERS,
        telemetry::SUCCESS_AFTER_RETRY,
        telemetry::HOLDS,
        telemetry::DUPLICATES_SKIPPED,
        telemetry::SETTLE_ERRORS,
        telemetry::LIFECYCLE_VIOLATIONS,
        telemetry::HANDLER_SECONDS,
        telemetry::LATENESS_SECONDS,
    ];
    for metric in every {
        assert!(
            queried.contains(metric),
            "the dashboard does not show {metric}"
        );
    }
    // Lateness and handler time are histograms (their quantiles add up across consumers).
    assert!(
        served.contains("event_retry_lateness_seconds_bucket{"),
        "{served}"
    );
}

#[test]
fn names_and_groupings_are_read_from_queries() {
    let expr = "histogram_quantile(0.99, sum by (le, topic) (rate(event_retry_lateness_seconds_bucket{topic=~\"$topic\"}[5m])))";
    assert_eq!(
        metric_names(expr).into_iter().collect::<Vec<_>>(),
        ["event_retry_lateness_seconds_bucket"]
    );
    assert_eq!(
        grouped_by(expr).into_iter().collect::<Vec<_>>(),
        ["le", "topic"]
    );
}
