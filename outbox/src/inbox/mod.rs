//! The inbox: each event's effects happen once, even though every broker delivers at least once.
//!
//! A broker redelivers whatever it was not told was handled — after a crash, a lost acknowledgement, a
//! rebalance — so a handler runs some events twice. The inbox is a table of event ids already handled,
//! in the service's own database, used one of two ways:
//!
//! - **In the handler's transaction** ([`Inbox::record`]): the handler opens its transaction, records the
//!   event id in it, makes its change (and may enqueue follow-up events into the [`Outbox`](crate::Outbox)
//!   in the same transaction), and commits; the runtime acknowledges after the handler returns. The id
//!   commits with the change or rolls back with it, so a redelivery — even one after the process died
//!   between the commit and the acknowledgement — finds it and skips the change. Consume, change the
//!   database, publish: one atomic step.
//! - **As the consumer's [`IdempotencyStore`]** ([`ConsumerBuilder::idempotency`](event_retry_core::runtime::ConsumerBuilder::idempotency)):
//!   the runtime claims the id before the handler (with a lease, so a crashed holder's claim lapses) and
//!   marks it done after; for handlers whose effects are calls elsewhere. A process that dies after the
//!   effect and before the mark repeats it on redelivery: only the first way closes that window.
//!
//! Ids are kept per consumer name (two services sharing a database each handle an event once) and
//! forgotten after the retention ([`InboxBuilder::retention`], seven days unless told), which must
//! outlast any redelivery. A database that is down is a dependency outage, not a bad event: the errors
//! [`Inbox::record`] and [`database_error`] return state [`FailureKind::Blocking`], so consumption pauses
//! until it heals and nothing is dead-lettered for it.
//!
//! ```no_run
//! use event_retry::prelude::*;
//! use event_retry_outbox::{Inbox, Outbox, Record, database_error};
//!
//! #[derive(Clone)]
//! struct Billing { pool: sqlx::SqlitePool, inbox: Inbox, outbox: Outbox }
//!
//! async fn pay(State(b): State<Billing>, event: Event, ctx: Context) -> Result<(), HandlerError> {
//!     let mut tx = b.pool.begin().await.map_err(database_error)?;
//!     if b.inbox.record(&mut *tx, &ctx).await? == Record::AlreadyDone {
//!         return Ok(()); // a redelivery: its effects are committed already
//!     }
//!     sqlx::query("INSERT INTO ledger (payment) VALUES (?1)")
//!         .bind(ctx.event_id.to_string())
//!         .execute(&mut *tx)
//!         .await
//!         .map_err(database_error)?;
//!     b.outbox.enqueue(&mut *tx, "receipts", Event::new(event.payload.clone())).await?;
//!     tx.commit().await.map_err(database_error)?; // id, ledger row and receipt: all or none
//!     Ok(())
//! }
//!
//! # async fn demo(broker: event_retry::Broker) -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::SqlitePool::connect("sqlite:app.db").await?;
//! let inbox = Inbox::from_pool(pool.clone()).consumer("billing").connect().await?;
//! let outbox = Outbox::from_pool(pool.clone()).await?;
//! let billing = Billing { pool, inbox, outbox };
//! broker.consumer("payments").group("billing").start(handler_fn_with_state(billing, pay)).await?;
//! # Ok(()) }
//! ```

mod sql;

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use event_retry_core::classify::{FailureKind, HandlerError};
use event_retry_core::idempotency::{Begin, IdempotencyStore, StoreError};
use event_retry_core::runtime::Context;
use event_retry_core::time::Timestamp;
use futures::future::BoxFuture;

use crate::db::{Bind, DatabasePool, Db};
use crate::dialect::Dialect;
use crate::error::OutboxError;
use crate::store::ms;

pub use sql::TABLE;

