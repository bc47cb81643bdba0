//! The one way this crate opens a database: the outbox and the inbox share it, so both accept the same
//! URLs, create a missing SQLite file the same way and wait for a connection the same time.

use std::time::Duration;

use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

use crate::error::OutboxError;
use crate::store::Dialect;

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
    Ok((pool, dialect))
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
