//! The publish side of event-retry: a transactional outbox relayed to any broker.
//!
//! A service that changes its database and then publishes an event has two ways to get it wrong: publish
//! first and announce a change that may roll back, or commit first and lose the event when the broker is
//! down at that moment. The outbox closes both: the event is a row written **in the same transaction** as
//! the business change ([`Outbox::enqueue`]), and a relay publishes committed rows through the SDK's
//! [`Producer`], marking each published only after the broker confirmed
//! it.
//!
//! Every row carries the lifecycle of failed publish attempts: `available_at` (not published before),
//! `claimed_at` and `lease_until` (a relay's claim, which expires if the relay dies), `attempts`,
//! `last_error`, and a state — `PENDING`, `CLAIMED`, `PUBLISHED` or `DEAD` — moved only along the edges
//! of [`lifecycle`]. Failed publishes are retried on a policy in the SDK's DSL; a broker that is down
//! backs the whole relay off; a payload the broker refuses, or a spent policy, goes `DEAD` and is never
//! retried automatically; operators list, show, replay and purge rows ([`Outbox::list`],
//! [`Outbox::replay`], …, and `retryctl outbox`).
//!
//! SQLite is the embedded default (a file, no server); PostgreSQL serves many relays at once
//! (`FOR UPDATE SKIP LOCKED`, `LISTEN/NOTIFY`).
//!
//! The consuming side's counterpart is the [`Inbox`]: a consumer records each event id in its handler's
//! own transaction, so a redelivery finds the effects committed and skips them ([`inbox`]).
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use event_retry_outbox::{Outbox, RowFilter, State};
//! use event_retry_core::broker::Broker;
//! use event_retry_core::event::Event;
//! use sqlx::Connection;
//!
//! let file = std::env::temp_dir().join(format!("outbox-doc-{}.db", std::process::id()));
//! let url = format!("sqlite:{}", file.display());
//! let outbox = Outbox::connect(&url).await?;
//!
//! // The business change and the event, in one transaction.
//! let mut conn = sqlx::SqliteConnection::connect(&url).await?;
//! let mut tx = conn.begin().await?;
//! sqlx::query("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)").execute(&mut *tx).await?;
//! sqlx::query("INSERT INTO orders (id) VALUES (1)").execute(&mut *tx).await?;
//! outbox.enqueue(&mut *tx, "orders", Event::new(r#"{"id":1}"#).with_key("customer-7")).await?;
//! tx.commit().await?;
//!
//! // A relay publishes it (here to the in-memory broker) and marks it PUBLISHED.
//! let relay = outbox.relay(Broker::memory().producer()).start()?;
//! while outbox.counts().await?.published == 0 {
//!     tokio::time::sleep(std::time::Duration::from_millis(10)).await;
//! }
//! relay.shutdown().await?;
//! let rows = outbox.list(&RowFilter::state(State::Published)).await?;
//! assert_eq!(rows.len(), 1);
//! # drop(conn); let _ = std::fs::remove_file(&file);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
// On docs.rs, every feature-gated item names its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(not(any(feature = "postgres", feature = "sqlite")))]
compile_error!("event-retry-outbox needs a database: turn on its `postgres` or `sqlite` feature");

mod admin;
pub mod classify;
mod db;
mod dialect;
mod enqueue;
mod error;
pub mod inbox;
pub mod lifecycle;
pub mod metrics;
mod relay;
mod row;
mod store;
mod wake;

use std::fmt;
use std::sync::Arc;

use event_retry_core::event::Event;
use event_retry_core::producer::Producer;
use event_retry_core::time::Timestamp;

pub use admin::RowFilter;
pub use classify::PublishFailure;
pub use db::DatabasePool;
pub use dialect::Dialect;
pub use enqueue::{NewRow, OnCommit, OutboxConnection};
pub use error::OutboxError;
pub use inbox::{Inbox, InboxBuilder, InboxConnection, InboxCounts, Record, database_error};
pub use lifecycle::State;
pub use relay::{DEFAULT_POLICY, RelayBuilder, RelayHandle, RelayStats, Retention};
pub use row::OutboxRow;
pub use store::{CHANNEL, Counts, TABLE};

use db::Db;
use store::Store;
use wake::Wake;

/// An outbox in one database: enqueue events, start relays, and operate on rows. Cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    store: Store,
    wake: Wake,
    /// The URL it was opened from; `None` on the service's own pool.
    url: Option<String>,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = self
            .url
            .as_deref()
            .map_or_else(|| "the service's pool".to_string(), redact);
        f.debug_struct("Outbox").field("url", &url).finish()
    }
}

