//! The database the outbox and the inbox run on: a PostgreSQL or a SQLite pool — the service's own
//! (`from_pool`) or one opened from a URL — and the three ways this crate runs a statement on it.
//!
//! Each database is a cargo feature (`postgres`, `sqlite`), so a service on one compiles only its
//! driver. Statements are written once, with `$N` parameters (turned into SQLite's `?N` form), and
//! their parameters are [`Bind`] values, so the store and the inbox never name a driver.
//!
//! A SQLite file this crate opens is switched to write-ahead logging (WAL) once: in its default
//! rollback-journal mode a writer shuts out every reader and each commit takes several `fsync`s, so
//! handlers recording through the inbox at once wait on each other. WAL keeps `synchronous = FULL`
//! (SQLite's default): a commit is on disk before it returns, so nothing acknowledged after it can be
//! lost. A pool the service hands over is used as it is.

use std::time::Duration;

use sqlx::AssertSqlSafe;

use crate::dialect::Dialect;
use crate::error::OutboxError;

/// How long a statement waits for a free connection before it fails.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// A pool of one of the databases this crate runs on.
#[derive(Clone, Debug)]
pub(crate) enum Db {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
}

/// The service's own pool, for [`Outbox::from_pool`](crate::Outbox::from_pool) and
/// [`Inbox::from_pool`](crate::Inbox::from_pool): a `sqlx::PgPool` or a `sqlx::SqlitePool` converts
/// into it.
#[derive(Clone, Debug)]
pub struct DatabasePool(pub(crate) Db);

#[cfg(feature = "postgres")]
impl From<sqlx::PgPool> for DatabasePool {
    fn from(pool: sqlx::PgPool) -> Self {
        DatabasePool(Db::Postgres(pool))
    }
}

#[cfg(feature = "sqlite")]
impl From<sqlx::SqlitePool> for DatabasePool {
    fn from(pool: sqlx::SqlitePool) -> Self {
        DatabasePool(Db::Sqlite(pool))
    }
}

/// A statement parameter.
#[derive(Clone, Debug)]
pub(crate) enum Bind {
    Int(i64),
    OptInt(Option<i64>),
    Text(String),
    Bytes(Vec<u8>),
}

/// A row read back; its columns by name or position ([`Column`]).
pub(crate) enum DbRow {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::postgres::PgRow),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::sqlite::SqliteRow),
}

/// Where a column is: by name or by position.
#[derive(Clone, Copy, Debug)]
pub(crate) enum At {
    Name(&'static str),
    Pos(usize),
}

impl From<&'static str> for At {
    fn from(name: &'static str) -> Self {
        At::Name(name)
    }
}

impl From<usize> for At {
    fn from(pos: usize) -> Self {
        At::Pos(pos)
    }
}

/// A value a column decodes into on every database this build has.
pub(crate) trait Column: Sized {
    /// The value at `at` of `row`.
    fn read(row: &DbRow, at: At) -> Result<Self, sqlx::Error>;
}

macro_rules! column {
    ($($t:ty),*) => {$(
        impl Column for $t {
            fn read(row: &DbRow, at: At) -> Result<Self, sqlx::Error> {
                use sqlx::Row as _;
                match (row, at) {
                    #[cfg(feature = "postgres")]
                    (DbRow::Postgres(r), At::Name(n)) => r.try_get(n),
                    #[cfg(feature = "postgres")]
                    (DbRow::Postgres(r), At::Pos(i)) => r.try_get(i),
                    #[cfg(feature = "sqlite")]
                    (DbRow::Sqlite(r), At::Name(n)) => r.try_get(n),
                    #[cfg(feature = "sqlite")]
                    (DbRow::Sqlite(r), At::Pos(i)) => r.try_get(i),
                }
            }
        }
    )*};
}

column!(
    i64,
    Option<i64>,
    String,
    Option<String>,
    Vec<u8>,
    Option<Vec<u8>>
);

impl DbRow {
    /// The column at `at` as a `T`.
    pub(crate) fn get<T: Column>(&self, at: impl Into<At>) -> Result<T, sqlx::Error> {
        T::read(self, at.into())
    }
}

