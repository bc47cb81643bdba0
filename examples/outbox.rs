//! The transactional outbox on embedded SQLite — no server to install.
//!
//! Run it with `cargo run --example outbox`. Orders are written with their events in one transaction; a
//! relay publishes the committed events to an in-process broker that misbehaves on purpose: it drops the
//! first publish of one event (a connection reset) and refuses everything on `invoices` for a while (a
//! partition that is down). The timeline prints every row's fields by the lifecycle's names — `state`,
//! `attempts`, `available_at`, `claimed_at`, `last_error`, `replay_count` — each time one changes: an
//! event committed with its business row and published, a failed publish retried at its `available_at`,
//! a row going `DEAD` when its policy is spent and replayed by an operator, and a rolled-back order whose
//! event never exists.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use event_retry::error::{Error, Kind};
use event_retry::prelude::*;
use event_retry_core::adapter::{
    Admin, Capabilities, DlqSession, Published, Subscription, SubscriptionSpec, Transport,
};
use event_retry_outbox::{Outbox, OutboxRow, RowFilter, State};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!(
        "event-retry-outbox-example-{}.db",
        std::process::id()
    ));
    let url = format!("sqlite:{}", file.display());
    // The service's own pool: business rows and outbox rows commit together on its connections, and
    // the outbox's relay and operator commands share them.
    let db = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(
            url.parse::<SqliteConnectOptions>()?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal),
        )
        .await?;
    let outbox = Outbox::from_pool(db.clone()).await?;
    let started = Instant::now();
    println!("outbox: {url}");
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)")
        .execute(&db)
        .await?;

    let broker = Arc::new(FlakyBroker::new(Broker::memory()));
    let relay = outbox
        .relay(Producer::new(broker.clone()))
        .policy(RetryPolicy::parse("400ms x2")?)
        .start()?;

    // Three orders, each with its event, each in its own transaction.
    for (id, topic, key) in [
        (1, "orders", "customer-1"),
        (2, "orders", "flaky"),
        (3, "invoices", "customer-3"),
    ] {
        let mut tx = db.begin().await?;
        sqlx::query("INSERT INTO orders (id, total) VALUES (?1, ?2)")
            .bind(id)
            .bind(id * 100)
            .execute(&mut *tx)
            .await?;
        let event = Event::new(format!(r#"{{"order":{id}}}"#)).with_key(key);
        outbox.enqueue(&mut *tx, topic, event).await?;
        tx.commit().await?;
    }
    // A fourth order fails validation after its event was enqueued: the transaction rolls back, and so does
    // the event.
    let mut tx = db.begin().await?;
    sqlx::query("INSERT INTO orders (id, total) VALUES (4, -1)")
        .execute(&mut *tx)
        .await?;
    outbox
        .enqueue(&mut *tx, "orders", Event::new(r#"{"order":4}"#))
        .await?;
    tx.rollback().await?;
    println!("t+{:>6} order 4 rolled back with its event", since(started));

    let mut timeline = Timeline::default();
    timeline
        .until(&outbox, started, |rows| {
            rows.iter().any(|r| r.state == State::Dead)
                && rows.iter().filter(|r| r.state == State::Published).count() == 2
        })
        .await?;

    println!(
        "t+{:>6} invoices partition is back; an operator replays the DEAD row",
        since(started)
    );
    broker.heal();
    let replayed = outbox.replay(&RowFilter::state(State::Dead)).await?;
    println!("t+{:>6} replayed {replayed} row", since(started));
    timeline
        .until(&outbox, started, |rows| {
            rows.iter().all(|r| r.state == State::Published)
        })
        .await?;
    let stats = relay.shutdown().await?;

    let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(&db)
        .await?;
    let rows = outbox.list(&RowFilter::all()).await?;
    println!();
    println!(
        "orders committed: {orders}; outbox rows: {}; relay: {stats}",
        rows.len()
    );
    println!(
        "published to the broker: {}",
        broker.delivered.load(Ordering::Relaxed)
    );
    drop(db);
    let _ = std::fs::remove_file(&file);
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(())
}

fn since(started: Instant) -> String {
    format!("{:.2}s", started.elapsed().as_secs_f64())
}

/// Prints a row each time its state or attempts change.
#[derive(Default)]
struct Timeline {
    seen: HashMap<i64, (State, u32, u32)>,
}

impl Timeline {
    async fn until(
        &mut self,
        outbox: &Outbox,
        started: Instant,
        done: impl Fn(&[OutboxRow]) -> bool,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let rows = outbox.list(&RowFilter::all()).await?;
            for row in &rows {
                let now = (row.state, row.attempts, row.replay_count);
                if self.seen.insert(row.id, now) != Some(now) {
                    println!("t+{:>6} {}", since(started), describe(row, started));
                }
            }
            if done(&rows) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("the example did not finish within 20 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One row by the lifecycle's field names; times relative to the start of the example.
fn describe(row: &OutboxRow, started: Instant) -> String {
    let origin = event_retry_core::time::Timestamp::now().minus(started.elapsed());
    let at = |t: Option<event_retry_core::time::Timestamp>| {
        t.map_or("-".to_string(), |t| {
            format!("t+{:.2}s", t.since(origin).as_secs_f64())
        })
    };
    format!(
        "row {} {:<9} topic={:<8} state={:<9} attempts={} available_at={} claimed_at={} replay_count={} last_error={}",
        row.id,
        String::from_utf8_lossy(row.key.as_deref().unwrap_or_default()),
        row.topic,
        row.state,
        row.attempts,
        at(Some(row.available_at)),
        at(row.claimed_at),
        row.replay_count,
        row.last_error.as_deref().unwrap_or("-"),
    )
}

/// The in-memory broker, misbehaving on purpose: the first publish of key `flaky` is reset, and the
/// `invoices` partition refuses connections until healed.
struct FlakyBroker {
    inner: Broker,
    flaky_left: AtomicU32,
    invoices_down: AtomicBool,
    delivered: AtomicU32,
}

impl FlakyBroker {
    fn new(inner: Broker) -> Self {
        Self {
            inner,
            flaky_left: AtomicU32::new(1),
            invoices_down: AtomicBool::new(true),
            delivered: AtomicU32::new(0),
        }
    }

    fn heal(&self) {
        self.invoices_down.store(false, Ordering::Relaxed);
    }
}

#[async_trait]
impl Transport for FlakyBroker {
    fn name(&self) -> &'static str {
        "flaky-memory"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn publish(&self, topic: &str, event: &Event) -> Result<Published, Error> {
        if event.key.as_deref() == Some(b"flaky".as_slice())
            && self
                .flaky_left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(Error::new(Kind::Connection, "connection reset by peer")
                .with_operation(format!("publish to {topic}")));
        }
        if topic == "invoices" && self.invoices_down.load(Ordering::Relaxed) {
            return Err(
                Error::new(Kind::NotFound, "partition invoices-0 has no leader")
                    .with_operation(format!("publish to {topic}")),
            );
        }
        let published = self.inner.transport().publish(topic, event).await?;
        self.delivered.fetch_add(1, Ordering::Relaxed);
        Ok(published)
    }

    async fn subscribe(&self, spec: &SubscriptionSpec) -> Result<Box<dyn Subscription>, Error> {
        self.inner.transport().subscribe(spec).await
    }

    async fn open_dead_letters(&self, topic: &str) -> Result<Option<Box<dyn DlqSession>>, Error> {
        self.inner.transport().open_dead_letters(topic).await
    }

    fn admin(&self) -> &dyn Admin {
        self.inner.admin()
    }
}
