//! Consume, change the database, publish a follow-up — each exactly once, through a crash.
//!
//! ```text
//! cargo run --example inbox --features rabbitmq -- amqp://127.0.0.1:5672
//! cargo run --example inbox --features kafka -- kafka://127.0.0.1:19092
//! ```
//!
//! 200 payments are published. A consumer process (this example run again as a child) handles each in
//! one SQLite transaction: it records the payment's event id in the inbox, inserts a `ledger` row, and
//! enqueues a `receipts` event in the outbox; then it does 200 ms of work after the commit and before
//! the acknowledgement. The example SIGKILLs that process mid-stream, so the payments it had committed
//! but not acknowledged come again, and starts another; the inbox finds those ids already done and the
//! handler skips them. An outbox relay then publishes the receipts and a reader counts them. The counts
//! printed at the end show every ledger row and every receipt once, at least one redelivery skipped by
//! the inbox, and nothing left on the broker for the consumer's group (read with the broker's own
//! client); the example fails otherwise, and each wait has a deadline.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_retry::prelude::*;
use event_retry_outbox::{Inbox, Outbox, Record, database_error};
use sqlx::SqlitePool;
use sqlx::sqlite::SqlitePoolOptions;

/// Payments published.
const PAYMENTS: usize = 200;
/// The consumer is killed once this many ledger rows are committed.
const KILL_AT: i64 = 60;
/// The consumer's name: the broker's group and the inbox's consumer.
const GROUP: &str = "ledger";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, url, db, topic, receipts, calls] if flag == "--child" => {
            child(url, db, topic, receipts, Path::new(calls)).await
        }
        [url] => parent(url).await,
        _ => Err("usage: cargo run --example inbox --features rabbitmq -- amqp://127.0.0.1:5672 \
                  (a broker that outlives the consumer process: kafka://, amqp://, sqs://, pulsar://)"
            .into()),
    }
}