/// Seven days: how long handled ids are remembered unless told otherwise.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a claim through the [`IdempotencyStore`] holds before another delivery may take it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// What [`Inbox::record`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "an event already done must not have its effects applied again"]
pub enum Record {
    /// The first time: the id is recorded in the caller's transaction; apply the effects, then commit.
    First,
    /// Already done by an earlier delivery: skip the effects (and return `Ok`, so it is acknowledged).
    AlreadyDone,
}

impl Record {
    /// `true` for [`Record::First`].
    pub fn is_first(self) -> bool {
        self == Record::First
    }
}

/// One consumer's inbox rows by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxCounts {
    /// Ids whose effects committed.
    pub done: u64,
    /// Ids a delivery holds through the idempotency store.
    pub in_progress: u64,
}

/// A database connection an id can be recorded on: PostgreSQL, SQLite, or either through sqlx's `Any`
/// driver; usually the inside of the handler's `sqlx::Transaction` (`&mut *tx`).
pub trait InboxConnection: Send {
    /// Marks `event_id` of `consumer` done at `now`; returns the rows affected (1 the first time).
    #[doc(hidden)]
    fn mark_done<'a>(
        &'a mut self,
        consumer: &'a str,
        event_id: &'a str,
        now: i64,
    ) -> BoxFuture<'a, Result<u64, sqlx::Error>>;
}

macro_rules! inbox_connection {
    ($conn:ty, $dialect:expr, $feature:literal) => {
        #[cfg(feature = $feature)]
        impl InboxConnection for $conn {
            fn mark_done<'a>(
                &'a mut self,
                consumer: &'a str,
                event_id: &'a str,
                now: i64,
            ) -> BoxFuture<'a, Result<u64, sqlx::Error>> {
                Box::pin(async move {
                    let dialect: Dialect = $dialect(&*self)?;
                    let done = sqlx::query(sql::sql(dialect, sql::DONE))
                        .bind(consumer)
                        .bind(event_id)
                        .bind(now)
                        .execute(&mut *self)
                        .await?;
                    Ok(done.rows_affected())
                })
            }
        }
    };
}

inbox_connection!(
    sqlx::SqliteConnection,
    |_: &sqlx::SqliteConnection| Ok::<_, sqlx::Error>(Dialect::Sqlite),
    "sqlite"
);
inbox_connection!(
    sqlx::PgConnection,
    |_: &sqlx::PgConnection| Ok::<_, sqlx::Error>(Dialect::Postgres),
    "postgres"
);
inbox_connection!(sqlx::AnyConnection, any_dialect, "any");

/// The dialect of a connection through sqlx's `Any` driver: its backend's.
#[cfg(feature = "any")]
fn any_dialect(conn: &sqlx::AnyConnection) -> Result<Dialect, sqlx::Error> {
    match conn.backend_name() {
        "SQLite" => Ok(Dialect::Sqlite),
        "PostgreSQL" => Ok(Dialect::Postgres),
        other => Err(sqlx::Error::Configuration(
            format!("the inbox runs on SQLite or PostgreSQL, not {other}").into(),
        )),
    }
}

/// Settings for an [`Inbox`]; [`InboxBuilder::connect`] opens it.
#[derive(Clone, Debug)]
pub struct InboxBuilder {
    source: Source,
    consumer: String,
    lease: Duration,
    retention: Duration,
    purge_every: Duration,
    max_connections: u32,
}

