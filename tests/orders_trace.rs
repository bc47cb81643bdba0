//! The orders example's `trace` mode exports one order's whole journey as one trace: this test runs the
//! example (built beforehand with `cargo build --example orders --features opentelemetry`; scripts/test
//! does) on the in-process broker and reads the spans it wrote back from the file — the publish under
//! the caller's span, four attempts under the publish (not replicated yet → retry, refused → dead,
//! then the same again after the replay), and the replay between them.

use std::path::PathBuf;
use std::process::Command;

/// One exported span, as the example writes it.
#[derive(Debug, serde::Deserialize)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    kind: String,
    error: bool,
    start_ns: String,
    attributes: std::collections::HashMap<String, String>,
}

impl Span {
    fn attribute(&self, key: &str) -> &str {
        self.attributes.get(key).map_or("", String::as_str)
    }

    fn start(&self) -> u128 {
        self.start_ns.parse().unwrap_or(0)
    }
}

/// The example binary the build left in the target folder.
fn example() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
        PathBuf::from,
    );
    target.join("debug").join("examples").join("orders")
}

#[test]
fn the_orders_example_exports_one_trace_from_publish_to_replay() {
    let exe = example();
    assert!(
        exe.exists(),
        "{} is missing: build it first with `cargo build --example orders --features opentelemetry`",
        exe.display()
    );
    let file = std::env::temp_dir().join(format!("orders-trace-{}.jsonl", std::process::id()));
    let out = Command::new(&exe)
        .args(["memory://orders-trace", "trace"])
        .arg(&file)
        .output()
        .expect("run the orders example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the example failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).expect("read the exported spans");
    let _ = std::fs::remove_file(&file);
    let spans: Vec<Span> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("a span per JSON line"))
        .collect();
    let all = || {
        spans
            .iter()
            .map(|s| {
                format!(
                    "{} {}←{} {:?}",
                    s.name, s.span_id, s.parent_span_id, s.attributes
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };

    let roots: Vec<&Span> = spans.iter().filter(|s| s.name == "checkout").collect();
    assert_eq!(roots.len(), 1, "want one checkout span:\n{}", all());
    let root = roots[0];
    assert!(
        stdout.contains(&format!("trace {}", root.trace_id)),
        "the example names another trace: {stdout}"
    );
    let in_trace: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace_id == root.trace_id)
        .collect();
    let named = |name: &str| -> Vec<&Span> {
        let mut found: Vec<&Span> = in_trace
            .iter()
            .copied()
            .filter(|s| s.name == name)
            .collect();
        found.sort_by_key(|s| s.start());
        found
    };

    let publishes = named("publish");
    assert_eq!(
        publishes.len(),
        1,
        "want one publish in the trace:\n{}",
        all()
    );
    let publish = publishes[0];
    assert_eq!(
        publish.parent_span_id, root.span_id,
        "publish under checkout"
    );
    assert_eq!(publish.kind, "Producer");
    assert_eq!(publish.attribute("messaging.destination.name"), "orders");

    let replays = named("replay");
    assert_eq!(replays.len(), 1, "want one replay in the trace:\n{}", all());
    assert_eq!(
        replays[0].parent_span_id, publish.span_id,
        "replay under publish"
    );

    let attempts = named("event");
    let got: Vec<(&str, &str, &str, bool)> = attempts
        .iter()
        .map(|a| {
            (
                a.attribute("outcome"),
                a.attribute("attempt"),
                a.attribute("replays"),
                a.error,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("retry", "1", "0", false),
            ("dead", "2", "0", true),
            ("retry", "1", "1", false),
            ("dead", "2", "1", true),
        ],
        "attempts (outcome, attempt, replays, error):\n{}",
        all()
    );
    for attempt in &attempts {
        assert_eq!(
            attempt.parent_span_id, publish.span_id,
            "every attempt under the publish"
        );
        assert_eq!(attempt.kind, "Consumer");
        assert_eq!(attempt.attribute("messaging.operation.type"), "process");
    }
    assert!(
        attempts[1].start() <= replays[0].start() && replays[0].start() <= attempts[2].start(),
        "the replay is not between the dead attempt and the next one:\n{}",
        all()
    );
}
