//! Writing an event into the outbox inside the caller's own transaction.
//!
//! The row is an `INSERT` on the caller's connection — the one its business change runs on — so the
//! event commits with that change or rolls back with it: nothing announced that did not happen, nothing
//! lost that did. On PostgreSQL the insert also queues a `NOTIFY`, which PostgreSQL delivers only if the
//! transaction commits, so relays wake for committed rows and never for rolled-back ones.

use std::sync::Arc;

use event_retry_core::event::Event;
use event_retry_core::metadata::{PACKED, PREFIX};
use event_retry_core::time::Timestamp;

use crate::dialect::Dialect;
use crate::error::OutboxError;
use crate::row::encode_headers;
#[cfg(feature = "postgres")]
use crate::store::CHANNEL;
use crate::store::{TABLE, ms};

/// What a commit of an enqueued row calls (the in-process wake of SQLite relays).
pub type OnCommit = Arc<dyn Fn() + Send + Sync>;

/// A database connection an event can be enqueued on: a PostgreSQL or SQLite connection, usually the
/// inside of the caller's `sqlx::Transaction` (`&mut *tx`).
pub trait OutboxConnection: Send {
    /// Inserts `row` into the outbox table; `on_commit` runs when the transaction commits (SQLite).
    #[doc(hidden)]
    fn insert_row<'a>(
        &'a mut self,
        row: &'a NewRow,
        on_commit: OnCommit,
    ) -> futures::future::BoxFuture<'a, Result<(), OutboxError>>;
}

/// A SQLite commit hook that calls `on_commit` once, at the first commit after it was set (a rollback
/// leaves it armed for the next commit, which then wakes the relays for nothing, harmlessly).
#[cfg(feature = "sqlite")]
fn commit_hook(on_commit: OnCommit) -> impl FnMut() -> bool + Send + 'static {
    use std::sync::atomic::{AtomicBool, Ordering};
    let armed = AtomicBool::new(true);
    move || {
        if armed.swap(false, Ordering::AcqRel) {
            on_commit();
        }
        true
    }
}

/// A row about to be inserted (what [`enqueue`] checked and prepared).
#[doc(hidden)]
#[derive(Debug)]
pub struct NewRow {
    event_id: String,
    topic: String,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    headers: String,
    now: i64,
}

const INSERT: &str = "INSERT INTO event_retry_outbox
    (event_id, topic, msg_key, payload, headers, state, attempts, replay_count, available_at, created_at)
    VALUES ($1, $2, $3, $4, $5, 'PENDING', 0, 0, $6, $6)";

macro_rules! outbox_connection {
    ($conn:ty, $dialect:expr, $arm:ident, $feature:literal) => {
        #[cfg(feature = $feature)]
        impl OutboxConnection for $conn {
            fn insert_row<'a>(
                &'a mut self,
                row: &'a NewRow,
                on_commit: OnCommit,
            ) -> futures::future::BoxFuture<'a, Result<(), OutboxError>> {
                Box::pin(async move {
                    debug_assert!(INSERT.contains(TABLE));
                    sqlx::query($dialect.sql(INSERT))
                        .bind(&row.event_id)
                        .bind(&row.topic)
                        .bind(row.key.as_deref())
                        .bind(&row.payload[..])
                        .bind(&row.headers)
                        .bind(row.now)
                        .execute(&mut *self)
                        .await
                        .map_err(|source| duplicate_or(source, &row.event_id))?;
                    $arm(self, on_commit).await
                })
            }
        }
    };
}

outbox_connection!(
    sqlx::SqliteConnection,
    Dialect::Sqlite,
    arm_sqlite,
    "sqlite"
);
outbox_connection!(
    sqlx::PgConnection,
    Dialect::Postgres,
    arm_postgres,
    "postgres"
);

/// SQLite: the commit of the caller's transaction wakes this process's relays.
#[cfg(feature = "sqlite")]
async fn arm_sqlite(
    conn: &mut sqlx::SqliteConnection,
    on_commit: OnCommit,
) -> Result<(), OutboxError> {
    conn.lock_handle()
        .await
        .map_err(OutboxError::db("arm the outbox commit hook"))?
        .set_commit_hook(commit_hook(on_commit));
    Ok(())
}

