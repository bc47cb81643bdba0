//! The inbox table and its statements, for SQLite and PostgreSQL.
//!
//! One row per (consumer, event id): `IN_PROGRESS` while a delivery holds it (with a lease that lets a
//! crashed holder's claim lapse), `DONE` once the event's effects committed. Every write is one
//! statement — an `INSERT … ON CONFLICT DO UPDATE … WHERE` whose affected-row count is the answer — so
//! two deliveries racing for one id cannot both win: on PostgreSQL the second insert waits on the unique
//! key until the first transaction ends, on SQLite writers take turns.

use sqlx::AssertSqlSafe;

use crate::dialect::Dialect;

/// The inbox table.
pub const TABLE: &str = "event_retry_inbox";

/// The statements creating the table and its purge index (idempotent).
pub(super) fn schema() -> [String; 2] {
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (
                consumer TEXT NOT NULL,
                event_id TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN ('IN_PROGRESS', 'DONE')),
                lease_until BIGINT,
                created_at BIGINT NOT NULL,
                done_at BIGINT,
                PRIMARY KEY (consumer, event_id)
            )"
        ),
        format!("CREATE INDEX IF NOT EXISTS {TABLE}_age ON {TABLE} (state, done_at, lease_until)"),
    ]
}

/// Claims an id for a delivery: inserted `IN_PROGRESS`, or taken over when the holder's lease lapsed.
/// Binds: consumer, event id, lease end, now. One row affected: the claim is the caller's.
pub(super) const CLAIM: &str =
    "INSERT INTO event_retry_inbox (consumer, event_id, state, lease_until, created_at)
    VALUES ($1, $2, 'IN_PROGRESS', $3, $4)
    ON CONFLICT (consumer, event_id) DO UPDATE SET lease_until = $3
    WHERE event_retry_inbox.state = 'IN_PROGRESS' AND event_retry_inbox.lease_until <= $4";

/// Records an id done: inserted `DONE`, or an `IN_PROGRESS` claim completed. Binds: consumer, event id,
/// now. One row affected: this is the first time; none: it was already done.
pub(super) const DONE: &str =
    "INSERT INTO event_retry_inbox (consumer, event_id, state, created_at, done_at)
    VALUES ($1, $2, 'DONE', $3, $3)
    ON CONFLICT (consumer, event_id) DO UPDATE SET state = 'DONE', done_at = $3, lease_until = NULL
    WHERE event_retry_inbox.state = 'IN_PROGRESS'";

/// The state of one id. Binds: consumer, event id.
pub(super) const STATE: &str =
    "SELECT state FROM event_retry_inbox WHERE consumer = $1 AND event_id = $2";

/// Gives up a claim. Binds: consumer, event id.
pub(super) const RELEASE: &str = "DELETE FROM event_retry_inbox
    WHERE consumer = $1 AND event_id = $2 AND state = 'IN_PROGRESS'";

/// Forgets a consumer's ids done before a time, and its claims whose lease ended before it. Binds:
/// consumer, the cut-off.
pub(super) const PURGE: &str = "DELETE FROM event_retry_inbox WHERE consumer = $1
    AND ((state = 'DONE' AND done_at < $2) OR (state = 'IN_PROGRESS' AND lease_until < $2))";

/// A consumer's rows by state. Binds: consumer.
pub(super) const COUNTS: &str =
    "SELECT state, COUNT(*) FROM event_retry_inbox WHERE consumer = $1 GROUP BY state";

/// `sql` in `dialect`'s parameter form (for a caller's connection).
pub(super) fn sql(dialect: Dialect, sql: &str) -> AssertSqlSafe<String> {
    debug_assert!(sql.contains(TABLE));
    dialect.sql(sql)
}

/// `sql` as it is, for the inbox's own pool (which puts it in its dialect's form).
pub(super) fn checked(sql: &str) -> &str {
    debug_assert!(sql.contains(TABLE));
    sql
}