impl InboxBuilder {
    /// The consumer whose ids these are (`"default"` unless told): services or handlers sharing one
    /// database each need their own name, or one would skip the events the other handled.
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = name.into();
        self
    }

    /// How long an idempotency-store claim holds before another delivery may take it over (60 s unless
    /// told): longer than the handler's slowest run.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long done ids are remembered ([`DEFAULT_RETENTION`] unless told): longer than any
    /// redelivery can come (the retry policy's whole span, a DLQ replay).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How often the purge runs and the size gauges are refreshed (60 s unless told).
    pub fn purge_every(mut self, every: Duration) -> Self {
        self.purge_every = every.max(Duration::from_millis(10));
        self
    }

    /// At most this many connections in the inbox's own pool (8 unless told; [`Inbox::record`] uses the
    /// caller's connection instead; an inbox on the service's pool, [`Inbox::from_pool`], uses that
    /// pool's limit).
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Connects, creates the table if it is missing, and starts the purge (it stops when the last clone
    /// of the inbox is dropped).
    pub async fn connect(self) -> Result<Inbox, OutboxError> {
        if self.consumer.trim().is_empty() {
            return Err(OutboxError::Config(
                "the inbox consumer name is empty".into(),
            ));
        }
        let (db, url) = match self.source {
            Source::Url(url) => (Db::connect(&url, self.max_connections).await?, Some(url)),
            Source::Pool(db) => (db, None),
        };
        for statement in sql::schema() {
            db.execute(&statement, Vec::new())
                .await
                .map_err(OutboxError::db("create the inbox table"))?;
        }
        let inner = Arc::new(Inner {
            db,
            consumer: self.consumer,
            lease: self.lease,
            retention: self.retention,
            url,
        });
        tokio::spawn(purge_loop(Arc::downgrade(&inner), self.purge_every));
        Ok(Inbox { inner })
    }
}

/// The inbox in one database. Cheap to clone.
#[derive(Clone)]
pub struct Inbox {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    consumer: String,
    lease: Duration,
    retention: Duration,
    /// The URL it was opened from; `None` on the service's own pool.
    url: Option<String>,
}

/// Where an inbox's database comes from.
#[derive(Clone, Debug)]
enum Source {
    /// A URL: the inbox opens a pool of its own.
    Url(String),
    /// The service's own pool.
    Pool(Db),
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field(
                "url",
                &self
                    .inner
                    .url
                    .as_deref()
                    .map_or_else(|| "the service's pool".to_string(), crate::redact),
            )
            .field("consumer", &self.inner.consumer)
            .finish()
    }
}

impl Inbox {
    /// Settings for the inbox in the database at `url` (`sqlite:path/to/file.db`,
    /// `postgres://user@host/db`): name the consumer, then [`connect`](InboxBuilder::connect).
    pub fn builder(url: &str) -> InboxBuilder {
        Self::builder_on(Source::Url(url.to_string()))
    }