/// PostgreSQL: a `NOTIFY` in the caller's transaction, delivered to every listening relay on commit.
#[cfg(feature = "postgres")]
async fn arm_postgres(conn: &mut sqlx::PgConnection, _: OnCommit) -> Result<(), OutboxError> {
    sqlx::query(Dialect::Postgres.sql(&format!("SELECT pg_notify('{CHANNEL}', '')")))
        .execute(conn)
        .await
        .map_err(OutboxError::db("notify the outbox relays"))?;
    Ok(())
}

/// A unique-key violation on `event_id` is the caller's input, said in words; anything else is the
/// database's.
fn duplicate_or(source: sqlx::Error, event_id: &str) -> OutboxError {
    let unique = source
        .as_database_error()
        .is_some_and(|e| e.is_unique_violation());
    if unique {
        OutboxError::InvalidInput(format!("event id {event_id:?} is already in the outbox"))
    } else {
        OutboxError::Database {
            operation: "insert into the outbox",
            source,
        }
    }
}

/// Checks and inserts `event` for `topic` on `conn`; returns its event id.
pub(crate) async fn enqueue<C: OutboxConnection + ?Sized>(
    conn: &mut C,
    topic: &str,
    event: Event,
    on_commit: OnCommit,
) -> Result<String, OutboxError> {
    #[cfg(feature = "opentelemetry")]
    let (event, span) = {
        // The id the row will have, so the span names it.
        let id = event
            .id()
            .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string);
        let mut event = event.with_id(id.clone());
        let span = event_retry_core::trace_context::create_span(topic, &id, &mut event.headers);
        (event, span)
    };
    let row = prepare(topic, event, Timestamp::now())?;
    let inserted = conn.insert_row(&row, on_commit);
    #[cfg(feature = "opentelemetry")]
    let inserted =
        tracing::Instrument::instrument(inserted, span.unwrap_or_else(tracing::Span::none));
    inserted.await?;
    Ok(row.event_id)
}

fn prepare(topic: &str, event: Event, now: Timestamp) -> Result<NewRow, OutboxError> {
    if topic.trim().is_empty() {
        return Err(OutboxError::InvalidInput("the topic name is empty".into()));
    }
    if let Some((name, _)) = event
        .headers
        .iter()
        .find(|(n, _)| n.starts_with(PREFIX) || *n == PACKED)
    {
        return Err(OutboxError::InvalidInput(format!(
            "header {name:?} is in the SDK's metadata namespace ({PREFIX}*), which producers cannot write"
        )));
    }
    let event_id = event
        .id()
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string);
    Ok(NewRow {
        event_id,
        topic: topic.to_string(),
        key: event.key.as_ref().map(|k| k.to_vec()),
        payload: event.payload.to_vec(),
        headers: encode_headers(&event.headers),
        now: ms(now),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sdk_headers_and_empty_topics_are_refused() {
        let now = Timestamp::from_millis(5);
        let e = prepare(
            "t",
            Event::new("x").with_header("x-retry-attempts", "3"),
            now,
        )
        .unwrap_err();
        assert!(e.to_string().contains("x-retry-attempts"), "{e}");
        assert!(prepare(" ", Event::new("x"), now).is_err());
        let row = prepare("t", Event::new("x").with_id("e-1").with_key("k"), now).unwrap();
        assert_eq!(
            (row.event_id.as_str(), row.key.as_deref(), row.now),
            ("e-1", Some(&b"k"[..]), 5)
        );
        let fresh = prepare("t", Event::new("x"), now).unwrap();
        assert_eq!(fresh.event_id.len(), 36);
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn the_commit_hook_wakes_once_and_never_refuses_a_commit() {
        use std::sync::atomic::Ordering;
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let seen = calls.clone();
        let mut hook = commit_hook(Arc::new(move || {
            seen.fetch_add(1, Ordering::Relaxed);
        }));
        assert!(hook());
        assert!(hook());
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }
}
