//! The report: scenario × adapter, pass / fail / skip with the reason, lateness figures.
//!
//! Each adapter's run writes its own part (`target/conformance/<adapter>.json`) and then rebuilds
//! `target/conformance/report.md` from every part present, so one report covers every adapter although
//! each runs in its own test binary. The README's conformance table is the same table without the
//! figures; [`readme_table`] renders it and `conformance-report --check README.md` fails when the README
//! says something the latest parts do not.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::scenarios::Scenario;

/// One cell of the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cell {
    /// Passed, with an optional note (lateness figures).
    Pass(Option<String>),
    /// Passed what it could check; the part of the title it did not check, and why.
    Partial(String),
    /// Failed, with the failure.
    Fail(String),
    /// Skipped, with the reason.
    Skip(String),
}

/// One scenario's row in an adapter's part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    /// Its number.
    pub number: u8,
    /// Its test name.
    pub name: String,
    /// What it asserts, in words.
    pub title: String,
    /// How it went.
    pub cell: Cell,
}

/// One adapter's results, as written to its part of the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// The adapter.
    pub adapter: String,
    /// Its rows, by scenario number.
    pub rows: BTreeMap<u8, Row>,
}

/// Results gathered while one adapter's trials run.
#[derive(Debug)]
pub struct Report {
    part: Mutex<Part>,
}

/// The adapters in the report's column order; others follow alphabetically.
const COLUMN_ORDER: [&str; 17] = [
    "memory",
    "memory-current-thread",
    "memory-batch",
    "kafka",
    "kafka-tls",
    "kafka-transactional",
    "kafka-batch",
    "rabbitmq",
    "rabbitmq-tls",
    "rabbitmq-batch",
    "sqs",
    "sqs-fifo",
    "sqs-sns",
    "sqs-visibility",
    "pulsar",
    "pulsar-tls",
    "pulsar-batch",
];

fn escape(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A partial pass as a cell: what was not checked is in the cell itself, never only in a note.
fn partial(unchecked: &str) -> String {
    format!("pass (partial: {})", escape(unchecked))
}

impl Report {
    /// An empty report for `adapter`.
    pub fn new(adapter: &str) -> Self {
        Self {
            part: Mutex::new(Part {
                adapter: adapter.to_string(),
                rows: BTreeMap::new(),
            }),
        }
    }

    /// Records one result.
    pub fn record(&self, scenario: &Scenario, cell: Cell) {
        let mut part = self.part.lock().unwrap_or_else(|p| p.into_inner());
        part.rows.insert(
            scenario.number,
            Row {
                number: scenario.number,
                name: scenario.name.to_string(),
                title: scenario.title.to_string(),
                cell,
            },
        );
    }

    /// Writes this adapter's part and rebuilds `report.md` from every part in the directory; returns
    /// the report's path.
    pub fn write(&self) -> std::io::Result<PathBuf> {
        let dir = directory();
        std::fs::create_dir_all(&dir)?;
        let part = self.part.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let json = serde_json::to_string_pretty(&part).map_err(std::io::Error::other)?;
        std::fs::write(dir.join(format!("{}.json", part.adapter)), json)?;
        let parts = read_parts(&dir)?;
        let path = dir.join("report.md");
        std::fs::write(&path, to_markdown(&parts))?;
        Ok(path)
    }
}

/// Where the parts and the report live: `RETRY_TEST_REPORT_DIR`, else `conformance/` in the target
/// directory of the running binary's workspace (`target/conformance`), so an adapter outside this
/// repository gets its report in its own target directory.
pub fn directory() -> PathBuf {
    if let Some(p) = std::env::var_os("RETRY_TEST_REPORT_DIR") {
        return PathBuf::from(p);
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("conformance");
    }
    // A test binary is `<target>/<profile>/deps/<name>`, a binary `<target>/<profile>/<name>`.
    let exe = std::env::current_exe().unwrap_or_default();
    let target = exe
        .ancestors()
        .find(|dir| dir.file_name().is_some_and(|n| n == "target"))
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("conformance")
}

/// Every adapter part in `dir`, in column order.
pub fn read_parts(dir: &Path) -> std::io::Result<Vec<Part>> {
    let mut parts = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path)?;
            let part: Part = serde_json::from_str(&text)
                .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
            parts.push(part);
        }
    }
    parts.sort_by_key(|p| {
        let rank = COLUMN_ORDER
            .iter()
            .position(|a| *a == p.adapter)
            .unwrap_or(COLUMN_ORDER.len());
        (rank, p.adapter.clone())
    });
    Ok(parts)
}

/// Every scenario of any part, by number, with its title.
fn scenarios_of(parts: &[Part]) -> BTreeMap<u8, (String, String)> {
    parts
        .iter()
        .flat_map(|p| p.rows.values())
        .map(|r| (r.number, (r.name.clone(), r.title.clone())))
        .collect()
}

