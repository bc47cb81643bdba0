//! The side effects of a run: the consumer's handler writes one row per successful event through the
//! inbox (SQLite for the CI subset, PostgreSQL for the full matrix), and the harness counts them.

use std::collections::HashMap;
use std::path::Path;

use sqlx::Connection as _;

use crate::consume::SIDE_EFFECTS;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where the inbox and its side effects live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum InboxDb {
    /// An embedded SQLite file per run, under the output directory.
    #[default]
    Sqlite,
    /// A fresh database per run on the PostgreSQL of `RETRY_TEST_POSTGRES`.
    Postgres,
    /// No inbox: handler calls are counted, side effects are not.
    None,
}

/// A fresh, empty inbox database for the run `name` (`kafka-f2`); `None` without an inbox.
pub(crate) async fn fresh(db: InboxDb, out: &Path, name: &str) -> Result<Option<String>, BoxError> {
    match db {
        InboxDb::None => Ok(None),
        InboxDb::Sqlite => {
            let dir = out.join("inbox");
            std::fs::create_dir_all(&dir)?;
            // Absolute: the consumer may run elsewhere (a network namespace's shell).
            let file = std::fs::canonicalize(&dir)?.join(format!("{name}.db"));
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
            Ok(Some(format!("sqlite:{}?mode=rwc", file.display())))
        }
        InboxDb::Postgres => {
            let admin = test_support::broker::url("RETRY_TEST_POSTGRES")
                .ok_or("--inbox postgres needs RETRY_TEST_POSTGRES")?;
            let database = format!(
                "faults_{}_{}",
                name.replace('-', "_"),
                crate::record::now_ms() % 100_000_000
            );
            let mut conn = sqlx::PgConnection::connect(&admin).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
                .execute(&mut conn)
                .await?;
            // Through the server's Unix socket where its folder is known: a consumer in a network
            // namespace (F4) reaches it there, and the cut between it and the broker leaves it alone.
            let socket = test_support::broker::url("RETRY_TEST_POSTGRES_SOCKET")
                .map(|dir| format!("host={dir}"));
            Ok(Some(test_support::broker::postgres_database(
                &admin,
                &database,
                socket.as_deref(),
            )))
        }
    }
}

/// Side-effect rows per event id, read with plain SQL.
pub(crate) async fn count(url: &str) -> Result<HashMap<String, usize>, BoxError> {
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(url).await?;
    let rows: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT event, COUNT(*) FROM {SIDE_EFFECTS} GROUP BY event"
    )))
    .fetch_all(&mut conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, n)| (id, usize::try_from(n).unwrap_or(0)))
        .collect())
}

/// Distinct events with a side effect, and rows beyond one per event.
pub(crate) fn tally(rows: &HashMap<String, usize>) -> (usize, usize) {
    let total: usize = rows.values().sum();
    (rows.len(), total - rows.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_rows_beyond_one_per_event() {
        let rows = HashMap::from([("a".to_string(), 1), ("b".to_string(), 3)]);
        assert_eq!(tally(&rows), (2, 2));
        assert_eq!(tally(&HashMap::new()), (0, 0));
    }
}
