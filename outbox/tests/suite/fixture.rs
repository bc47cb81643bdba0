//! What every outbox scenario stands on: a fresh database (a SQLite file, or a new PostgreSQL database),
//! a fresh topic on a real broker, business transactions, the broker's raw contents, and the broker
//! process itself (to stall it).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use event_retry::Broker;
use event_retry_core::event::Event;
use event_retry_outbox::{Dialect, Outbox, OutboxRow, RowFilter, State};
use sqlx::{Connection, PgConnection, SqliteConnection};

use crate::raw;

/// The database of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Db {
    Sqlite,
    Postgres,
}

impl Db {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Db::Sqlite => "sqlite",
            Db::Postgres => "postgres",
        }
    }
}

/// A broker of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BrokerKind {
    Kafka,
    Rabbitmq,
}

impl BrokerKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            BrokerKind::Kafka => "kafka",
            BrokerKind::Rabbitmq => "rabbitmq",
        }
    }

    pub(crate) fn env(self) -> &'static str {
        match self {
            BrokerKind::Kafka => "RETRY_TEST_KAFKA",
            BrokerKind::Rabbitmq => "RETRY_TEST_AMQP",
        }
    }
}

/// One column of the report: a database and a broker, with their URLs.
#[derive(Clone, Debug)]
pub(crate) struct Column {
    pub(crate) db: Db,
    pub(crate) broker: BrokerKind,
    pub(crate) broker_url: String,
    pub(crate) postgres_url: Option<String>,
}

/// The workspace root (for `target/` and `scripts/`).
pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

fn short_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}

/// A fresh, empty database URL for the column.
pub(crate) async fn fresh_db(column: &Column) -> Result<String, String> {
    match column.db {
        Db::Sqlite => {
            let dir = root().join("target/outbox-tests");
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            Ok(format!(
                "sqlite:{}",
                dir.join(format!("{}.db", short_id())).display()
            ))
        }
        Db::Postgres => {
            let admin = column
                .postgres_url
                .as_deref()
                .ok_or("RETRY_TEST_POSTGRES is not set")?;
            let name = format!("outbox_{}", short_id());
            let mut conn = PgConnection::connect(admin)
                .await
                .map_err(|e| format!("connect to PostgreSQL: {e}"))?;
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut conn)
                .await
                .map_err(|e| format!("create database {name}: {e}"))?;
            Ok(test_support::broker::postgres_database(admin, &name, None))
        }
    }
}

/// A fresh topic, declared on the broker.
pub(crate) async fn fresh_topic(broker: &Broker, prefix: &str) -> Result<String, String> {
    let topic = format!("outbox-{prefix}-{}", short_id());
    broker
        .admin()
        .declare(&topic, None)
        .await
        .map_err(|e| format!("declare {topic}: {e}"))?;
    Ok(topic)
}

/// A business connection of the column's database.
pub(crate) enum Business {
    Sqlite(SqliteConnection),
    Postgres(PgConnection),
}

impl Business {
    pub(crate) async fn connect(db_url: &str) -> Result<Self, String> {
        let conn = match Dialect::of_url(db_url).map_err(|e| e.to_string())? {
            Dialect::Sqlite => Business::Sqlite(
                SqliteConnection::connect(db_url)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
            Dialect::Postgres => Business::Postgres(
                PgConnection::connect(db_url)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
        };
        Ok(conn)
    }

    /// In one transaction: `orders` rows and their events; committed or rolled back.
    pub(crate) async fn orders(
        &mut self,
        outbox: &Outbox,
        topic: &str,
        events: Vec<Event>,
        commit: bool,
    ) -> Result<Vec<String>, String> {
        const TABLE: &str = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)";
        const INSERT: &str = "INSERT INTO orders (id) VALUES ($1)";
        let mut ids = Vec::with_capacity(events.len());
        match self {
            Business::Sqlite(conn) => {
                let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
                sqlx::query(TABLE)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| e.to_string())?;
                for event in events {
                    let id = outbox
                        .enqueue(&mut *tx, topic, event)
                        .await
                        .map_err(|e| e.to_string())?;
                    sqlx::query(sqlx::AssertSqlSafe(INSERT.replace('$', "?")))
                        .bind(&id)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| e.to_string())?;
                    ids.push(id);
                }
                if commit {
                    tx.commit().await.map_err(|e| e.to_string())?;
                } else {
                    tx.rollback().await.map_err(|e| e.to_string())?;
                }
            }
            Business::Postgres(conn) => {
                let mut tx = conn.begin().await.map_err(|e| e.to_string())?;
                sqlx::query(TABLE)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| e.to_string())?;
                for event in events {
                    let id = outbox
                        .enqueue(&mut *tx, topic, event)
                        .await
                        .map_err(|e| e.to_string())?;
                    sqlx::query(INSERT)
                        .bind(&id)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| e.to_string())?;
                    ids.push(id);
                }
                if commit {
                    tx.commit().await.map_err(|e| e.to_string())?;
                } else {
                    tx.rollback().await.map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(ids)
    }