/// Binds `binds` to `query`, in order.
macro_rules! bind_all {
    ($query:expr, $binds:expr) => {{
        let mut query = $query;
        for bind in $binds {
            query = match bind {
                Bind::Int(v) => query.bind(v),
                Bind::OptInt(v) => query.bind(v),
                Bind::Text(v) => query.bind(v),
                Bind::Bytes(v) => query.bind(v),
            };
        }
        query
    }};
}

impl Db {
    /// A pool of at most `max_connections` to `url` (`sqlite:path`, `postgres://…`). A SQLite file
    /// that does not exist is created, as an embedded default should. A URL of a database this build
    /// was compiled without is a configuration error naming the feature.
    pub(crate) async fn connect(url: &str, max_connections: u32) -> Result<Self, OutboxError> {
        let max = max_connections.max(1);
        match Dialect::of_url(url)? {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => sqlx::postgres::PgPoolOptions::new()
                .max_connections(max)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect(url)
                .await
                .map(Db::Postgres)
                .map_err(OutboxError::db("connect to the database")),
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => {
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(max)
                    .acquire_timeout(ACQUIRE_TIMEOUT)
                    .connect(&with_create(url))
                    .await
                    .map_err(OutboxError::db("connect to the database"))?;
                if wants_wal(url) {
                    use_wal(&pool, url).await;
                }
                Ok(Db::Sqlite(pool))
            }
            #[allow(unreachable_patterns)]
            other => Err(OutboxError::Config(format!(
                "this build has no {other:?} support: turn on the event-retry-outbox feature `{}`",
                other.feature()
            ))),
        }
    }

    /// Which database this is.
    pub(crate) fn dialect(&self) -> Dialect {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(_) => Dialect::Postgres,
            #[cfg(feature = "sqlite")]
            Db::Sqlite(_) => Dialect::Sqlite,
        }
    }

    /// A key naming the database, the same for every pool of it in this process: the in-process wake
    /// of SQLite relays is shared by it.
    pub(crate) fn identity(&self) -> String {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(pool) => {
                let o = pool.connect_options();
                format!(
                    "postgres://{}:{}/{}",
                    o.get_host(),
                    o.get_port(),
                    o.get_database().unwrap_or_default()
                )
            }
            #[cfg(feature = "sqlite")]
            Db::Sqlite(pool) => {
                let name = pool.connect_options().get_filename().to_path_buf();
                let name = std::fs::canonicalize(&name).unwrap_or(name);
                format!("sqlite:{}", name.display())
            }
        }
    }

    /// `sql` (with `$N` parameters) in this database's form.
    fn text(&self, sql: &str) -> AssertSqlSafe<String> {
        self.dialect().sql(sql)
    }

    /// Runs a statement; returns the rows it changed.
    pub(crate) async fn execute(&self, sql: &str, binds: Vec<Bind>) -> Result<u64, sqlx::Error> {
        let text = self.text(sql);
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(pool) => Ok(bind_all!(sqlx::query(text), binds)
                .execute(pool)
                .await?
                .rows_affected()),
            #[cfg(feature = "sqlite")]
            Db::Sqlite(pool) => Ok(bind_all!(sqlx::query(text), binds)
                .execute(pool)
                .await?
                .rows_affected()),
        }
    }

    /// Runs a query; returns its rows.
    pub(crate) async fn fetch_all(
        &self,
        sql: &str,
        binds: Vec<Bind>,
    ) -> Result<Vec<DbRow>, sqlx::Error> {
        let text = self.text(sql);
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(pool) => Ok(bind_all!(sqlx::query(text), binds)
                .fetch_all(pool)
                .await?
                .into_iter()
                .map(DbRow::Postgres)
                .collect()),
            #[cfg(feature = "sqlite")]
            Db::Sqlite(pool) => Ok(bind_all!(sqlx::query(text), binds)
                .fetch_all(pool)
                .await?
                .into_iter()
                .map(DbRow::Sqlite)
                .collect()),
        }
    }

    /// Runs a query; returns its first row, if any.
    pub(crate) async fn fetch_optional(
        &self,
        sql: &str,
        binds: Vec<Bind>,
    ) -> Result<Option<DbRow>, sqlx::Error> {
        let text = self.text(sql);
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(pool) => Ok(bind_all!(sqlx::query(text), binds)
                .fetch_optional(pool)
                .await?
                .map(DbRow::Postgres)),
            #[cfg(feature = "sqlite")]
            Db::Sqlite(pool) => Ok(bind_all!(sqlx::query(text), binds)
                .fetch_optional(pool)
                .await?
                .map(DbRow::Sqlite)),
        }
    }

    /// A connection listening on `channel` (PostgreSQL), or `None` on SQLite. The connection is one
    /// of its own, opened with the pool's settings (its host, credentials and TLS): a listener holds
    /// its connection for as long as the relay runs, and taking it from the pool would leave the
    /// relay's statements — or, on the service's pool, the service — one connection short.
    #[cfg(feature = "postgres")]
    pub(crate) async fn listen(
        &self,
        channel: &str,
    ) -> Option<Result<sqlx::postgres::PgListener, sqlx::Error>> {
        match self {
            Db::Postgres(pool) => Some(
                async {
                    let own = sqlx::postgres::PgPoolOptions::new()
                        .max_connections(1)
                        .max_lifetime(None)
                        .idle_timeout(None)
                        .acquire_timeout(ACQUIRE_TIMEOUT)
                        .connect_lazy_with((*pool.connect_options()).clone());
                    let mut listener = sqlx::postgres::PgListener::connect_with(&own).await?;
                    listener.listen(channel).await?;
                    Ok(listener)
                }
                .await,
            ),
            #[cfg(feature = "sqlite")]
            Db::Sqlite(_) => None,
        }
    }
}

