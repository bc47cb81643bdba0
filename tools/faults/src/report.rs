//! The rows of a fault run and `target/faults/report.md`.
//!
//! Each run saves its row as JSON (`rows/<broker>-<fault>.json`), so one cell can be run again without the
//! rest; the report is written from whatever rows are on disk.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One broker × fault.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Row {
    /// The broker.
    pub(crate) broker: String,
    /// `F1` … `F6` and what it does.
    pub(crate) fault: String,
    /// Events the broker confirmed.
    pub(crate) produced: usize,
    /// Events that ended where their fate sends them: succeeded, or (non-retryable) in the DLQ.
    pub(crate) handled: usize,
    /// Events that ended nowhere.
    pub(crate) lost: usize,
    /// Events that should have succeeded but are in the DLQ.
    #[serde(default)]
    pub(crate) misrouted: usize,
    /// Handler calls beyond each event's expected number, plus DLQ entries beyond one per event.
    pub(crate) duplicates: usize,
    /// Events whose fate is the DLQ.
    pub(crate) dlq_expected: usize,
    /// Distinct events the DLQ holds, read with the broker's own client.
    pub(crate) dlq_actual: usize,
    /// DLQ entries beyond one per event (a redelivered event dead-lettered again).
    #[serde(default)]
    pub(crate) dlq_copies: usize,
    /// The consumer kept running through the fault without a restart (`None` where the fault is the
    /// consumer's death).
    pub(crate) survived: Option<bool>,
    /// F5: consumption paused while the DLQ refused (no event started in the outage's second half, the
    /// broker's count of the group's waiting messages did not fall, no refused event was delivered
    /// again); `None` for the other faults.
    #[serde(default)]
    pub(crate) paused: Option<bool>,
    /// Seconds from the fault's end to the first handler call after it.
    pub(crate) recovery_s: Option<f64>,
    /// Distinct events with a side effect row, written through the inbox (`None`: the run had no inbox).
    #[serde(default)]
    pub(crate) side_effects: Option<usize>,
    /// Side effect rows beyond one per event: effects a service using the inbox would have repeated.
    #[serde(default)]
    pub(crate) side_effect_duplicates: Option<usize>,
    /// Events whose handler succeeded with no side effect row (the inbox skipped an effect it never had).
    #[serde(default)]
    pub(crate) side_effects_missing: usize,
    /// Redeliveries the inbox found done and skipped (`None`: the run had no inbox). With none, "no
    /// side effect twice" was not put to the test: the report says so.
    #[serde(default)]
    pub(crate) inbox_skips: Option<usize>,
    /// What the broker still held for the group after the consumer stopped: the larger of the source's
    /// messages as the broker counts them and the events a fresh consumer was handed (`None`: not
    /// read, and the row fails).
    #[serde(default)]
    pub(crate) left_on_broker: Option<usize>,
    /// What else the run saw.
    pub(crate) note: String,
    /// The run did not complete: why.
    pub(crate) error: Option<String>,
}

impl Row {
    /// Whether the row shows what the SDK promises: nothing lost and the DLQ holding exactly the events
    /// whose fate is the DLQ, nothing dead-lettered that should have succeeded, each side effect once
    /// through the inbox, nothing left on the broker for the group, and a consumer that lived through
    /// the fault.
    pub(crate) fn passed(&self) -> bool {
        self.error.is_none()
            && self.misrouted == 0
            && self.side_effect_duplicates.unwrap_or(0) == 0
            && self.side_effects_missing == 0
            && self.left_on_broker == Some(0)
            && self.lost == 0
            && self.dlq_actual == self.dlq_expected
            && self.survived != Some(false)
            && self.paused != Some(false)
    }

    /// The row's file name.
    fn file_name(&self) -> String {
        let code = self.fault.split(' ').next().unwrap_or("F0");
        format!("{}-{code}.json", self.broker)
    }

    /// Saves the row under `out/rows/`.
    pub(crate) fn save(&self, out: &Path) -> std::io::Result<()> {
        let dir = out.join("rows");
        std::fs::create_dir_all(&dir)?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join(self.file_name()), json)
    }

    /// One line for the terminal.
    pub(crate) fn summary(&self) -> String {
        format!(
            "{} {}: produced {}, handled {}, lost {}, misrouted to the DLQ {}, duplicates {}, dlq {}/{}, survived {}, recovery {} — {}",
            self.broker,
            self.fault,
            self.produced,
            self.handled,
            self.lost,
            self.misrouted,
            self.duplicates,
            self.dlq_actual,
            self.dlq_expected,
            survived(self.survived),
            recovery(self.recovery_s),
            self.error.as_deref().unwrap_or(&self.note)
        )
    }
}

fn survived(s: Option<bool>) -> &'static str {
    match s {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "n/a (killed by design)",
    }
}

fn recovery(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |s| format!("{s:.2} s"))
}

/// Reads every row under `out/rows/`, ordered by broker and fault.
pub(crate) fn rows(out: &Path) -> std::io::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let dir = out.join("rows");
    if !dir.exists() {
        return Ok(rows);
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path)?;
            rows.push(serde_json::from_str(&text).map_err(std::io::Error::other)?);
        }
    }
    let order = |b: &str| {
        [
            "kafka",
            "rabbitmq",
            "rabbitmq4",
            "sqs",
            "pulsar",
            "kafka-cluster",
        ]
        .iter()
        .position(|x| *x == b)
    };
    rows.sort_by(|a: &Row, b: &Row| {
        (order(&a.broker), &a.fault).cmp(&(order(&b.broker), &b.fault))
    });
    Ok(rows)
}

