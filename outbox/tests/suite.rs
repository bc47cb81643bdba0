//! The outbox suite: every scenario on SQLite and on PostgreSQL, relaying to real Kafka and RabbitMQ,
//! with the broker's contents read by its own client, and the inbox's scenarios consuming from them.
//! Writes `target/outbox/report.md`.
//!
//! Brokers and PostgreSQL come from `RETRY_TEST_KAFKA`, `RETRY_TEST_AMQP` and `RETRY_TEST_POSTGRES`
//! (`scripts/brokers start` writes them); a missing one is a loud skip, or a failure when
//! `RETRY_TEST_REQUIRE` names it. Some scenarios stall their broker (SIGSTOP) and two restart
//! PostgreSQL, so each scenario holds its broker alone and PostgreSQL shared (alone, for the restart):
//! a Kafka scenario and a RabbitMQ one run side by side, two scenarios on one broker never do.

#[path = "suite/fixture.rs"]
mod fixture;
#[path = "suite/inbox.rs"]
mod inbox;
#[path = "suite/raw.rs"]
mod raw;
#[path = "suite/scenarios.rs"]
mod scenarios;

use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use fixture::{BrokerKind, Column, Db};
use libtest_mimic::{Arguments, Failed, Trial};

/// A scenario: a title that says what it asserts, and its body (Ok with the counts for the report).
pub(crate) struct Scenario {
    /// The test name.
    pub(crate) name: &'static str,
    /// What it asserts, for the report.
    pub(crate) title: &'static str,
    /// It restarts the database server: no other scenario may use PostgreSQL meanwhile.
    pub(crate) restarts_database: bool,
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
    // One list of trials per column; they are interleaved below so a Kafka and a RabbitMQ scenario
    // come next to each other and the two test threads run one of each.
    let mut columns: Vec<Vec<Trial>> = Vec::new();
    let mut column_order = Vec::new();
    let locks = Arc::new(Locks::default());
    for db in [Db::Sqlite, Db::Postgres] {
        for broker in [BrokerKind::Kafka, BrokerKind::Rabbitmq] {
            let mut trials = Vec::new();
            let broker_url = test_support::broker::url(broker.env());
            let missing: Vec<&str> = [
                broker_url.is_none().then_some(broker.name()),
                (db == Db::Postgres && postgres_url.is_none()).then_some("postgres"),
            ]
            .into_iter()
            .flatten()
            .collect();
            let column_name = format!("{}→{}", db.name(), broker.name());
            column_order.push(column_name.clone());
            for scenario in scenarios::ALL.iter().chain(inbox::ALL) {
                let name = format!("{}::{}::{}", db.name(), broker.name(), scenario.name);
                let column_name = column_name.clone();
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
                let restarts_database = scenario.restarts_database;
                let locks = locks.clone();
                trials.push(Trial::test(name, move || {
                    let _held = locks.hold(&column, restarts_database);
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
            columns.push(trials);
        }
    }
    let trials = interleave(columns);
    let mut args = args;
    // Two scenarios at a time: more could only wait for a broker's lock.
    args.test_threads = Some(args.test_threads.unwrap_or(2));
    let conclusion = libtest_mimic::run(&args, trials);
    let titles: Vec<&str> = scenarios::ALL
        .iter()
        .chain(inbox::ALL)
        .map(|s| s.title)
        .collect();
    write_report(
        &report.lock().unwrap_or_else(|p| p.into_inner()),
        &column_order,
        &titles,
    );
    conclusion.exit_code()
}

/// The locks a scenario holds while it runs.
#[derive(Default)]
struct Locks {
    kafka: Mutex<()>,
    rabbitmq: Mutex<()>,
    postgres: RwLock<()>,
}

/// What one running scenario holds; dropping it lets the next one on its broker (or database) go.
struct Held<'a> {
    _broker: MutexGuard<'a, ()>,
    /// A PostgreSQL column's share of the server.
    _database_shared: Option<RwLockReadGuard<'a, ()>>,
    /// The restart's hold of the server alone.
    _database_alone: Option<RwLockWriteGuard<'a, ()>>,
}

impl Locks {
    /// Takes the column's broker, then (on PostgreSQL) the server, always in that order, so two
    /// threads never wait on each other in a cycle. A scenario that failed (panicked) under a lock
    /// does not poison the others: the lock guards no data.
    fn hold(&self, column: &Column, restarts_database: bool) -> Held<'_> {
        let broker = match column.broker {
            BrokerKind::Kafka => &self.kafka,
            BrokerKind::Rabbitmq => &self.rabbitmq,
        }
        .lock()
        .unwrap_or_else(|p| p.into_inner());
        let postgres = column.db == Db::Postgres;
        Held {
            _broker: broker,
            _database_shared: (postgres && !restarts_database)
                .then(|| self.postgres.read().unwrap_or_else(|p| p.into_inner())),
            _database_alone: (postgres && restarts_database)
                .then(|| self.postgres.write().unwrap_or_else(|p| p.into_inner())),
        }
    }
}

/// Takes one trial from each list in turn: `[[a1, a2], [b1, b2]]` runs as a1, b1, a2, b2.
fn interleave<T>(lists: Vec<Vec<T>>) -> Vec<T> {
    let mut iters: Vec<_> = lists.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for it in &mut iters {
            out.extend(it.next());
        }
        if out.len() == before {
            return out;
        }
    }
}

/// Writes the report, its columns and rows in the suite's order whatever order the scenarios ended in;
/// a column or row no cell of this run reached (a filtered run) is left out.
fn write_report(cells: &[(String, String, String)], columns: &[String], titles: &[&str]) {
    if cells.is_empty() {
        return;
    }
    let columns: Vec<&str> = columns
        .iter()
        .map(String::as_str)
        .filter(|c| cells.iter().any(|(_, column, _)| column == c))
        .collect();
    let titles: Vec<&str> = titles
        .iter()
        .copied()
        .filter(|t| cells.iter().any(|(title, _, _)| title == t))
        .collect();
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