/// Whether `url` names a SQLite file this crate may switch to WAL: not in memory, not read-only.
#[cfg(feature = "sqlite")]
fn wants_wal(url: &str) -> bool {
    !url.contains(":memory:")
        && !url.contains("mode=memory")
        && !url.contains("mode=ro")
        && !url.contains("immutable=")
}

/// Switches the file to WAL (a setting the file keeps, so every later connection — the service's own
/// among them — uses it). The switch needs the file to itself; when another process holds it, the file
/// stays in its mode, which is only slower, and a warning says so.
#[cfg(feature = "sqlite")]
async fn use_wal(pool: &sqlx::SqlitePool, url: &str) {
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

/// A SQLite `url` with `mode=rwc` added, unless it names a mode or is in memory.
#[cfg(feature = "sqlite")]
fn with_create(url: &str) -> String {
    if !url.contains("mode=") && !url.contains(":memory:") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}mode=rwc")
    } else {
        url.to_string()
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    #[test]
    fn only_a_writable_sqlite_file_is_switched_to_wal() {
        assert!(wants_wal("sqlite:a.db"));
        assert!(wants_wal("sqlite:/x/a.db?mode=rwc"));
        assert!(!wants_wal("sqlite::memory:"));
        assert!(!wants_wal("sqlite:a.db?mode=ro"));
        assert!(!wants_wal("sqlite:a.db?immutable=true"));
    }

    #[tokio::test]
    async fn a_sqlite_file_is_left_in_wal_mode() -> Result<(), Box<dyn std::error::Error>> {
        let dir =
            std::env::temp_dir().join(format!("outbox-wal-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        let url = format!("sqlite:{}", dir.join("a.db").display());
        let Db::Sqlite(pool) = Db::connect(&url, 2).await? else {
            return Err("not a SQLite pool".into());
        };
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
        assert_eq!(with_create("sqlite:a.db"), "sqlite:a.db?mode=rwc");
        assert_eq!(
            with_create("sqlite:a.db?cache=shared"),
            "sqlite:a.db?cache=shared&mode=rwc"
        );
        assert_eq!(with_create("sqlite:a.db?mode=ro"), "sqlite:a.db?mode=ro");
        assert_eq!(with_create("sqlite::memory:"), "sqlite::memory:");
    }

    #[tokio::test]
    async fn pools_of_one_file_share_one_identity() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("outbox-id-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        let url = format!("sqlite:{}", dir.join("a.db").display());
        let ours = Db::connect(&url, 1).await?;
        let theirs = Db::Sqlite(sqlx::SqlitePool::connect(&url).await?);
        assert_eq!(ours.identity(), theirs.identity());
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
