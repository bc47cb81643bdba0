//! Prints the conformance report built from every adapter's part, and keeps the pages that show it in
//! step with it.
//!
//! ```text
//! conformance-report                          print target/conformance/report.md's table
//! conformance-report --write PAGE...          rewrite each page's generated tables from the latest parts
//! conformance-report --check PAGE...          fail (exit 1) when a page's tables differ from them
//! ```
//!
//! A page holds the README's compact table, the full table (`docs/CONFORMANCE.md`), or both, each
//! between its markers. `--check` is how a page cannot claim a result the suite did not show: the test
//! command runs it after the suites.

use std::process::ExitCode;

use event_retry_testkit::report::{self, rewrite_tables};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = report::directory();
    let parts = match report::read_parts(&dir) {
        Ok(parts) if !parts.is_empty() => parts,
        Ok(_) => {
            eprintln!(
                "conformance-report: no adapter parts in {}; run the suites first",
                dir.display()
            );
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("conformance-report: reading {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    };
    let (flag, pages) = match args.split_first() {
        None => {
            print!("{}", report::to_markdown(&parts));
            return ExitCode::SUCCESS;
        }
        Some((flag, pages)) if (flag == "--write" || flag == "--check") && !pages.is_empty() => {
            (flag.as_str(), pages)
        }
        Some(_) => {
            eprintln!("usage: conformance-report [--write PAGE... | --check PAGE...]");
            return ExitCode::from(2);
        }
    };
    let mut differs = false;
    for path in pages {
        let page = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("conformance-report: reading {path}: {e}");
                return ExitCode::from(2);
            }
        };
        let updated = match rewrite_tables(&page, &parts) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("conformance-report: {path}: {e}");
                return ExitCode::from(2);
            }
        };
        if flag == "--write" {
            if let Err(e) = std::fs::write(path, updated) {
                eprintln!("conformance-report: writing {path}: {e}");
                return ExitCode::from(2);
            }
            println!("{path}: conformance tables updated from {}", dir.display());
        } else if updated == page {
            println!("{path}: the conformance tables match the latest results");
        } else {
            differs = true;
            eprintln!(
                "{path}: the conformance tables differ from the latest results; the suite says:\n{}\n{}\n\
                 run `cargo run -p event-retry-testkit --bin conformance-report -- --write {path}` after a full run",
                report::compact_table(&parts),
                report::full_table(&parts),
            );
        }
    }
    if differs {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
