//! The report: scenario × adapter, pass / fail / skip with the reason, lateness figures.
//!
//! Each adapter's run writes its own part (`target/conformance/<adapter>.json`) and then rebuilds
//! `target/conformance/report.md` from every part present, so one report covers every adapter although
//! each runs in its own test binary. Two pages carry the results without the figures: the README a
//! compact table ([`compact_table`]: a column per transport, a symbol per variant) and
//! `docs/CONFORMANCE.md` the full one ([`full_table`]: a column per variant). Both are generated between
//! markers, and `conformance-report --check` fails when a page says something the latest parts do not.

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
const COLUMN_ORDER: [&str; 20] = [
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
    "rabbitmq4",
    "rabbitmq4-quorum",
    "rabbitmq4-batch",
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

/// The full table (`docs/CONFORMANCE.md`): one column per variant, a row per scenario with what it
/// asserts, and per cell `pass`, `FAIL`, `skip: <reason>` or `pass (partial: <what was not checked>)` —
/// no figures, so it changes only when a result does.
pub fn full_table(parts: &[Part]) -> String {
    let mut out = String::from("| scenario | what it asserts |");
    for p in parts {
        let _ = write!(out, " {} |", p.adapter);
    }
    out.push_str("\n|---|---|");
    out.push_str(&"---|".repeat(parts.len()));
    out.push('\n');
    for (number, (name, title)) in scenarios_of(parts) {
        let _ = write!(out, "| `{name}` | {} |", escape(&title));
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

/// The transports of the compact table, in its column order; a variant belongs to the first whose
/// name starts its own (`kafka-tls` to `kafka`, `rabbitmq4` to `rabbitmq`).
const TRANSPORTS: [&str; 5] = ["memory", "kafka", "rabbitmq", "sqs", "pulsar"];

/// The transport a variant's column belongs to.
fn transport_of(adapter: &str) -> &str {
    TRANSPORTS
        .iter()
        .find(|t| adapter.starts_with(**t))
        .copied()
        .unwrap_or(adapter)
}

/// The README's table, readable at 120 columns: a row per scenario, a column per transport, in each
/// cell one symbol per variant in the order the legend names them — `✓` pass, `◐` partial pass, `✗`
/// failed, `–` skipped, `·` not run — with the reason of each partial pass or skip as a numbered note.
/// Every cell of [`full_table`] is in it, so a script reading either sees the same results.
pub fn compact_table(parts: &[Part]) -> String {
    let mut transports: Vec<(&str, Vec<&Part>)> = Vec::new();
    for p in parts {
        let t = transport_of(&p.adapter);
        match transports.iter_mut().find(|(name, _)| *name == t) {
            Some((_, variants)) => variants.push(p),
            None => transports.push((t, vec![p])),
        }
    }
    transports.sort_by_key(|(t, _)| {
        TRANSPORTS
            .iter()
            .position(|k| k == t)
            .unwrap_or(TRANSPORTS.len())
    });
    let mut notes: Vec<String> = Vec::new();
    let mut note = |text: String| -> usize {
        match notes.iter().position(|n| *n == text) {
            Some(i) => i + 1,
            None => {
                notes.push(text);
                notes.len()
            }
        }
    };
    let mut out = String::from("| scenario |");
    for (t, _) in &transports {
        let _ = write!(out, " {t} |");
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(transports.len()));
    out.push('\n');
    for (number, (name, _)) in scenarios_of(parts) {
        let _ = write!(out, "| `{name}` |");
        for (_, variants) in &transports {
            let cell: Vec<String> = variants
                .iter()
                .map(|p| match p.rows.get(&number).map(|r| &r.cell) {
                    Some(Cell::Pass(_)) => "✓".to_string(),
                    Some(Cell::Partial(unchecked)) => {
                        format!("◐{}", note(format!("partial: {}", escape(unchecked))))
                    }
                    Some(Cell::Fail(_)) => "**✗**".to_string(),
                    Some(Cell::Skip(why)) => format!("–{}", note(format!("skip: {}", escape(why)))),
                    None => "·".to_string(),
                })
                .collect();
            let _ = write!(out, " {} |", cell.join(" "));
        }
        out.push('\n');
    }
    let variants: Vec<String> = transports
        .iter()
        .map(|(t, variants)| {
            let names: Vec<&str> = variants
                .iter()
                .map(|p| match p.adapter.strip_prefix(*t) {
                    Some("") => "plain",
                    Some(rest) => rest.strip_prefix('-').unwrap_or(&p.adapter),
                    None => &p.adapter,
                })
                .collect();
            format!("{t} ({})", names.join(", "))
        })
        .collect();
    out.push('\n');
    out.push_str(&wrap(
        &format!(
            "Variants, in each cell's order: {}. `✓` pass, `◐` partial pass, `✗` failed, `–` skipped, \
             `·` not run.",
            variants.join(", ")
        ),
        "",
    ));
    if !notes.is_empty() {
        out.push('\n');
        for (i, text) in notes.iter().enumerate() {
            out.push_str(&wrap(&format!("{}. {text}", i + 1), "   "));
        }
    }
    out
}

/// `text` wrapped at word boundaries into lines of at most 110 characters, each line after the first
/// starting with `indent`.
fn wrap(text: &str, indent: &str) -> String {
    const WIDTH: usize = 110;
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = indent.to_string();
        } else if !line.is_empty() && line != indent {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// The markers around a generated table in a page.
#[derive(Clone, Copy, Debug)]
pub struct Markers {
    /// The line before the table.
    pub begin: &'static str,
    /// The line after it.
    pub end: &'static str,
    /// Renders the table.
    pub render: fn(&[Part]) -> String,
}

/// The README's compact table.
pub const COMPACT: Markers = Markers {
    begin: "<!-- conformance table: generated by `conformance-report --write`; do not edit -->",
    end: "<!-- end of conformance table -->",
    render: compact_table,
};

/// The full table, one column per variant (`docs/CONFORMANCE.md`).
pub const FULL: Markers = Markers {
    begin: "<!-- full conformance table: generated by `conformance-report --write`; do not edit -->",
    end: "<!-- end of full conformance table -->",
    render: full_table,
};

/// `page` with every generated table in it rendered anew from `parts`; an error when the page holds
/// none, or a begin marker without its end.
pub fn rewrite_tables(page: &str, parts: &[Part]) -> Result<String, String> {
    let mut out = page.to_string();
    let mut found = false;
    for markers in [COMPACT, FULL] {
        if out.contains(markers.begin) {
            out = replace_table(&out, markers, &(markers.render)(parts))?;
            found = true;
        }
    }
    if found {
        Ok(out)
    } else {
        Err(format!(
            "no generated table: the page has neither {:?} nor {:?}",
            COMPACT.begin, FULL.begin
        ))
    }
}

/// `page` with the text between `markers` replaced by `table`; an error when a marker is missing.
pub fn replace_table(page: &str, markers: Markers, table: &str) -> Result<String, String> {
    let begin = page
        .find(markers.begin)
        .ok_or_else(|| format!("the page has no line {:?}", markers.begin))?;
    let after_begin = begin + markers.begin.len();
    let end = page[after_begin..]
        .find(markers.end)
        .map(|i| after_begin + i)
        .ok_or_else(|| format!("the page has no line {:?} after the table", markers.end))?;
    Ok(format!(
        "{}\n{}{}",
        &page[..after_begin],
        table,
        &page[end..]
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
        let table = full_table(&parts);
        assert!(
            table.contains("| `s2` | scenario 2 | pass | **FAIL** |"),
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
        let table = full_table(&parts);
        assert!(
            table.contains("| `s15` | scenario 15 | pass (partial: retry route not read) |"),
            "{table}"
        );
        let compact = compact_table(&parts);
        assert!(compact.contains("| `s15` | ◐1 |"), "{compact}");
        assert!(
            compact.contains("\n1. partial: retry route not read\n"),
            "{compact}"
        );
    }

    #[test]
    fn a_table_is_replaced_between_its_markers() {
        let (begin, end) = (COMPACT.begin, COMPACT.end);
        let readme = format!("intro\n{begin}\nold\n{end}\nrest\n");
        let new = replace_table(&readme, COMPACT, "| new |\n").unwrap();
        assert_eq!(new, format!("intro\n{begin}\n| new |\n{end}\nrest\n"));
        assert!(replace_table("no markers", COMPACT, "x").is_err());
        assert!(rewrite_tables("no markers", &[]).is_err());
    }

    #[test]
    fn the_compact_table_groups_variants_under_their_transport_with_numbered_notes() {
        let parts = vec![
            part("memory", &[(1, Cell::Pass(None)), (7, Cell::Pass(None))]),
            part("kafka", &[(1, Cell::Pass(None)), (7, Cell::Pass(None))]),
            part("kafka-tls", &[(1, Cell::Partial("no view".into()))]),
            part(
                "kafka-batch",
                &[
                    (1, Cell::Fail("boom".into())),
                    (7, Cell::Skip("batch refuses it".into())),
                ],
            ),
            part(
                "sqs",
                &[(1, Cell::Pass(None)), (7, Cell::Skip("no order".into()))],
            ),
            part("sqs-fifo", &[(1, Cell::Pass(None)), (7, Cell::Pass(None))]),
            part("rabbitmq4", &[(1, Cell::Partial("no view".into()))]),
        ];
        let table = compact_table(&parts);
        assert!(
            table.starts_with("| scenario | memory | kafka | rabbitmq | sqs |\n"),
            "{table}"
        );
        assert!(
            table.contains("| `s1` | ✓ | ✓ ◐1 **✗** | ◐1 | ✓ ✓ |"),
            "{table}"
        );
        assert!(
            table.contains("| `s7` | ✓ | ✓ · –2 | · | –3 ✓ |"),
            "{table}"
        );
        assert!(
            table
                .replace('\n', " ")
                .contains("kafka (plain, tls, batch), rabbitmq (rabbitmq4), sqs (plain, fifo)."),
            "{table}"
        );
        assert!(
            table.ends_with("1. partial: no view\n2. skip: batch refuses it\n3. skip: no order\n"),
            "{table}"
        );
        for line in table.lines() {
            assert!(line.chars().count() <= 120, "{line}");
        }
        let long = format!("{}end", "word ".repeat(60));
        let wrapped = wrap(&long, "   ");
        assert!(
            wrapped.lines().all(|l| l.chars().count() <= 110),
            "{wrapped}"
        );
        assert!(
            wrapped.lines().skip(1).all(|l| l.starts_with("   ")),
            "{wrapped}"
        );
        assert_eq!(
            wrapped.split_whitespace().collect::<Vec<_>>().join(" "),
            long.trim()
        );
    }

    #[test]
    fn both_tables_of_a_page_are_rewritten_and_a_change_of_result_shows() {
        let page = format!(
            "a\n{}\n{}\nb\n{}\n{}\n",
            COMPACT.begin, COMPACT.end, FULL.begin, FULL.end
        );
        let pass = vec![part("memory", &[(1, Cell::Pass(None))])];
        let written = rewrite_tables(&page, &pass).unwrap();
        assert!(written.contains("| `s1` | ✓ |"), "{written}");
        assert!(
            written.contains("| `s1` | scenario 1 | pass |"),
            "{written}"
        );
        assert_eq!(rewrite_tables(&written, &pass).unwrap(), written);
        let fail = vec![part("memory", &[(1, Cell::Fail("x".into()))])];
        assert_ne!(rewrite_tables(&written, &fail).unwrap(), written);
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
