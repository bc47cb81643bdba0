//! The outbox suite: every scenario on SQLite and on PostgreSQL, relaying to real Kafka and RabbitMQ,
//! with the broker's contents read by its own client, and the inbox's scenarios consuming from them.
//! Writes `target/outbox/report.md`.
//!
//! Brokers and PostgreSQL come from `RETRY_TEST_KAFKA`, `RETRY_TEST_AMQP` and `RETRY_TEST_POSTGRES`
//! (`scripts/brokers start` writes them); a missing one is a loud skip, or a failure when
//! `RETRY_TEST_REQUIRE` names it. Scenarios run one at a time: some stall the broker or restart the
//! database.

#[path = "suite/fixture.rs"]
mod fixture;
#[path = "suite/inbox.rs"]
mod inbox;
#[path = "suite/raw.rs"]
mod raw;
#[path = "suite/scenarios.rs"]
mod scenarios;

use std::sync::{Arc, Mutex};

use fixture::{BrokerKind, Column, Db};
use libtest_mimic::{Arguments, Failed, Trial};

/// A scenario: a title that says what it asserts, and its body (Ok with the counts for the report).
pub(crate) struct Scenario {
    /// The test name.
    pub(crate) name: &'static str,
    /// What it asserts, for the report.
    pub(crate) title: &'static str,
    /// The body.
    pub(crate) run: fn(Column) -> Result<String, String>,
    /// Why the scenario cannot apply to a column, if it cannot (a loud, counted skip).
    pub(crate) skip: fn(&Column) -> Option<&'static str>,
}

fn main() -> std::process::ExitCode {
    if let Some(code) = scenarios::child_relay() {
        return code;
    }
    if let Some(code) = inbox::child_consumer() {
        return code;
    }
    // RUST_LOG shows the relay's and the broker clients' logs (librdkafka's among them) on stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let args = Arguments::from_args();
    let report: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let required = test_support::broker::required_brokers();
    let postgres_url = test_support::broker::url("RETRY_TEST_POSTGRES");
    let mut trials = Vec::new();
    for db in [Db::Sqlite, Db::Postgres] {
        for broker in [BrokerKind::Kafka, BrokerKind::Rabbitmq] {
            let broker_url = test_support::broker::url(broker.env());
            let missing: Vec<&str> = [
                broker_url.is_none().then_some(broker.name()),
                (db == Db::Postgres && postgres_url.is_none()).then_some("postgres"),
            ]
            .into_iter()
            .flatten()
            .collect();
            for scenario in scenarios::ALL.iter().chain(inbox::ALL) {
                let name = format!("{}::{}::{}", db.name(), broker.name(), scenario.name);
                let column_name = format!("{}→{}", db.name(), broker.name());
                let report = report.clone();
                if !missing.is_empty() {
                    let must = missing.iter().any(|m| required.iter().any(|r| r == m));
                    let why = format!("{} not set", missing.join(" and "));
                    report.lock().unwrap_or_else(|p| p.into_inner()).push((
                        scenario.title.into(),
                        column_name,
                        format!("skip: {why}"),
                    ));
                    if must {
                        trials.push(Trial::test(name, move || {
                            Err(Failed::from(format!(
                                "RETRY_TEST_REQUIRE names it, but {why}"
                            )))
                        }));
                    } else {
                        eprintln!("SKIP {name}: {why}");
                        trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
                    }
                    continue;
                }
                let column = Column {
                    db,
                    broker,
                    broker_url: broker_url.clone().unwrap_or_default(),
                    postgres_url: postgres_url.clone(),
                };
                if let Some(why) = (scenario.skip)(&column) {
                    eprintln!("SKIP {name}: {why}");
                    report.lock().unwrap_or_else(|p| p.into_inner()).push((
                        scenario.title.into(),
                        column_name,
                        format!("skip: {why}"),
                    ));
                    trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
                    continue;
                }
                let run = scenario.run;
                let title = scenario.title;
                trials.push(Trial::test(name, move || {
                    let outcome = run(column);
                    let cell = match &outcome {
                        Ok(note) => format!("pass: {note}"),
                        Err(e) => format!("FAIL: {}", e.lines().next().unwrap_or_default()),
                    };
                    report.lock().unwrap_or_else(|p| p.into_inner()).push((
                        title.into(),
                        column_name,
                        cell,
                    ));
                    outcome.map(|_| ()).map_err(Failed::from)
                }));
            }
        }
    }
    let mut args = args;
    // Stalls and restarts touch shared brokers: one scenario at a time.
    args.test_threads = Some(1);
    let conclusion = libtest_mimic::run(&args, trials);
    write_report(&report.lock().unwrap_or_else(|p| p.into_inner()));
    conclusion.exit_code()
}

fn write_report(cells: &[(String, String, String)]) {
    if cells.is_empty() {
        return;
    }
    let mut columns: Vec<String> = Vec::new();
    let mut titles: Vec<String> = Vec::new();
    for (title, column, _) in cells {
        if !columns.contains(column) {
            columns.push(column.clone());
        }
        if !titles.contains(title) {
            titles.push(title.clone());
        }
    }
    let mut out = String::from("# Outbox suite\n\n");
    out.push_str("Every scenario on each database, relaying to each real broker; broker contents read with its own client.\n\n");
    out.push_str(&format!(
        "| scenario | {} |\n|---|{}\n",
        columns.join(" | "),
        "---|".repeat(columns.len())
    ));
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    for title in &titles {
        let mut row = format!("| {title} |");
        for column in &columns {
            let cell = cells
                .iter()
                .find(|(t, c, _)| t == title && c == column)
                .map_or("not run", |(_, _, cell)| cell.as_str());
            if cell.starts_with("pass") {
                pass += 1;
            } else if cell.starts_with("FAIL") {
                fail += 1;
            } else if cell.starts_with("skip") {
                skip += 1;
            }
            row.push_str(&format!(" {} |", cell.replace('|', "/")));
        }
        out.push_str(&row);
        out.push('\n');
    }
    out.push_str(&format!("\n{pass} passed, {fail} failed, {skip} skipped\n"));
    let dir = fixture::root().join("target/outbox");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join("report.md"), out);
}