/// The report's Markdown.
pub(crate) fn markdown(rows: &[Row]) -> String {
    let mut md = String::from(
        "| broker | fault | produced | handled | lost | misrouted | duplicates | side effects | side-effect duplicates | inbox skips | left on broker | dlq expected | dlq actual (distinct) | survived | recovery | note |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let lost = if r.lost > 0 {
            format!("**{}**", r.lost)
        } else {
            "0".to_string()
        };
        let survived = if r.error.is_some() {
            "-"
        } else {
            survived(r.survived)
        };
        let note = match &r.error {
            Some(e) => format!("**run failed**: {e}"),
            None => r.note.clone(),
        };
        let misrouted = match r.misrouted {
            0 => "0".to_string(),
            n => format!("**{n}**"),
        };
        let side_effects = r
            .side_effects
            .map_or_else(|| "no inbox".to_string(), |n| n.to_string());
        let side_effect_duplicates = match r.side_effect_duplicates {
            None => "-".to_string(),
            Some(0) => "0".to_string(),
            Some(n) => format!("**{n}**"),
        };
        // Without a skip, no redelivery reached the inbox after a commit: 0 duplicates proves nothing.
        let inbox_skips = match r.inbox_skips {
            None => "-".to_string(),
            Some(0) => "0 (inbox not exercised)".to_string(),
            Some(n) => n.to_string(),
        };
        let left = match r.left_on_broker {
            None => "**not read**".to_string(),
            Some(0) => "0".to_string(),
            Some(n) => format!("**{n}**"),
        };
        let dlq_actual = match r.dlq_copies {
            0 => r.dlq_actual.to_string(),
            n => format!("{} (+{n} copies)", r.dlq_actual),
        };
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.broker,
            r.fault,
            r.produced,
            r.handled,
            lost,
            misrouted,
            r.duplicates,
            side_effects,
            side_effect_duplicates,
            inbox_skips,
            left,
            r.dlq_expected,
            dlq_actual,
            survived,
            recovery(r.recovery_s),
            note.replace('|', "/")
        ));
    }
    let passed = rows.iter().filter(|r| r.passed()).count();
    md.push_str(&format!(
        "\n{passed} passed, {} failed\n",
        rows.len() - passed
    ));
    md
}

/// Writes `out/report.md` from the rows on disk; returns it.
pub(crate) fn write(out: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let rows = rows(out)?;
    let md = markdown(&rows);
    std::fs::write(out.join("report.md"), &md)?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(lost: usize, survived: Option<bool>) -> Row {
        Row {
            broker: "kafka".into(),
            fault: "F2 broker SIGKILL, restart".into(),
            produced: 10,
            handled: 10 - lost,
            lost,
            dlq_expected: 1,
            dlq_actual: 1,
            survived,
            left_on_broker: Some(0),
            ..Row::default()
        }
    }

    #[test]
    fn a_row_passes_only_when_nothing_was_lost_and_the_consumer_lived() {
        assert!(row(0, Some(true)).passed());
        assert!(row(0, None).passed());
        assert!(!row(1, Some(true)).passed());
        assert!(!row(0, Some(false)).passed());
        let mut failed = row(0, Some(true));
        failed.error = Some("broker down".into());
        assert!(!failed.passed());
    }

    #[test]
    fn a_row_with_healthy_events_dead_lettered_fails() {
        let mut misrouted = row(0, Some(true));
        misrouted.misrouted = 2;
        misrouted.dlq_actual = 3;
        assert!(!misrouted.passed());
    }

    #[test]
    fn a_repeated_or_missing_side_effect_fails_the_row() {
        let mut once = row(0, Some(true));
        once.side_effects = Some(9);
        once.side_effect_duplicates = Some(0);
        assert!(once.passed());
        let mut twice = once.clone();
        twice.side_effect_duplicates = Some(1);
        assert!(!twice.passed());
        let mut missing = once;
        missing.side_effects_missing = 1;
        assert!(!missing.passed());
        twice.dlq_copies = 2;
        twice.inbox_skips = Some(0);
        let md = markdown(&[twice]);
        assert!(
            md.contains("| 9 | **1** | 0 (inbox not exercised) | 0 |"),
            "{md}"
        );
        assert!(md.contains("| 1 (+2 copies) |"), "{md}");
    }

    #[test]
    fn a_row_with_anything_left_on_the_broker_or_unread_fails() {
        let mut left = row(0, Some(true));
        left.left_on_broker = Some(3);
        assert!(!left.passed());
        left.left_on_broker = None;
        assert!(!left.passed());
        let md = markdown(&[left]);
        assert!(md.contains("| **not read** |"), "{md}");
    }

    #[test]
    fn a_row_whose_dlq_misses_entries_fails() {
        let mut short = row(0, Some(true));
        short.dlq_actual = 0;
        assert!(!short.passed());
    }

    #[test]
    fn the_report_flags_losses_and_counts_rows() {
        let md = markdown(&[row(0, Some(true)), row(2, Some(false))]);
        assert!(md.contains("| **2** |"), "{md}");
        assert!(md.contains("| **no** |"), "{md}");
        assert!(md.ends_with("1 passed, 1 failed\n"), "{md}");
    }
}