impl Outbox {
    /// Connects to the database at `url` (`sqlite:path/to/file.db`, `postgres://user@host/db`) and
    /// creates the outbox table if it is missing. A SQLite file that does not exist is created.
    pub async fn connect(url: &str) -> Result<Self, OutboxError> {
        Self::connect_with(url, 8).await
    }

    /// [`connect`](Self::connect) with at most `max_connections` in the outbox's own pool (relays and
    /// operator commands use it; `enqueue` uses the caller's connection).
    pub async fn connect_with(url: &str, max_connections: u32) -> Result<Self, OutboxError> {
        let db = Db::connect(url, max_connections.max(1)).await?;
        Self::open(db, Some(url.to_string())).await
    }

    /// The outbox on the service's own pool (a `sqlx::PgPool` or `sqlx::SqlitePool`): relays and
    /// operator commands share its connections, its TLS settings and its limits. Creates the outbox
    /// table if it is missing.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use event_retry_outbox::Outbox;
    /// let pool = sqlx::PgPool::connect("postgres://app@db/shop?sslmode=verify-full").await?;
    /// let outbox = Outbox::from_pool(pool.clone()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn from_pool(pool: impl Into<DatabasePool>) -> Result<Self, OutboxError> {
        Self::open(pool.into().0, None).await
    }

    async fn open(db: Db, url: Option<String>) -> Result<Self, OutboxError> {
        let wake = Wake::for_database(&db.identity());
        Ok(Self {
            store: Store::open(db).await?,
            wake,
            url,
        })
    }

    /// Which database this is.
    pub fn dialect(&self) -> Dialect {
        self.store.dialect()
    }

    /// Enqueues `event` for `topic` on `conn` — the inside of the caller's transaction (`&mut *tx`) — and
    /// returns its event id (the event's own, or a new UUID): the id every publish of it carries, for
    /// consumers to deduplicate on. The row commits or rolls back with the transaction; on commit the
    /// relays are woken.
    ///
    /// Refused before anything is written: an empty topic, a header in the SDK's namespace (`x-retry-*`),
    /// an event id already in the outbox.
    pub async fn enqueue<C: OutboxConnection + ?Sized>(
        &self,
        conn: &mut C,
        topic: &str,
        event: Event,
    ) -> Result<String, OutboxError> {
        let wake = self.wake.clone();
        enqueue::enqueue(conn, topic, event, Arc::new(move || wake.bump())).await
    }

    /// A relay publishing this outbox's rows through `producer`; configure it, then `start` it.
    pub fn relay(&self, producer: Producer) -> RelayBuilder {
        RelayBuilder::new(self.store.clone(), self.wake.clone(), producer)
    }

    /// The rows `filter` selects, in id order.
    pub async fn list(&self, filter: &RowFilter) -> Result<Vec<OutboxRow>, OutboxError> {
        admin::list(&self.store, filter).await
    }

    /// One row by id.
    pub async fn get(&self, id: i64) -> Result<OutboxRow, OutboxError> {
        admin::get(&self.store, id).await
    }

    /// Moves the `DEAD` rows `filter` selects back to `PENDING`, due now, with attempts restarted and
    /// the replay count raised; returns how many. A filter on another state, or a selected id that is not
    /// `DEAD`, is refused ([`OutboxError::Forbidden`]) and nothing changes.
    pub async fn replay(&self, filter: &RowFilter) -> Result<u64, OutboxError> {
        let replayed = admin::replay(&self.store, filter, Timestamp::now()).await?;
        if replayed > 0 {
            // Due now: wake this process's relays (PostgreSQL's were notified by the replay itself).
            self.wake.bump();
        }
        Ok(replayed)
    }

    /// Deletes the `DEAD` or `PUBLISHED` rows `filter` selects (it must name the state or the ids);
    /// returns how many. Waiting rows can never be purged.
    pub async fn purge(&self, filter: &RowFilter) -> Result<u64, OutboxError> {
        admin::purge(&self.store, filter).await
    }

    /// Rows by state, and the oldest waiting one.
    pub async fn counts(&self) -> Result<Counts, OutboxError> {
        self.store.counts().await
    }
}

/// `url` with its password replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &userinfo[..colon],
            &rest[at..]
        ),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/shop"),
            "postgres://app:***@db:5432/shop"
        );
        assert_eq!(redact("postgres://app@db/shop"), "postgres://app@db/shop");
        assert_eq!(redact("sqlite:outbox.db"), "sqlite:outbox.db");
        assert_eq!(redact("postgres://h/db?x=a@b"), "postgres://h/db?x=a@b");
    }
}

/// The README's Rust examples, compiled (and run, where not `no_run`) by `cargo test --doc`, so that the
/// code people copy from it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