    /// Settings for the inbox on the service's own pool (a `sqlx::PgPool` or `sqlx::SqlitePool`):
    /// the inbox's statements share its connections, its TLS and its limits.
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use event_retry_outbox::Inbox;
    /// let inbox = Inbox::from_pool(pool.clone()).consumer("billing").connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn from_pool(pool: impl Into<DatabasePool>) -> InboxBuilder {
        Self::builder_on(Source::Pool(pool.into().0))
    }

    fn builder_on(source: Source) -> InboxBuilder {
        InboxBuilder {
            source,
            consumer: "default".into(),
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
            purge_every: Duration::from_secs(60),
            max_connections: 8,
        }
    }

    /// The inbox at `url` with every setting at its default.
    pub async fn connect(url: &str) -> Result<Self, OutboxError> {
        Self::builder(url).connect().await
    }

    /// Records the event `ctx` is handling as done, on `conn` — the inside of the handler's transaction
    /// (`&mut *tx`) — and tells whether this is the first time. On [`Record::First`] apply the effects on
    /// the same transaction and commit; on [`Record::AlreadyDone`] skip them and return `Ok`. Call it
    /// first in the transaction: on SQLite that makes the transaction a writer at once, so it waits its
    /// turn instead of failing on a stale read.
    ///
    /// A database error comes back stating [`FailureKind::Blocking`] (the handler's `?` hands it to the
    /// runtime, which pauses consumption until the database heals).
    pub async fn record<C: InboxConnection + ?Sized>(
        &self,
        conn: &mut C,
        ctx: &Context,
    ) -> Result<Record, HandlerError> {
        self.record_id(conn, &ctx.event_id).await
    }

    /// [`record`](Self::record) for an event id.
    pub async fn record_id<C: InboxConnection + ?Sized>(
        &self,
        conn: &mut C,
        event_id: &str,
    ) -> Result<Record, HandlerError> {
        let affected = conn
            .mark_done(&self.inner.consumer, event_id, ms(Timestamp::now()))
            .await
            .map_err(|source| {
                blocking(OutboxError::Database {
                    operation: "record the event in the inbox",
                    source,
                })
            })?;
        Ok(if affected > 0 {
            Record::First
        } else {
            Record::AlreadyDone
        })
    }

    /// Whether `event_id` is done (for tests and operators; a handler asks [`record`](Self::record)).
    pub async fn is_done(&self, event_id: &str) -> Result<bool, OutboxError> {
        Ok(self.state(event_id).await?.as_deref() == Some("DONE"))
    }

    /// Forgets this consumer's ids done more than the retention ago (and claims whose lease ended that long ago); returns
    /// how many rows went. The inbox runs this itself every minute.
    pub async fn purge(&self) -> Result<u64, OutboxError> {
        let cut_off =
            Timestamp::from_millis(Timestamp::now().as_millis().saturating_sub(
                u64::try_from(self.inner.retention.as_millis()).unwrap_or(u64::MAX),
            ));
        let binds = vec![
            Bind::Text(self.inner.consumer.clone()),
            Bind::Int(ms(cut_off)),
        ];
        let purged = self
            .inner
            .db
            .execute(sql::checked(sql::PURGE), binds)
            .await
            .map_err(OutboxError::db("purge the inbox"))?;
        crate::metrics::inbox_purged(&self.inner.consumer, purged);
        Ok(purged)
    }

    /// This consumer's rows by state.
    pub async fn counts(&self) -> Result<InboxCounts, OutboxError> {
        let rows = self
            .inner
            .db
            .fetch_all(
                sql::checked(sql::COUNTS),
                vec![Bind::Text(self.inner.consumer.clone())],
            )
            .await
            .map_err(OutboxError::db("count inbox rows"))?;
        let mut counts = InboxCounts::default();
        for row in rows {
            let state: String = row.get(0).map_err(OutboxError::db("read inbox counts"))?;
            let n: i64 = row.get(1).map_err(OutboxError::db("read inbox counts"))?;
            let n = u64::try_from(n).unwrap_or(0);
            match state.as_str() {
                "DONE" => counts.done += n,
                _ => counts.in_progress += n,
            }
        }
        Ok(counts)
    }

    async fn state(&self, event_id: &str) -> Result<Option<String>, OutboxError> {
        let binds = vec![
            Bind::Text(self.inner.consumer.clone()),
            Bind::Text(event_id.to_string()),
        ];
        let row = self
            .inner
            .db
            .fetch_optional(sql::checked(sql::STATE), binds)
            .await
            .map_err(OutboxError::db("read the inbox"))?;
        row.map(|row| row.get(0))
            .transpose()
            .map_err(OutboxError::db("read the inbox"))
    }

    async fn try_claim(&self, event_id: &str) -> Result<bool, OutboxError> {
        let now = Timestamp::now();
        let binds = vec![
            Bind::Text(self.inner.consumer.clone()),
            Bind::Text(event_id.to_string()),
            Bind::Int(ms(now.plus(self.inner.lease))),
            Bind::Int(ms(now)),
        ];
        let claimed = self
            .inner
            .db
            .execute(sql::checked(sql::CLAIM), binds)
            .await
            .map_err(OutboxError::db("claim the event in the inbox"))?;
        Ok(claimed > 0)
    }
}

