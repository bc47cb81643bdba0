//! The one way this crate opens a database: the outbox and the inbox share it, so both accept the same
//! URLs, create a missing SQLite file the same way and wait for a connection the same time.
//!
//! A SQLite file is switched to write-ahead logging (WAL) once: in its default rollback-journal mode a
//! writer shuts out every reader and each commit takes several `fsync`s, so handlers recording through
//! the inbox at once wait on each other. WAL keeps `synchronous = FULL` (SQLite's default): a commit is
//! on disk before it returns, so nothing acknowledged after it can be lost.

use std::time::Duration;

use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

use crate::dialect::Dialect;
use crate::error::OutboxError;

/// How long a statement waits for a free connection before it fails.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// A pool of at most `max_connections` to `url` (`sqlite:path`, `postgres://…`), and its dialect. A
/// SQLite file that does not exist is created, as an embedded default should.
pub(crate) async fn connect(
    url: &str,
    max_connections: u32,
) -> Result<(AnyPool, Dialect), OutboxError> {
    let dialect = Dialect::of_url(url)?;
    sqlx::any::install_default_drivers();
    let pool = AnyPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect(&with_create(url, dialect))
        .await
        .map_err(OutboxError::db("connect to the database"))?;
    if wants_wal(url, dialect) {
        use_wal(&pool, url).await;
    }
    Ok((pool, dialect))
}

/// Whether `url` names a SQLite file this crate may switch to WAL: not in memory, not read-only.
fn wants_wal(url: &str, dialect: Dialect) -> bool {
    dialect == Dialect::Sqlite
        && !url.contains(":memory:")
        && !url.contains("mode=memory")
        && !url.contains("mode=ro")
        && !url.contains("immutable=")
}

/// Switches the file to WAL (a setting the file keeps, so every later connection — the service's own
/// among them — uses it). The switch needs the file to itself; when another process holds it, the file
/// stays in its mode, which is only slower, and a warning says so.
async fn use_wal(pool: &AnyPool, url: &str) {
    match sqlx::query_scalar::<_, String>("PRAGMA journal_mode = WAL")
        .fetch_one(pool)
        .await
    {
        Ok(mode) if mode.eq_ignore_ascii_case("wal") => {}
        Ok(mode) => tracing::warn!(%url, %mode, "SQLite kept its journal mode instead of WAL"),
        Err(error) => {
            tracing::warn!(%url, %error, "SQLite could not switch to WAL; it keeps its journal mode")
        }
    }
}

/// `url` with `mode=rwc` added for a SQLite file, unless it names a mode or is in memory.
fn with_create(url: &str, dialect: Dialect) -> String {
    match dialect {
        Dialect::Sqlite if !url.contains("mode=") && !url.contains(":memory:") => {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}mode=rwc")
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_writable_sqlite_file_is_switched_to_wal() {
        assert!(wants_wal("sqlite:a.db", Dialect::Sqlite));
        assert!(wants_wal("sqlite:/x/a.db?mode=rwc", Dialect::Sqlite));
        assert!(!wants_wal("sqlite::memory:", Dialect::Sqlite));
        assert!(!wants_wal("sqlite:a.db?mode=ro", Dialect::Sqlite));
        assert!(!wants_wal("sqlite:a.db?immutable=true", Dialect::Sqlite));
        assert!(!wants_wal("postgres://h/db", Dialect::Postgres));
    }

    #[tokio::test]
    async fn a_sqlite_file_is_left_in_wal_mode() -> Result<(), Box<dyn std::error::Error>> {
        let dir =
            std::env::temp_dir().join(format!("outbox-wal-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        let url = format!("sqlite:{}", dir.join("a.db").display());
        let (pool, _) = connect(&url, 2).await?;
        pool.close().await;
        // A plain connection of its own, as a service's would be: the file says WAL.
        use sqlx::Connection;
        let mut own = sqlx::SqliteConnection::connect(&url).await?;
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut own)
            .await?;
        own.close().await?;
        std::fs::remove_dir_all(&dir)?;
        assert_eq!(mode.to_ascii_lowercase(), "wal");
        Ok(())
    }

    #[test]
    fn a_sqlite_file_is_created_unless_the_url_says_otherwise() {
        let sqlite = Dialect::Sqlite;
        assert_eq!(with_create("sqlite:a.db", sqlite), "sqlite:a.db?mode=rwc");
        assert_eq!(
            with_create("sqlite:a.db?cache=shared", sqlite),
            "sqlite:a.db?cache=shared&mode=rwc"
        );
        assert_eq!(
            with_create("sqlite:a.db?mode=ro", sqlite),
            "sqlite:a.db?mode=ro"
        );
        assert_eq!(with_create("sqlite::memory:", sqlite), "sqlite::memory:");
        assert_eq!(
            with_create("postgres://h/db", Dialect::Postgres),
            "postgres://h/db"
        );
    }
}
