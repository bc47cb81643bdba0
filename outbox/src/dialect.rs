//! Which database the outbox lives in, and the one way its SQL differs between the two.
//!
//! Separate from the store because the database, the outbox table and the inbox all need it: the
//! database to open the one a URL names, the others to write their statements in its form.

use sqlx::AssertSqlSafe;

use crate::error::OutboxError;

/// Which database the outbox lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite (a file, embedded).
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

impl Dialect {
    /// The dialect of a database URL (`sqlite:` or `postgres://` / `postgresql://`).
    pub fn of_url(url: &str) -> Result<Self, OutboxError> {
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            "sqlite" => Ok(Dialect::Sqlite),
            "postgres" | "postgresql" => Ok(Dialect::Postgres),
            _ => Err(OutboxError::Config(format!(
                "the outbox database URL must start with sqlite: or postgres:// (got {scheme:?})"
            ))),
        }
    }

    /// The cargo feature of `event-retry-outbox` that compiles this database's driver.
    pub fn feature(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }

    /// `sql` with `$N` parameters in this dialect's form.
    pub(crate) fn sql(self, sql: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(match self {
            Dialect::Postgres => sql.to_string(),
            Dialect::Sqlite => sql.replace('$', "?"),
        })
    }
}