/// The runtime's claim around the handler, in the database: survives restarts and spans processes.
#[async_trait]
impl IdempotencyStore for Inbox {
    async fn begin(&self, id: &str) -> Result<Begin, StoreError> {
        // A claim released between the failed insert and the read leaves no row: ask again (bounded, as
        // the claim and the release each take a statement).
        for _ in 0..3 {
            if self.try_claim(id).await.map_err(store_error)? {
                return Ok(Begin::Fresh);
            }
            match self.state(id).await.map_err(store_error)?.as_deref() {
                Some("DONE") => return Ok(Begin::Done),
                Some(_) => return Ok(Begin::InProgress),
                None => continue,
            }
        }
        Ok(Begin::InProgress)
    }

    async fn complete(&self, id: &str) -> Result<(), StoreError> {
        let binds = vec![
            Bind::Text(self.inner.consumer.clone()),
            Bind::Text(id.to_string()),
            Bind::Int(ms(Timestamp::now())),
        ];
        self.inner
            .db
            .execute(sql::checked(sql::DONE), binds)
            .await
            .map_err(|e| store_error(OutboxError::db("mark the event done in the inbox")(e)))?;
        Ok(())
    }

    async fn abandon(&self, id: &str) -> Result<(), StoreError> {
        let binds = vec![
            Bind::Text(self.inner.consumer.clone()),
            Bind::Text(id.to_string()),
        ];
        self.inner
            .db
            .execute(sql::checked(sql::RELEASE), binds)
            .await
            .map_err(|e| store_error(OutboxError::db("release the inbox claim")(e)))?;
        Ok(())
    }
}

/// A database error from the handler's own statements, stated [`FailureKind::Blocking`] when it means the
/// database is not there: a connection refused or lost, a pool that timed out or closed, or the server
/// saying it is shutting down, crashed, not accepting connections yet or out of connection slots (a
/// PostgreSQL restart reaches the connections it cut as SQLSTATE `57P01`). Anything else is left for
/// the classifier (a constraint the event breaks is the event's problem, not an outage).
/// For the handler's `pool.begin().await.map_err(database_error)?`.
pub fn database_error(error: sqlx::Error) -> HandlerError {
    if is_unreachable(&error) {
        HandlerError::blocking(error)
    } else {
        HandlerError::unclassified(error)
    }
}

/// Whether `error` says the database could not be reached, as opposed to refusing a statement.
fn is_unreachable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(e) => e.code().is_some_and(|code| server_gone(&code)),
        _ => false,
    }
}