    /// How many `orders` rows are committed.
    pub(crate) async fn order_count(&mut self) -> Result<i64, String> {
        let sql = "SELECT COUNT(*) FROM orders";
        match self {
            Business::Sqlite(c) => sqlx::query_scalar(sql).fetch_one(c).await,
            Business::Postgres(c) => sqlx::query_scalar(sql).fetch_one(c).await,
        }
        .map_err(|e| e.to_string())
    }

    /// Runs a statement of a foreign writer (text with `$N` parameters already inlined).
    pub(crate) async fn execute(&mut self, sql: &str) -> Result<(), String> {
        match self {
            Business::Sqlite(c) => sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
                .execute(c)
                .await
                .map(|_| ()),
            Business::Postgres(c) => sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
                .execute(c)
                .await
                .map(|_| ()),
        }
        .map_err(|e| e.to_string())
    }
}

/// `n` events with distinct keys (`k0`, `k1`, …) unless `keys` is given.
pub(crate) fn events(n: usize, keys: Option<usize>) -> Vec<Event> {
    (0..n)
        .map(|i| {
            let key = match keys {
                Some(k) => format!("key-{}", i % k),
                None => format!("k{i}"),
            };
            Event::new(format!("{{\"n\":{i}}}"))
                .with_key(key)
                .with_header("source", "outbox-suite")
        })
        .collect()
}

