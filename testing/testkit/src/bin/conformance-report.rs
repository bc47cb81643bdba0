//! Prints the conformance report built from every adapter's part, and keeps the README's table in step
//! with it.
//!
//! ```text
//! conformance-report                    print target/conformance/report.md's table
//! conformance-report --readme README.md rewrite the README's generated table from the latest parts
//! conformance-report --check README.md  fail (exit 1) when the README's table differs from them
//! ```
//!
//! `--check` is how a README cannot claim a result the suite did not show: the test command runs it
//! after the suites.

use std::process::ExitCode;

use event_retry_testkit::report::{self, readme_table, replace_table};

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
    let table = readme_table(&parts);
    match args.as_slice() {
        [] => {
            print!("{}", report::to_markdown(&parts));
            ExitCode::SUCCESS
        }
        [flag, path] if flag == "--readme" || flag == "--check" => {
            let readme = match std::fs::read_to_string(path) {
                Ok(text) => text,
                Err(e) => {
                    eprintln!("conformance-report: reading {path}: {e}");
                    return ExitCode::from(2);
                }
            };
            let updated = match replace_table(&readme, &table) {
                Ok(text) => text,
                Err(e) => {
                    eprintln!("conformance-report: {path}: {e}");
                    return ExitCode::from(2);
                }
            };
            if flag == "--readme" {
                if let Err(e) = std::fs::write(path, updated) {
                    eprintln!("conformance-report: writing {path}: {e}");
                    return ExitCode::from(2);
                }
                println!("{path}: conformance table updated from {}", dir.display());
                ExitCode::SUCCESS
            } else if updated == readme {
                println!("{path}: the conformance table matches the latest results");
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "{path}: the conformance table differs from the latest results; the suite says:\n{table}\n\
                     run `cargo run -p event-retry-testkit --bin conformance-report -- --readme {path}` after a full run"
                );
                ExitCode::FAILURE
            }
        }
        _ => {
            eprintln!("usage: conformance-report [--readme README.md | --check README.md]");
            ExitCode::from(2)
        }
    }
}