/// Whether a SQLSTATE says the server is going, gone or not taking connections: class 08 (connection
/// exception), `57P01` admin_shutdown (a fast or smart shutdown, as in a restart, ends the session),
/// `57P02` crash_shutdown (another backend crashed; the server restarts), `57P03` cannot_connect_now
/// (starting up, shutting down, in recovery) and `53300` too_many_connections. SQLite's codes are
/// numbers without a leading zero: none of them matches.
fn server_gone(code: &str) -> bool {
    code.len() == 5
        && (code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300"))
}

/// The inbox's own statements failing means the database is not there for any event: blocking.
fn blocking(error: OutboxError) -> HandlerError {
    HandlerError::new(FailureKind::Blocking, error)
}

fn store_error(error: OutboxError) -> StoreError {
    StoreError(error.to_string())
}

/// Purges and refreshes the gauges every `every` while the inbox lives.
async fn purge_loop(inner: Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let inbox = Inbox { inner };
        if let Err(e) = inbox.purge().await {
            tracing::warn!(error = %e, "inbox purge failed");
        }
        match inbox.counts().await {
            Ok(counts) => {
                crate::metrics::inbox_gauges(&inbox.inner.consumer, counts.done, counts.in_progress)
            }
            Err(e) => tracing::warn!(error = %e, "inbox counts failed"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A database error with a SQLSTATE, as a driver reports one.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error with SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            "error"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn with_code(code: &'static str) -> Option<FailureKind> {
        database_error(sqlx::Error::Database(Box::new(Coded(code)))).stated_kind()
    }

    #[test]
    fn only_an_unreachable_database_is_blocking() {
        let down = database_error(sqlx::Error::PoolTimedOut);
        assert_eq!(down.stated_kind(), Some(FailureKind::Blocking));
        assert_eq!(
            database_error(sqlx::Error::PoolClosed).stated_kind(),
            Some(FailureKind::Blocking)
        );
        for kind in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::UnexpectedEof,
            std::io::ErrorKind::BrokenPipe,
        ] {
            let io = database_error(sqlx::Error::Io(std::io::Error::from(kind)));
            assert_eq!(io.stated_kind(), Some(FailureKind::Blocking), "{kind:?}");
        }
        let refused = database_error(sqlx::Error::RowNotFound);
        assert_eq!(refused.stated_kind(), None);
    }

    #[test]
    fn a_restart_cutting_the_session_is_an_outage_57p01() {
        // "terminating connection due to administrator command": a fast shutdown, as in a restart.
        assert_eq!(with_code("57P01"), Some(FailureKind::Blocking));
    }

    #[test]
    fn a_crash_of_another_backend_is_an_outage_57p02() {
        assert_eq!(with_code("57P02"), Some(FailureKind::Blocking));
    }

    #[test]
    fn a_server_starting_or_stopping_is_an_outage_57p03() {
        // "the database system is starting up", "… is shutting down", "… is in recovery mode".
        assert_eq!(with_code("57P03"), Some(FailureKind::Blocking));
    }

    #[test]
    fn no_connection_slot_is_an_outage_53300() {
        assert_eq!(with_code("53300"), Some(FailureKind::Blocking));
    }

    #[test]
    fn every_connection_exception_is_an_outage_class_08() {
        // connection_exception, connection_does_not_exist, connection_failure,
        // sqlclient_unable_to_establish_sqlconnection, sqlserver_rejected_establishment_of_sqlconnection,
        // transaction_resolution_unknown, protocol_violation.
        for code in [
            "08000", "08003", "08006", "08001", "08004", "08007", "08P01",
        ] {
            assert_eq!(with_code(code), Some(FailureKind::Blocking), "{code}");
        }
    }

    #[test]
    fn a_statement_the_database_refuses_is_left_to_the_classifier() {
        // unique_violation, foreign_key_violation, serialization_failure, deadlock_detected,
        // query_canceled, idle_in_transaction_session_timeout, database_dropped, and SQLite's
        // SQLITE_CONSTRAINT_UNIQUE (2067) and SQLITE_BUSY (5).
        for code in [
            "23505", "23503", "40001", "40P01", "57014", "25P03", "57P04", "2067", "5",
        ] {
            assert_eq!(with_code(code), None, "{code}");
        }
    }

    #[test]
    fn the_inbox_s_own_errors_are_blocking_and_say_what_failed() {
        let e = blocking(OutboxError::Database {
            operation: "record the event in the inbox",
            source: sqlx::Error::PoolTimedOut,
        });
        assert_eq!(e.stated_kind(), Some(FailureKind::Blocking));
        assert!(
            e.message().starts_with("record the event in the inbox: "),
            "{e}"
        );
        // The classifier honours the stated kind whatever its default.
        let kind = event_retry_core::classify::Classifier::new()
            .default_kind(FailureKind::NonRetryable)
            .classify(&e);
        assert_eq!(kind, FailureKind::Blocking);
    }

    #[test]
    fn the_sql_names_the_table_and_binds_by_number() {
        for statement in [
            sql::CLAIM,
            sql::DONE,
            sql::STATE,
            sql::RELEASE,
            sql::PURGE,
            sql::COUNTS,
        ] {
            let sqlite = sql::sql(Dialect::Sqlite, statement).0;
            assert!(sqlite.contains(TABLE));
            assert!(!sqlite.contains('$'), "{sqlite}");
        }
    }
}