async fn parent(url: &str) -> Result<(), BoxError> {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let run = format!("{}-{}", std::process::id(), since_epoch.as_millis());
    let dir = std::env::temp_dir();
    let file = dir.join(format!("event-retry-inbox-example-{run}.db"));
    let db = format!("sqlite:{}?mode=rwc", file.display());
    let calls = dir.join(format!("event-retry-inbox-example-{run}.calls"));
    let (topic, receipts) = (format!("payments-{run}"), format!("receipts-{run}"));
    let pool = ledger_pool(&db).await?;
    let outbox = Outbox::connect(&db).await?;
    let broker = event_retry::connect(url).await?;
    broker.admin().declare(&topic, Some(GROUP)).await?;
    broker
        .admin()
        .declare(&receipts, Some("receipts-reader"))
        .await?;
    let shown = event_retry_outbox::redact(url);
    println!("database {db}\nbroker   {shown}: {PAYMENTS} payments to {topic}");
    let producer = broker.producer();
    for i in 0..PAYMENTS {
        let event =
            Event::new(format!(r#"{{"amount":{}}}"#, 100 + i)).with_id(format!("pay-{i:03}"));
        producer.publish(&topic, event).await?;
    }

    let spawn = || {
        std::process::Command::new(std::env::current_exe()?)
            .args(["--child", url, &db, &topic, &receipts])
            .arg(&calls)
            .spawn()
    };
    let mut first = spawn()?;
    let started = Instant::now();
    while ledger_rows(&pool).await? < KILL_AT {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = first.kill();
            return Err("the consumer committed too few payments in 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.kill()?; // SIGKILL: no shutdown, no acknowledgement of what was in flight
    first.wait()?;
    let at_kill = ledger_rows(&pool).await?;
    println!("killed the consumer with {at_kill} ledger rows committed; starting another");
    let mut second = spawn()?;
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(status) = second.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            let rows = ledger_rows(&pool).await?;
            return Err(format!(
                "the second consumer did not finish in 240 s ({rows} of {PAYMENTS} ledger rows)"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if !status.success() {
        return Err(format!("the second consumer failed: {status}").into());
    }
    // What the broker still holds for the group, read with its own client: a message left there would
    // be handled again by the next consumer.
    let source = broker.admin().names(&topic, Some(GROUP)).await?.topic;
    let left = raw_brokers::for_url(url)
        .await
        .map_err(|e| e.to_string())?
        .waiting(&source, GROUP)
        .await
        .map_err(|e| e.to_string())?;

    let relay = outbox.relay(broker.producer()).start()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while outbox.counts().await?.published < PAYMENTS as u64 {
        if Instant::now() > deadline {
            return Err("the relay did not publish every receipt in 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.shutdown().await?;
    let on_broker = read_receipts(&broker, &receipts).await?;

    let ledger: Vec<(String, i64)> =
        sqlx::query_as("SELECT payment, COUNT(*) FROM ledger GROUP BY payment")
            .fetch_all(&pool)
            .await?;
    let rows: i64 = ledger.iter().map(|(_, n)| n).sum();
    let calls_text = std::fs::read_to_string(&calls)?;
    let handler_calls = calls_text.lines().count();
    let skipped = calls_text
        .lines()
        .filter(|l| l.starts_with("skipped"))
        .count();
    let receipts_total: usize = on_broker.values().sum();
    println!();
    println!("payments published              {PAYMENTS}");
    println!("handler calls                   {handler_calls}");
    println!("redeliveries skipped (inbox)    {skipped}");
    println!("left on the broker (group)      {left}");
    println!(
        "ledger rows                     {rows} ({} payments)",
        ledger.len()
    );
    println!(
        "receipts enqueued (outbox)      {}",
        outbox.counts().await?.published
    );
    println!(
        "receipts read from the broker   {receipts_total} ({} distinct)",
        on_broker.len()
    );
    let _ = std::fs::remove_file(&calls);
    drop(pool);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    let once = |n: usize, total: usize| n == PAYMENTS && total == PAYMENTS;
    if !once(ledger.len(), rows as usize) || !once(on_broker.len(), receipts_total) {
        return Err("a side effect is missing or doubled".into());
    }
    // Without a skip no redelivery reached the inbox after a commit: "once" would prove nothing.
    if skipped == 0 {
        return Err("no redelivery was skipped by the inbox: the kill missed every commit".into());
    }
    if left > 0 {
        return Err(format!("the broker still holds {left} messages for '{GROUP}'").into());
    }
    println!("every payment's ledger row and receipt exactly once");
    Ok(())
}

/// The consumer process: handles payments until every one has its ledger row, then shuts down.
async fn child(
    url: &str,
    db: &str,
    topic: &str,
    receipts: &str,
    calls: &Path,
) -> Result<(), BoxError> {
    let broker = event_retry::connect(url).await?;
    let pool = ledger_pool(db).await?;
    let inbox = Inbox::builder(db).consumer(GROUP).connect().await?;
    let outbox = Outbox::connect(db).await?;
    let state = Arc::new(Payments {
        pool: pool.clone(),
        inbox,
        outbox,
        receipts: receipts.to_string(),
        calls: Mutex::new(calls.to_path_buf()),
    });
    let handle = broker
        .consumer(topic)
        .group(GROUP)
        .concurrency(8)
        .start(handler_fn(move |event: Event, ctx: Context| {
            let state = state.clone();
            async move { state.handle(event, ctx).await }
        }))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(180);
    while ledger_rows(&pool).await? < PAYMENTS as i64 {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {PAYMENTS} payments committed in 180 s",
                ledger_rows(&pool).await?
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Redeliveries of what the killed process held can still be on their way: let them come.
    tokio::time::sleep(Duration::from_secs(2)).await;
    handle.shutdown().await?;
    Ok(())
}

/// What the handler needs.
struct Payments {
    pool: SqlitePool,
    inbox: Inbox,
    outbox: Outbox,
    receipts: String,
    /// The calls log (a lock so lines never interleave).
    calls: Mutex<PathBuf>,
}

impl Payments {
    /// One transaction: the inbox record, the ledger row and the receipt event commit together.
    async fn handle(&self, event: Event, ctx: Context) -> Result<(), HandlerError> {
        let mut tx = self.pool.begin().await.map_err(database_error)?;
        if self.inbox.record(&mut *tx, &ctx).await? == Record::AlreadyDone {
            self.log("skipped", &ctx.event_id)?;
            return Ok(());
        }
        sqlx::query("INSERT INTO ledger (payment, body) VALUES (?1, ?2)")
            .bind(ctx.event_id.to_string())
            .bind(event.payload.to_vec())
            .execute(&mut *tx)
            .await
            .map_err(database_error)?;
        let receipt =
            Event::new(event.payload.clone()).with_id(format!("receipt-{}", ctx.event_id));
        self.outbox
            .enqueue(&mut *tx, &self.receipts, receipt)
            .await
            .map_err(HandlerError::non_retryable)?;
        tx.commit().await.map_err(database_error)?;
        self.log("first", &ctx.event_id)?;
        // Work after the commit (a notification, a slow response): the window a crash leaves open.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(())
    }

    fn log(&self, what: &str, id: &str) -> Result<(), HandlerError> {
        let path = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&*path)
            .map_err(HandlerError::blocking)?;
        writeln!(file, "{what} {id}").map_err(HandlerError::blocking)?;
        Ok(())
    }
}

async fn ledger_pool(db: &str) -> Result<SqlitePool, BoxError> {
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect(db)
        .await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS ledger (payment TEXT NOT NULL, body BLOB NOT NULL)")
        .execute(&pool)
        .await?;
    Ok(pool)
}

async fn ledger_rows(pool: &SqlitePool) -> Result<i64, BoxError> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM ledger")
        .fetch_one(pool)
        .await?)
}

/// Every receipt on the broker, by event id (read until all are there and a second passes quietly).
async fn read_receipts(broker: &Broker, topic: &str) -> Result<HashMap<String, usize>, BoxError> {
    let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let tally = seen.clone();
    let handle = broker
        .consumer(topic)
        .group("receipts-reader")
        .start(handler_fn(move |_e: Event, ctx: Context| {
            let tally = tally.clone();
            async move {
                *tally
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(ctx.event_id.to_string())
                    .or_default() += 1;
                Ok(())
            }
        }))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(90);
    while seen.lock().unwrap_or_else(|p| p.into_inner()).len() < PAYMENTS
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    handle.shutdown().await?;
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(seen)
}
