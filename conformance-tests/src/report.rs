//! The Markdown report: scenario × adapter, pass / fail / skip with the reason, lateness figures.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;

/// One cell of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cell {
    /// Passed, with an optional note (lateness figures).
    Pass(Option<String>),
    /// Failed, with the failure.
    Fail(String),
    /// Skipped, with the reason.
    Skip(String),
}

/// Results gathered while the trials run.
#[derive(Default)]
pub struct Report {
    scenarios: Mutex<BTreeMap<u8, &'static str>>,
    cells: Mutex<BTreeMap<(u8, String), Cell>>,
}

fn escape(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

impl Report {
    /// Records one result.
    pub fn record(&self, number: u8, scenario: &'static str, adapter: &str, cell: Cell) {
        self.scenarios
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(number, scenario);
        self.cells
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((number, adapter.to_string()), cell);
    }

    /// The table, adapters in the given order.
    pub fn to_markdown(&self, adapters: &[&str]) -> String {
        let scenarios = self.scenarios.lock().unwrap_or_else(|p| p.into_inner());
        let cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::from("# Conformance report\n\n| # | scenario |");
        for a in adapters {
            let _ = write!(out, " {a} |");
        }
        out.push_str("\n|---|---|");
        out.push_str(&"---|".repeat(adapters.len()));
        out.push('\n');
        let mut totals = vec![(0, 0, 0); adapters.len()];
        for (number, name) in scenarios.iter() {
            let _ = write!(out, "| {number} | {name} |");
            for (i, a) in adapters.iter().enumerate() {
                let text = match cells.get(&(*number, (*a).to_string())) {
                    Some(Cell::Pass(None)) => {
                        totals[i].0 += 1;
                        "pass".to_string()
                    }
                    Some(Cell::Pass(Some(note))) => {
                        totals[i].0 += 1;
                        format!("pass ({})", escape(note))
                    }
                    Some(Cell::Fail(why)) => {
                        totals[i].1 += 1;
                        format!("**FAIL**: {}", escape(why))
                    }
                    Some(Cell::Skip(why)) => {
                        totals[i].2 += 1;
                        format!("skip: {}", escape(why))
                    }
                    None => "not run".to_string(),
                };
                let _ = write!(out, " {text} |");
            }
            out.push('\n');
        }
        out.push_str("| | **total** |");
        for (pass, fail, skip) in totals {
            let _ = write!(out, " {pass} pass, {fail} fail, {skip} skip |");
        }
        out.push('\n');
        out
    }

    /// Where the report is written: `RETRY_TEST_REPORT`, else `target/conformance/report.md`.
    pub fn path() -> PathBuf {
        if let Some(p) = std::env::var_os("RETRY_TEST_REPORT") {
            return PathBuf::from(p);
        }
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
        target.join("conformance").join("report.md")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_counts_each_kind() {
        let r = Report::default();
        r.record(1, "one", "memory", Cell::Pass(None));
        r.record(2, "two", "memory", Cell::Pass(Some("p99 3 ms".into())));
        r.record(
            1,
            "one",
            "kafka",
            Cell::Skip("RETRY_TEST_KAFKA not set".into()),
        );
        r.record(2, "two", "kafka", Cell::Fail("a|b".into()));
        let md = r.to_markdown(&["memory", "kafka"]);
        assert!(
            md.contains("| 2 | two | pass (p99 3 ms) | **FAIL**: a\\|b |"),
            "{md}"
        );
        assert!(
            md.contains("2 pass, 0 fail, 0 skip | 0 pass, 1 fail, 1 skip |"),
            "{md}"
        );
    }
}