/// The full table, with notes and failures.
pub fn to_markdown(parts: &[Part]) -> String {
    let mut out = String::from("# Conformance report\n\n| # | scenario |");
    for p in parts {
        let _ = write!(out, " {} |", p.adapter);
    }
    out.push_str("\n|---|---|");
    out.push_str(&"---|".repeat(parts.len()));
    out.push('\n');
    let mut totals = vec![(0, 0, 0, 0); parts.len()];
    for (number, (name, _)) in scenarios_of(parts) {
        let _ = write!(out, "| {number} | {name} |");
        for (i, p) in parts.iter().enumerate() {
            let text = match p.rows.get(&number).map(|r| &r.cell) {
                Some(Cell::Pass(None)) => {
                    totals[i].0 += 1;
                    "pass".to_string()
                }
                Some(Cell::Pass(Some(note))) => {
                    totals[i].0 += 1;
                    format!("pass ({})", escape(note))
                }
                Some(Cell::Partial(unchecked)) => {
                    totals[i].0 += 1;
                    totals[i].3 += 1;
                    partial(unchecked)
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
    for (pass, fail, skip, partial) in totals {
        let partial = match partial {
            0 => String::new(),
            n => format!(" ({n} partial)"),
        };
        let _ = write!(out, " {pass} pass{partial}, {fail} fail, {skip} skip |");
    }
    out.push('\n');
    out
}

/// The README's table: what each scenario asserts, and per adapter `pass`, `FAIL` or `skip: <reason>`
/// (no figures, so it changes only when a result does).
pub fn readme_table(parts: &[Part]) -> String {
    let mut out = String::from("| # | scenario |");
    for p in parts {
        let _ = write!(out, " {} |", p.adapter);
    }
    out.push_str("\n|---|---|");
    out.push_str(&"---|".repeat(parts.len()));
    out.push('\n');
    for (number, (_, title)) in scenarios_of(parts) {
        let _ = write!(out, "| {number} | {} |", escape(&title));
        for p in parts {
            let text = match p.rows.get(&number).map(|r| &r.cell) {
                Some(Cell::Pass(_)) => "pass".to_string(),
                Some(Cell::Partial(unchecked)) => partial(unchecked),
                Some(Cell::Fail(_)) => "**FAIL**".to_string(),
                Some(Cell::Skip(why)) => format!("skip: {}", escape(why)),
                None => "not run".to_string(),
            };
            let _ = write!(out, " {text} |");
        }
        out.push('\n');
    }
    out
}

/// The markers around the generated table in a README.
pub const README_BEGIN: &str =
    "<!-- conformance table: generated by `conformance-report --readme`; do not edit -->";
/// The end marker.
pub const README_END: &str = "<!-- end of conformance table -->";

/// `readme` with the text between the markers replaced by `table`; an error when a marker is missing.
pub fn replace_table(readme: &str, table: &str) -> Result<String, String> {
    let begin = readme
        .find(README_BEGIN)
        .ok_or_else(|| format!("the README has no line {README_BEGIN:?}"))?;
    let after_begin = begin + README_BEGIN.len();
    let end = readme[after_begin..]
        .find(README_END)
        .map(|i| after_begin + i)
        .ok_or_else(|| format!("the README has no line {README_END:?} after the table"))?;
    Ok(format!(
        "{}\n{}{}",
        &readme[..after_begin],
        table,
        &readme[end..]
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn part(adapter: &str, cells: &[(u8, Cell)]) -> Part {
        Part {
            adapter: adapter.into(),
            rows: cells
                .iter()
                .map(|(n, c)| {
                    (
                        *n,
                        Row {
                            number: *n,
                            name: format!("s{n}"),
                            title: format!("scenario {n}"),
                            cell: c.clone(),
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn table_counts_each_kind() {
        let parts = vec![
            part(
                "memory",
                &[
                    (1, Cell::Pass(None)),
                    (2, Cell::Pass(Some("p99 3 ms".into()))),
                ],
            ),
            part(
                "kafka",
                &[
                    (1, Cell::Skip("RETRY_TEST_KAFKA is not set".into())),
                    (2, Cell::Fail("a|b".into())),
                ],
            ),
        ];
        let md = to_markdown(&parts);
        assert!(
            md.contains("| 2 | s2 | pass (p99 3 ms) | **FAIL**: a\\|b |"),
            "{md}"
        );
        assert!(
            md.contains("2 pass, 0 fail, 0 skip | 0 pass, 1 fail, 1 skip |"),
            "{md}"
        );
        let table = readme_table(&parts);
        assert!(
            table.contains("| 2 | scenario 2 | pass | **FAIL** |"),
            "{table}"
        );
    }

    #[test]
    fn a_partial_pass_says_what_it_did_not_check_in_both_tables() {
        let parts = vec![part(
            "rabbitmq",
            &[
                (1, Cell::Pass(None)),
                (15, Cell::Partial("retry route not read".into())),
            ],
        )];
        let md = to_markdown(&parts);
        assert!(
            md.contains("| 15 | s15 | pass (partial: retry route not read) |"),
            "{md}"
        );
        assert!(md.contains("2 pass (1 partial), 0 fail, 0 skip |"), "{md}");
        let table = readme_table(&parts);
        assert!(
            table.contains("| 15 | scenario 15 | pass (partial: retry route not read) |"),
            "{table}"
        );
    }

    #[test]
    fn the_readme_table_is_replaced_between_the_markers() {
        let readme = format!("intro\n{README_BEGIN}\nold\n{README_END}\nrest\n");
        let new = replace_table(&readme, "| new |\n").unwrap();
        assert_eq!(
            new,
            format!("intro\n{README_BEGIN}\n| new |\n{README_END}\nrest\n")
        );
        assert!(replace_table("no markers", "x").is_err());
    }

    #[test]
    fn parts_are_read_back_in_column_order() {
        let dir = std::env::temp_dir().join(format!("conformance-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        for p in [part("pulsar", &[]), part("zeta", &[]), part("memory", &[])] {
            std::fs::write(
                dir.join(format!("{}.json", p.adapter)),
                serde_json::to_string(&p).unwrap(),
            )
            .unwrap();
        }
        let order: Vec<String> = read_parts(&dir)
            .unwrap()
            .into_iter()
            .map(|p| p.adapter)
            .collect();
        assert_eq!(order, ["memory", "pulsar", "zeta"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