/// Waits until `done(counts by state)` holds, or fails after `limit` saying what the table held.
pub(crate) async fn wait_states(
    outbox: &Outbox,
    limit: Duration,
    what: &str,
    done: impl Fn(&HashMap<State, usize>) -> bool,
) -> Result<HashMap<State, usize>, String> {
    let deadline = Instant::now() + limit;
    loop {
        let by_state = states(outbox).await?;
        if done(&by_state) {
            return Ok(by_state);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: not within {limit:?}; the outbox holds {by_state:?}; {}",
                unpublished_summary(outbox).await
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The rows not published yet, grouped by their last error: how many, their most attempts, and how far
/// their `available_at` is from now — what a scenario that waited in vain needs to tell a stuck relay
/// from a broker that keeps failing.
async fn unpublished_summary(outbox: &Outbox) -> String {
    let rows = match all_rows(outbox).await {
        Ok(rows) => rows,
        Err(e) => return format!("the rows could not be read: {e}"),
    };
    let now = event_retry_core::time::Timestamp::now();
    let mut by_error: std::collections::BTreeMap<String, (usize, u32, i64)> = Default::default();
    for row in rows.iter().filter(|r| r.state != State::Published) {
        let error = row.last_error.clone().unwrap_or_else(|| "(none)".into());
        let entry = by_error.entry(error).or_insert((0, 0, i64::MIN));
        entry.0 += 1;
        entry.1 = entry.1.max(row.attempts);
        let ahead = row.available_at.as_millis() as i64 - now.as_millis() as i64;
        entry.2 = entry.2.max(ahead);
    }
    let groups: Vec<String> = by_error
        .iter()
        .map(|(error, (n, attempts, ahead))| {
            format!("{n} rows (up to {attempts} attempts, the latest available in {ahead} ms): last error {error:?}")
        })
        .collect();
    format!("unpublished rows: [{}]", groups.join("; "))
}

/// Rows by state.
pub(crate) async fn states(outbox: &Outbox) -> Result<HashMap<State, usize>, String> {
    let c = outbox.counts().await.map_err(|e| e.to_string())?;
    let n = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    Ok(HashMap::from([
        (State::Pending, n(c.pending - c.claimed)),
        (State::Claimed, n(c.claimed)),
        (State::Published, n(c.published)),
        (State::Dead, n(c.dead)),
    ]))
}

pub(crate) async fn all_rows(outbox: &Outbox) -> Result<Vec<OutboxRow>, String> {
    outbox
        .list(&RowFilter::all())
        .await
        .map_err(|e| e.to_string())
}

pub(crate) fn count(by_state: &HashMap<State, usize>, state: State) -> usize {
    by_state.get(&state).copied().unwrap_or(0)
}

/// What the broker holds on `topic`, read with its own client, as event ids in arrival order.
pub(crate) async fn broker_contents(
    column: &Column,
    broker: &Broker,
    topic: &str,
) -> Result<Vec<String>, String> {
    // A publish that timed out may still land a moment later (the client keeps it queued).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = match column.broker {
        BrokerKind::Kafka => {
            let bootstrap = column
                .broker_url
                .trim_start_matches("kafka://")
                .split('?')
                .next()
                .unwrap_or_default()
                .to_string();
            let topic = topic.to_string();
            tokio::task::spawn_blocking(move || raw::kafka(&bootstrap, &topic))
                .await
                .map_err(|e| e.to_string())??
        }
        BrokerKind::Rabbitmq => {
            let names = broker
                .admin()
                .names(topic, None)
                .await
                .map_err(|e| e.to_string())?;
            raw::rabbitmq(&column.broker_url, &names.topic).await?
        }
    };
    Ok(seen.into_iter().map(|s| s.event_id).collect())
}

/// Per event id, how many times the broker holds it.
pub(crate) fn tally(ids: &[String]) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for id in ids {
        *out.entry(id.clone()).or_insert(0) += 1;
    }
    out
}

/// Lost and duplicated, for `expected` ids against the broker's `held`.
pub(crate) fn lost_and_duplicates(expected: &[String], held: &[String]) -> (Vec<String>, usize) {
    let tally = tally(held);
    let lost: Vec<String> = expected
        .iter()
        .filter(|id| !tally.contains_key(*id))
        .cloned()
        .collect();
    let duplicates = tally.values().map(|n| n.saturating_sub(1)).sum();
    (lost, duplicates)
}

/// Stalls the column's broker with SIGSTOP (every client sees it stop answering) until resumed or
/// dropped.
pub(crate) fn stall(broker: BrokerKind) -> Result<test_support::stall::Stall, String> {
    let pid_file = match broker {
        BrokerKind::Kafka => "pid",
        BrokerKind::Rabbitmq => "server.pid",
    };
    test_support::stall::Stall::start(broker.name(), pid_file)
}

/// Restarts the column's PostgreSQL with `scripts/brokers restart postgres` (the server of
/// `RETRY_BROKERS_STATE`, the test command's by default) and returns how long it took. It refuses when
/// the server the script manages is not the one at `RETRY_TEST_POSTGRES`: restarting a server the
/// suite does not use would break whoever uses it and test nothing.
pub(crate) async fn restart_postgres(column: &Column) -> Result<Duration, String> {
    let script = root().join("scripts/brokers");
    let ours = column
        .postgres_url
        .as_deref()
        .ok_or("RETRY_TEST_POSTGRES is not set")?;
    let env = tokio::process::Command::new("bash")
        .arg(&script)
        .args(["env", "postgres"])
        .stderr(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| e.to_string())?;
    // Its plain URL or, started with TLS, its verify-full one.
    let managed: Vec<String> = String::from_utf8_lossy(&env.stdout)
        .lines()
        .filter_map(|l| {
            l.strip_prefix("export RETRY_TEST_POSTGRES=")
                .or_else(|| l.strip_prefix("export RETRY_TEST_POSTGRES_TLS="))
        })
        .map(|v| v.trim_matches('\'').to_string())
        .collect();
    if !managed.iter().any(|m| m == ours) {
        return Err(format!(
            "scripts/brokers manages PostgreSQL at {managed:?}, not RETRY_TEST_POSTGRES ({ours}): \
             set RETRY_BROKERS_STATE to the state folder of the server the suite uses"
        ));
    }
    let started = Instant::now();
    let status = tokio::process::Command::new("bash")
        .arg(&script)
        .args(["restart", "postgres"])
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err("scripts/brokers restart postgres failed".into());
    }
    Ok(started.elapsed())
}
