//! The inbox scenarios: an event's database effects happen once, through a crash between the commit and
//! the broker's acknowledgement, through a rolled-back attempt and through a restart of PostgreSQL (the
//! consumer holds; nothing is dead-lettered). Effects are rows of an `effects` table
//! with no unique key, so a repeated effect is a second row, read back with plain SQL.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_retry::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::idempotency::{Begin, IdempotencyStore};
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{Context, handler_fn};
use event_retry_outbox::{Inbox, Record, database_error};
use raw_brokers::{RawBroker, RawKafka, RawRabbit};
use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

use crate::Scenario;
use crate::fixture::{BrokerKind, Column, Db, fresh_db, fresh_topic, restart_postgres, root};

/// The inbox scenarios, run in every column of the suite.
pub(crate) const ALL: &[Scenario] = &[
    Scenario {
        name: "inbox_records_each_id_once",
        restarts_database: false,
        title: "inbox: an id recorded in a committed transaction is already done for the next; a rolled-back record leaves no row; two transactions racing for one id: one first; consumers apart; claims lease, release, complete; purge after the retention",
        run: |c| block_on(records_each_id_once(c)),
        skip: |_| None,
    },
    Scenario {
        name: "inbox_consumer_killed_between_commit_and_ack",
        restarts_database: false,
        title: "inbox: a consumer SIGKILLed after its handler's commit and before the ack: the redelivery is recorded already done and skips the effect; every event's effect row once, nothing left on the broker",
        run: |c| block_on(killed_between_commit_and_ack(c)),
        skip: |_| None,
    },
    Scenario {
        name: "inbox_rolled_back_attempt_is_retried",
        restarts_database: false,
        title: "inbox: a handler failing after its record rolls back: no effect row and no inbox row remain, the retry through the broker records first time and commits one effect",
        run: |c| block_on(rolled_back_attempt_is_retried(c)),
        skip: |_| None,
    },
    Scenario {
        name: "inbox_idempotency_across_processes",
        restarts_database: false,
        title: "inbox as the idempotency store of two consumer processes on one queue: every event published twice back to back, then all again; each effect once, every copy skipped by the inbox, both processes at work",
        run: |c| block_on(idempotency_across_processes(c)),
        skip: |c| {
            (c.broker == BrokerKind::Kafka).then_some(
                "two members of one Kafka group split it by partition, not message by message: the two processes share a RabbitMQ queue",
            )
        },
    },
    Scenario {
        name: "inbox_database_restarted_under_consumer",
        restarts_database: true,
        title: "inbox: PostgreSQL restarted under a consumer whose policy dead-letters the first failure taken for the event's, transactions open: every error of the database going away holds the consumer (held while it is gone), no retry spent, nothing dead-lettered, each event's effect row once",
        run: |c| block_on(database_restarted_under_consumer(c)),
        skip: |c| match (c.db, c.broker) {
            (Db::Sqlite, _) => Some("SQLite is embedded: there is no server to restart"),
            (_, BrokerKind::Kafka) => Some(
                "the consumer reads the in-process broker (the database is what fails): run once, in the RabbitMQ column",
            ),
            _ => None,
        },
    },
];

/// The consumer name (and group) of every inbox scenario.
const GROUP: &str = "inbox-suite";

fn block_on(
    f: impl std::future::Future<Output = Result<String, String>>,
) -> Result<String, String> {
    test_support::broker::runtime()?.block_on(f)
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The handler's own pool on the scenario's database, with the `effects` table created.
async fn effects_pool(db_url: &str) -> Result<AnyPool, String> {
    sqlx::any::install_default_drivers();
    let pool = AnyPoolOptions::new()
        .max_connections(4)
        .connect(db_url)
        .await
        .map_err(|e| format!("connect {db_url}: {e}"))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS effects (event_id TEXT NOT NULL, attempt BIGINT NOT NULL)",
    )
    .execute(&pool)
    .await
    .map_err(text)?;
    Ok(pool)
}

/// The handler's effect: a row of `effects`, on the handler's transaction.
async fn insert_effect(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    ctx: &Context,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO effects (event_id, attempt) VALUES ($1, $2)")
        .bind(ctx.event_id.to_string())
        .bind(i64::from(ctx.attempt))
        .execute(&mut **tx)
        .await
        .map_err(database_error)?;
    Ok(())
}

/// Effect rows per event id, read with plain SQL.
async fn effects(pool: &AnyPool) -> Result<BTreeMap<String, i64>, String> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT event_id, COUNT(*) FROM effects GROUP BY event_id")
            .fetch_all(pool)
            .await
            .map_err(text)?;
    Ok(rows.into_iter().collect())
}

/// A SQLite URL with the file created (the inbox creates its own; the handler's pool may come first).
fn create_mode(db_url: &str) -> String {
    if db_url.starts_with("sqlite:") && !db_url.contains("mode=") {
        format!("{db_url}?mode=rwc")
    } else {
        db_url.to_string()
    }
}

/// Records `id` in a transaction of its own on `pool`, then commits it or rolls it back.
async fn record_then(
    pool: &AnyPool,
    inbox: &Inbox,
    id: &str,
    commit: bool,
) -> Result<Record, String> {
    let mut tx = pool.begin().await.map_err(text)?;
    let record = inbox.record_id(&mut *tx, id).await.map_err(text)?;
    if commit {
        tx.commit().await.map_err(text)?;
    } else {
        tx.rollback().await.map_err(text)?;
    }
    Ok(record)
}

async fn records_each_id_once(column: Column) -> Result<String, String> {
    let db_url = fresh_db(&column).await?;
    let inbox = Inbox::builder(&db_url)
        .consumer("billing")
        .lease(Duration::from_millis(300))
        .retention(Duration::from_millis(400))
        .connect()
        .await
        .map_err(text)?;
    let pool = effects_pool(&db_url).await?;

    // Committed: the next transaction finds it done.
    let first = record_then(&pool, &inbox, "e1", true).await?;
    let again = record_then(&pool, &inbox, "e1", false).await?;
    ensure(
        (first, again) == (Record::First, Record::AlreadyDone),
        || format!("committed then again: {first:?}, {again:?}"),
    )?;

    // Rolled back: no row, so it is the first time again.
    let rolled_back = record_then(&pool, &inbox, "e2", false).await?;
    ensure(
        rolled_back == Record::First && !inbox.is_done("e2").await.map_err(text)?,
        || format!("a rolled-back record ({rolled_back:?}) left e2 done"),
    )?;
    let after_rollback = record_then(&pool, &inbox, "e2", true).await?;
    ensure(after_rollback == Record::First, || {
        format!("after a rollback: {after_rollback:?}")
    })?;

    // Two transactions racing for one id, each holding its transaction open a while: one is first.
    let racers: Vec<_> = (0..2)
        .map(|_| {
            let (pool, inbox) = (pool.clone(), inbox.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.map_err(text)?;
                let got = inbox.record_id(&mut *tx, "e3").await.map_err(text)?;
                tokio::time::sleep(Duration::from_millis(100)).await;
                tx.commit().await.map_err(text)?;
                Ok::<_, String>(got)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for racer in racers {
        answers.push(racer.await.map_err(text)??);
    }
    let firsts = answers.iter().filter(|a| a.is_first()).count();
    ensure(firsts == 1, || format!("racing records: {answers:?}"))?;

    // Another consumer has its own ids.
    let other = Inbox::builder(&db_url)
        .consumer("shipping")
        .connect()
        .await
        .map_err(text)?;
    let elsewhere = record_then(&pool, &other, "e1", true).await?;
    ensure(elsewhere == Record::First, || {
        format!("another consumer's e1: {elsewhere:?}")
    })?;

    // The idempotency store: claim, busy while held, released, taken over after the lease, done.
    let claims = [
        inbox.begin("c1").await.map_err(text)?,
        inbox.begin("c1").await.map_err(text)?,
    ];
    inbox.abandon("c1").await.map_err(text)?;
    let after_release = inbox.begin("c1").await.map_err(text)?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after_lease = inbox.begin("c1").await.map_err(text)?;
    inbox.complete("c1").await.map_err(text)?;
    let after_done = inbox.begin("c1").await.map_err(text)?;
    let got = (claims, after_release, after_lease, after_done);
    let want = (
        [Begin::Fresh, Begin::InProgress],
        Begin::Fresh,
        Begin::Fresh,
        Begin::Done,
    );
    ensure(got == want, || format!("claims {got:?}, want {want:?}"))?;
    // `complete` records the id for `record` too: the two ways share one table.
    let completed = record_then(&pool, &inbox, "c1", false).await?;
    ensure(completed == Record::AlreadyDone, || {
        format!("record after complete: {completed:?}")
    })?;

    // The retention: everything done above is older than 400 ms after this wait.
    let before = inbox.counts().await.map_err(text)?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let purged = inbox.purge().await.map_err(text)?;
    let after = inbox.counts().await.map_err(text)?;
    ensure(
        (before.done, before.in_progress, purged, after.done) == (4, 0, 4, 0),
        || format!("purge: before {before:?}, purged {purged}, after {after:?}"),
    )?;
    ensure(!inbox.is_done("e1").await.map_err(text)?, || {
        "e1 still done after the purge".into()
    })?;
    // The other consumer keeps its ids (its own retention).
    ensure(other.is_done("e1").await.map_err(text)?, || {
        "the purge of one consumer forgot another's id".into()
    })?;
    Ok(format!(
        "racing records {answers:?}; purged {purged} rows after the retention"
    ))
}

/// The environment a child consumer reads.
const CHILD_DB: &str = "INBOX_SUITE_CHILD_DB";
const CHILD_BROKER: &str = "INBOX_SUITE_CHILD_BROKER";
const CHILD_TOPIC: &str = "INBOX_SUITE_CHILD_TOPIC";
const CHILD_MARKS: &str = "INBOX_SUITE_CHILD_MARKS";
const CHILD_HANG: &str = "INBOX_SUITE_CHILD_HANG";
const CHILD_EXPECT: &str = "INBOX_SUITE_CHILD_EXPECT";
/// `store`: the child of `idempotency_across_processes`, with the stop file to watch.
const CHILD_MODE: &str = "INBOX_SUITE_CHILD_MODE";
const CHILD_STOP: &str = "INBOX_SUITE_CHILD_STOP";

/// The child process of `killed_between_commit_and_ack`: a consumer whose handler records each event in
/// the inbox and writes its effect in one transaction, then appends `committed <id>` (or
/// `skipped <id>`) to the marks file. With `HANG`, it stops after its first commit — before returning,
/// so before the ack — until it is killed; otherwise it shuts down cleanly once `EXPECT` ids are marked.
pub(crate) fn child_consumer() -> Option<ExitCode> {
    let db = std::env::var(CHILD_DB).ok()?;
    let store = std::env::var(CHILD_MODE).is_ok_and(|m| m == "store");
    let code = match test_support::broker::runtime() {
        Ok(runtime) => match runtime.block_on(async {
            if store {
                run_store_child(db).await
            } else {
                run_child(db).await
            }
        }) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("inbox child: {e}");
                2
            }
        },
        Err(e) => {
            eprintln!("inbox child: {e}");
            2
        }
    };
    Some(ExitCode::from(code))
}

async fn run_child(db: String) -> Result<(), String> {
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let broker = event_retry::connect(&var(CHILD_BROKER)?)
        .await
        .map_err(text)?;
    let topic = var(CHILD_TOPIC)?;
    let marks = PathBuf::from(var(CHILD_MARKS)?);
    let hang = std::env::var(CHILD_HANG).is_ok_and(|v| v == "1");
    let expect: usize = var(CHILD_EXPECT)?.parse().map_err(text)?;
    let inbox = Inbox::builder(&db)
        .consumer(GROUP)
        .connect()
        .await
        .map_err(text)?;
    let pool = effects_pool(&db).await?;
    // Deliveries this life marked: it is done when every event came once.
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = handled.clone();
    let handle = broker
        .consumer(&topic)
        .group(GROUP)
        .concurrency(1)
        .start(handler_fn(move |_e: Event, ctx: Context| {
            let (inbox, pool, marks) = (inbox.clone(), pool.clone(), marks.clone());
            let counted = counted.clone();
            async move {
                let mut tx = pool.begin().await.map_err(database_error)?;
                match inbox.record(&mut *tx, &ctx).await? {
                    Record::AlreadyDone => {
                        mark(&marks, "skipped", &ctx.event_id)?;
                        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Record::First => {
                        insert_effect(&mut tx, &ctx).await?;
                        tx.commit().await.map_err(database_error)?;
                        mark(&marks, "committed", &ctx.event_id)?;
                        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if hang {
                            // Committed, not yet acknowledged: the parent kills the process here.
                            tokio::time::sleep(Duration::from_secs(600)).await;
                        }
                    }
                }
                Ok(())
            }
        }))
        .await
        .map_err(text)?;
    let deadline = Instant::now() + Duration::from_secs(150);
    while handled.load(std::sync::atomic::Ordering::SeqCst) < expect {
        if Instant::now() > deadline {
            return Err(format!("fewer than {expect} events marked in 150 s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Give the last handler's return its acknowledgement, then drain.
    handle.shutdown().await.map_err(text)?;
    Ok(())
}

/// Appends `<what> <id>` to the marks file (one write: a line is never half there).
fn mark(path: &Path, what: &str, id: &str) -> Result<(), HandlerError> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(HandlerError::non_retryable)?;
    file.write_all(format!("{what} {id}\n").as_bytes())
        .map_err(HandlerError::non_retryable)?;
    Ok(())
}

/// The marks, by event id: what each delivery found, in order.
fn read_marks(path: &Path) -> Result<HashMap<String, Vec<String>>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e.to_string()),
    };
    let mut by_id: HashMap<String, Vec<String>> = HashMap::new();
    for line in text.lines() {
        if let Some((what, id)) = line.split_once(' ') {
            by_id
                .entry(id.to_string())
                .or_default()
                .push(what.to_string());
        }
    }
    Ok(by_id)
}

/// The child's broker URL: on Kafka with a 6 s session (the broker's minimum), so the second life's
/// group takes the killed member's partitions after 6 s rather than the default 45.
fn child_broker_url(column: &Column) -> String {
    match column.broker {
        BrokerKind::Kafka => {
            let sep = if column.broker_url.contains('?') {
                '&'
            } else {
                '?'
            };
            format!("{}{sep}rdkafka.session.timeout.ms=6000", column.broker_url)
        }
        BrokerKind::Rabbitmq => column.broker_url.clone(),
    }
}

fn child(
    column: &Column,
    db_url: &str,
    topic: &str,
    marks: &Path,
    hang: bool,
    expect: usize,
) -> Result<tokio::process::Child, String> {
    let exe = std::env::current_exe().map_err(text)?;
    tokio::process::Command::new(exe)
        .env(CHILD_DB, db_url)
        .env(CHILD_BROKER, child_broker_url(column))
        .env(CHILD_TOPIC, topic)
        .env(CHILD_MARKS, marks)
        .env(CHILD_HANG, if hang { "1" } else { "0" })
        .env(CHILD_EXPECT, expect.to_string())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(text)
}

/// Messages of `topic` the broker still holds for the group, read with its own client.
async fn waiting_on_broker(column: &Column, broker: &Broker, topic: &str) -> Result<u64, String> {
    let names = broker
        .admin()
        .names(topic, Some(GROUP))
        .await
        .map_err(text)?;
    let raw: Box<dyn RawBroker> = match column.broker {
        BrokerKind::Kafka => Box::new(RawKafka::new(&column.broker_url)),
        BrokerKind::Rabbitmq => Box::new(RawRabbit::new(&column.broker_url)),
    };
    raw.waiting(&names.topic, GROUP).await.map_err(text)
}

async fn killed_between_commit_and_ack(column: Column) -> Result<String, String> {
    const EVENTS: usize = 5;
    let broker = event_retry::connect(&column.broker_url)
        .await
        .map_err(text)?;
    let topic = fresh_topic(&broker, "inbox-kill").await?;
    broker
        .admin()
        .declare(&topic, Some(GROUP))
        .await
        .map_err(text)?;
    let db_url = create_mode(&fresh_db(&column).await?);
    let pool = effects_pool(&db_url).await?;
    let dir = root().join("target/outbox-tests");
    let marks = dir.join(format!("{topic}.marks"));
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("{topic}-{i}")).collect();
    let producer = broker.producer();
    for id in &ids {
        producer
            .publish(&topic, Event::new("effect").with_id(id.as_str()))
            .await
            .map_err(text)?;
    }

    // The first life: killed after its first commit, before that event's ack.
    let mut first = child(&column, &db_url, &topic, &marks, true, EVENTS)?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let killed_id = loop {
        if let Some((id, _)) = read_marks(&marks)?.into_iter().next() {
            break id;
        }
        if let Ok(Some(status)) = first.try_wait() {
            return Err(format!(
                "the first consumer exited ({status}) before committing"
            ));
        }
        ensure(Instant::now() < deadline, || {
            "the first consumer committed nothing in 90 s".into()
        })?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    first.start_kill().map_err(text)?; // SIGKILL
    let _ = first.wait().await;
    let at_kill = effects(&pool).await?;
    ensure(
        at_kill.len() == 1 && at_kill.get(&killed_id) == Some(&1),
        || format!("effects at the kill: {at_kill:?}"),
    )?;

    // The second life: the killed event comes again and must be skipped.
    let started = Instant::now();
    let mut second = child(&column, &db_url, &topic, &marks, false, EVENTS)?;
    let status = tokio::time::timeout(Duration::from_secs(180), second.wait())
        .await
        .map_err(|_| "the second consumer did not finish in 180 s".to_string())?
        .map_err(text)?;
    ensure(status.success(), || {
        format!("the second consumer failed: {status}")
    })?;
    let marked = read_marks(&marks)?;
    let killed_marks = marked.get(&killed_id).cloned().unwrap_or_default();
    ensure(killed_marks == ["committed", "skipped"], || {
        format!("the killed event's deliveries: {killed_marks:?} (want committed, then skipped)")
    })?;
    let rows = effects(&pool).await?;
    let want: BTreeMap<String, i64> = ids.iter().map(|id| (id.clone(), 1)).collect();
    ensure(rows == want, || {
        format!("effect rows per event {rows:?}, want one each")
    })?;
    let waiting = waiting_on_broker(&column, &broker, &topic).await?;
    ensure(waiting == 0, || {
        format!("{waiting} messages still on the broker for {GROUP}")
    })?;
    let _ = std::fs::remove_file(&marks);
    Ok(format!(
        "{EVENTS} events, 1 effect row each; the killed one redelivered and skipped; second life {:.1} s",
        started.elapsed().as_secs_f64()
    ))
}

/// What an attempt saw: its number, the effect rows and whether its id was done before its transaction,
/// and what its record found.
type Seen = (u32, i64, bool, Record);

async fn rolled_back_attempt_is_retried(column: Column) -> Result<String, String> {
    let broker = event_retry::connect(&column.broker_url)
        .await
        .map_err(text)?;
    let topic = fresh_topic(&broker, "inbox-rollback").await?;
    let db_url = create_mode(&fresh_db(&column).await?);
    let pool = effects_pool(&db_url).await?;
    let inbox = Inbox::builder(&db_url)
        .consumer(GROUP)
        .connect()
        .await
        .map_err(text)?;
    // What each attempt saw before its own transaction: effect rows and whether the id was done.
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let (h_inbox, h_pool, h_seen) = (inbox.clone(), pool.clone(), seen.clone());
    let handle = broker
        .consumer(&topic)
        .group(GROUP)
        .policy(RetryPolicy::parse("200ms x3").map_err(text)?)
        .start(handler_fn(move |_e: Event, ctx: Context| {
            let (inbox, pool, seen) = (h_inbox.clone(), h_pool.clone(), h_seen.clone());
            async move {
                let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects")
                    .fetch_one(&pool)
                    .await
                    .map_err(database_error)?;
                let done = inbox
                    .is_done(&ctx.event_id)
                    .await
                    .map_err(HandlerError::blocking)?;
                let mut tx = pool.begin().await.map_err(database_error)?;
                let record = inbox.record(&mut *tx, &ctx).await?;
                seen.lock().unwrap_or_else(|p| p.into_inner()).push((
                    ctx.attempt,
                    rows,
                    done,
                    record,
                ));
                if record == Record::AlreadyDone {
                    return Ok(());
                }
                insert_effect(&mut tx, &ctx).await?;
                if ctx.attempt == 1 {
                    // The transaction is dropped unfinished: it rolls back, record and effect alike.
                    return Err(HandlerError::deferred(
                        "the payment service refused, try later",
                    ));
                }
                tx.commit().await.map_err(database_error)?;
                Ok(())
            }
        }))
        .await
        .map_err(text)?;
    broker
        .producer()
        .publish(&topic, Event::new("pay").with_id("r1"))
        .await
        .map_err(text)?;
    let stats = tokio::time::timeout(
        Duration::from_secs(60),
        handle.wait_until(|s| s.succeeded >= 1 || s.dead_lettered >= 1),
    )
    .await
    .map_err(|_| "no outcome in 60 s".to_string())?;
    handle.shutdown().await.map_err(text)?;
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let want = vec![(1, 0, false, Record::First), (2, 0, false, Record::First)];
    ensure(seen == want, || {
        format!("attempts saw (attempt, effect rows, done, record) {seen:?}, want {want:?}")
    })?;
    let rows: Vec<(String, i64)> = sqlx::query_as("SELECT event_id, attempt FROM effects")
        .fetch_all(&pool)
        .await
        .map_err(text)?;
    ensure(rows == [("r1".to_string(), 2)], || {
        format!("effect rows {rows:?}, want only attempt 2's")
    })?;
    ensure(
        stats.succeeded == 1 && stats.retries_scheduled == 1 && stats.dead_lettered == 0,
        || format!("consumer stats {stats:?}"),
    )?;
    ensure(inbox.is_done("r1").await.map_err(text)?, || {
        "r1 not done after its commit".into()
    })?;
    Ok("attempt 1 rolled back (0 rows after it), attempt 2 first and committed".into())
}

/// What a handler saw of the database going away: its error, in a few words (the SQLSTATE of a
/// database error, the kind of an I/O error).
fn describe(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(e) => format!(
            "Database {} ({})",
            e.code().unwrap_or_default(),
            e.message()
        ),
        sqlx::Error::Io(e) => format!("Io {:?}", e.kind()),
        other => {
            let text = format!("{other:?}");
            text.chars().take(80).collect()
        }
    }
}

/// Counts `what` in `seen`.
fn note(seen: &Mutex<BTreeMap<String, usize>>, what: String) {
    *seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(what)
        .or_default() += 1;
}

async fn database_restarted_under_consumer(column: Column) -> Result<String, String> {
    const EVENTS: usize = 300;
    let db_url = fresh_db(&column).await?;
    sqlx::any::install_default_drivers();
    // Pooled connections are handed out without a ping first (a pool tuned for speed): each one the
    // restart cut fails the handler's next statement with what the server said, rather than being
    // replaced quietly.
    let pool = AnyPoolOptions::new()
        .max_connections(4)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&db_url)
        .await
        .map_err(|e| format!("connect {db_url}: {e}"))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS effects (event_id TEXT NOT NULL, attempt BIGINT NOT NULL)",
    )
    .execute(&pool)
    .await
    .map_err(text)?;
    let inbox = Inbox::builder(&db_url)
        .consumer(GROUP)
        .connect()
        .await
        .map_err(text)?;
    let broker = Broker::memory();
    let topic = format!("inbox-dbrestart-{}", uuid::Uuid::new_v4().simple());
    broker.admin().declare(&topic, None).await.map_err(text)?;
    // The errors the handlers saw, by what they were.
    let seen: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let (h_pool, h_inbox, h_seen) = (pool.clone(), inbox.clone(), seen.clone());
    let handle = broker
        .consumer(&topic)
        .group(GROUP)
        .concurrency(4)
        // A retry 50 ms later, but no time to make it in: a failure taken for the event's dead-letters
        // it at once. (With the retry allowed, a 57P01 taken for the event's spent it, and the retry
        // then waited in the pool until the server was back.)
        .policy(RetryPolicy::parse("50ms; max-elapsed=0").map_err(text)?)
        .start(handler_fn(move |_e: Event, ctx: Context| {
            let (pool, inbox, seen) = (h_pool.clone(), h_inbox.clone(), h_seen.clone());
            async move {
                let failed = |e: sqlx::Error| {
                    note(&seen, describe(&e));
                    database_error(e)
                };
                let mut tx = pool.begin().await.map_err(failed)?;
                let record = inbox.record(&mut *tx, &ctx).await.inspect_err(|e| {
                    note(&seen, format!("record: {}", e.message()));
                })?;
                if record == Record::AlreadyDone {
                    return Ok(());
                }
                sqlx::query("INSERT INTO effects (event_id, attempt) VALUES ($1, $2)")
                    .bind(ctx.event_id.to_string())
                    .bind(i64::from(ctx.attempt))
                    .execute(&mut *tx)
                    .await
                    .map_err(failed)?;
                // The transaction stays open a while, as one around a call elsewhere does: the restart
                // finds some open.
                tokio::time::sleep(Duration::from_millis(20)).await;
                tx.commit().await.map_err(failed)?;
                Ok(())
            }
        }))
        .await
        .map_err(text)?;
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("{topic}-{i}")).collect();
    // Events keep coming, one every 10 ms, through the restart.
    let publisher = {
        let (producer, topic, ids) = (broker.producer(), topic.clone(), ids.clone());
        tokio::spawn(async move {
            for id in ids {
                producer
                    .publish(&topic, Event::new("effect").with_id(id))
                    .await
                    .map_err(text)?;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, String>(())
        })
    };
    // The consumer's health every 10 ms, with when.
    let started = Instant::now();
    let samples: Arc<Mutex<Vec<(Duration, &'static str)>>> = Arc::default();
    let sampler = {
        let (watch, samples) = (handle.health_watch(), samples.clone());
        tokio::spawn(async move {
            loop {
                let name = watch.health().name();
                samples
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((started.elapsed(), name));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::timeout(
        Duration::from_secs(60),
        handle.wait_until(|s| s.succeeded >= (EVENTS / 5) as u64),
    )
    .await
    .map_err(|_| format!("fewer than {} events handled in 60 s", EVENTS / 5))?;
    let down_from = started.elapsed();
    let restart_took = restart_postgres(&column).await?;
    let down_until = started.elapsed();
    let stats = tokio::time::timeout(
        Duration::from_secs(120),
        handle.wait_until(|s| s.succeeded + s.dead_lettered >= EVENTS as u64),
    )
    .await
    .map_err(|_| format!("not every event settled in 120 s: {:?}", handle.stats()))?;
    publisher.await.map_err(text)??;
    let health_after = handle.health();
    sampler.abort();
    handle.shutdown().await.map_err(text)?;
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let dead = broker
        .dead_letters()
        .list(&topic, &event_retry_core::dlq::DlqFilter::all())
        .await
        .map_err(text)?;
    ensure(stats.dead_lettered == 0 && dead.is_empty(), || {
        let why: Vec<String> = dead
            .iter()
            .map(|d| {
                let meta = d.event.metadata();
                format!(
                    "{:?} after {} attempts ({:?}): {:?}",
                    d.dead().map(|i| &i.reason),
                    meta.attempts,
                    meta.error_kind,
                    meta.last_error
                )
            })
            .collect();
        format!(
            "{} events dead-lettered ({} in the DLQ: {why:?}) for the database's restart; the handlers saw {seen:?}",
            stats.dead_lettered,
            dead.len()
        )
    })?;
    ensure(stats.retries_scheduled == 0, || {
        format!(
            "{} retries spent on the database's restart; the handlers saw {seen:?}",
            stats.retries_scheduled
        )
    })?;
    let rows = effects(&pool).await?;
    let want: BTreeMap<String, i64> = ids.iter().map(|id| (id.clone(), 1)).collect();
    ensure(rows == want, || {
        let off: Vec<_> = ids
            .iter()
            .filter(|id| rows.get(*id) != Some(&1))
            .map(|id| (id.clone(), rows.get(id).copied().unwrap_or(0)))
            .collect();
        format!("effect rows not one per event (id, rows): {off:?}")
    })?;
    ensure(!seen.is_empty(), || {
        "no handler saw the restart: nothing was tested".into()
    })?;
    let samples = samples.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let held: Vec<Duration> = samples
        .iter()
        .filter(|(_, name)| *name == "held")
        .map(|(at, _)| *at)
        .collect();
    let held_while_down = held
        .iter()
        .any(|at| *at >= down_from && *at <= down_until + Duration::from_secs(1));
    ensure(held_while_down, || {
        format!(
            "the consumer was never held while the database was gone ({:.1}–{:.1} s; held samples at {held:?}); the handlers saw {seen:?}; {stats:?}",
            down_from.as_secs_f64(),
            down_until.as_secs_f64()
        )
    })?;
    ensure(health_after.name() == "running", || {
        format!("after the restart the consumer is {health_after}")
    })?;
    ensure(samples.iter().all(|(_, name)| *name != "stopped"), || {
        "the consumer stopped during the restart".into()
    })?;
    let held_for = Duration::from_millis(10) * held.len() as u32;
    pool.close().await;
    Ok(format!(
        "{EVENTS} events, PostgreSQL down and back in {:.1} s mid-run; the handlers saw {seen:?}; held about {:.1} s, {} holds; dead-lettered 0; one effect row each",
        restart_took.as_secs_f64(),
        held_for.as_secs_f64(),
        stats.holds
    ))
}

/// The child of `idempotency_across_processes`: a consumer with the inbox as its idempotency store, whose
/// handler's effect is outside the database — a line `effect <pid> <id>` appended to the marks file.
/// It writes `ready <pid>` once consuming, keeps `<marks>.<pid>` holding its handled and skipped counts,
/// and shuts down when the stop file appears.
async fn run_store_child(db: String) -> Result<(), String> {
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let broker = event_retry::connect(&var(CHILD_BROKER)?)
        .await
        .map_err(text)?;
    let topic = var(CHILD_TOPIC)?;
    let marks = PathBuf::from(var(CHILD_MARKS)?);
    let stop = PathBuf::from(var(CHILD_STOP)?);
    let inbox = Inbox::builder(&db)
        .consumer(GROUP)
        .connect()
        .await
        .map_err(text)?;
    let pid = std::process::id();
    let h_marks = marks.clone();
    let handle = broker
        .consumer(&topic)
        .group(GROUP)
        .concurrency(2)
        .idempotency(inbox)
        .start(handler_fn(move |_e: Event, ctx: Context| {
            let marks = h_marks.clone();
            async move {
                mark(&marks, "effect", &format!("{pid} {}", ctx.event_id))?;
                // A call elsewhere takes a while: a copy in the other process finds the id in progress.
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(())
            }
        }))
        .await
        .map_err(text)?;
    mark(&marks, "ready", &pid.to_string()).map_err(text)?;
    let counts = marks.with_extension(format!("marks.{pid}"));
    let deadline = Instant::now() + Duration::from_secs(240);
    while !stop.exists() {
        if Instant::now() > deadline {
            return Err("no stop file in 240 s".into());
        }
        let stats = handle.stats();
        std::fs::write(
            &counts,
            format!("{} {}\n", stats.succeeded, stats.duplicates_skipped),
        )
        .map_err(text)?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = handle.stats();
    handle.shutdown().await.map_err(text)?;
    std::fs::write(
        &counts,
        format!("{} {}\n", stats.succeeded, stats.duplicates_skipped),
    )
    .map_err(text)?;
    Ok(())
}

fn store_child(
    column: &Column,
    db_url: &str,
    topic: &str,
    marks: &Path,
    stop: &Path,
) -> Result<tokio::process::Child, String> {
    let exe = std::env::current_exe().map_err(text)?;
    tokio::process::Command::new(exe)
        .env(CHILD_MODE, "store")
        .env(CHILD_DB, db_url)
        .env(CHILD_BROKER, child_broker_url(column))
        .env(CHILD_TOPIC, topic)
        .env(CHILD_MARKS, marks)
        .env(CHILD_STOP, stop)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(text)
}

/// Per event id, the pids whose handler made its effect.
type EffectsBy = BTreeMap<String, Vec<String>>;

/// The marks of `idempotency_across_processes`: the ready pids, and who made each effect.
fn store_marks(path: &Path) -> Result<(Vec<String>, EffectsBy), String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e.to_string()),
    };
    let (mut ready, mut effects) = (Vec::new(), EffectsBy::new());
    for line in text.lines() {
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["ready", pid] => ready.push(pid.to_string()),
            ["effect", pid, id] => effects
                .entry(id.to_string())
                .or_default()
                .push(pid.to_string()),
            _ => {}
        }
    }
    Ok((ready, effects))
}

/// A child's handled and skipped counts, from its counts file.
fn store_counts(marks: &Path, pid: &str) -> (u64, u64) {
    let file = marks.with_extension(format!("marks.{pid}"));
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut numbers = text.split_whitespace().map(|n| n.parse().unwrap_or(0));
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

async fn idempotency_across_processes(column: Column) -> Result<String, String> {
    const EVENTS: usize = 40;
    let broker = event_retry::connect(&column.broker_url)
        .await
        .map_err(text)?;
    let topic = fresh_topic(&broker, "inbox-store").await?;
    broker
        .admin()
        .declare(&topic, Some(GROUP))
        .await
        .map_err(text)?;
    let db_url = create_mode(&fresh_db(&column).await?);
    // The inbox's table, made here before two processes open it at once.
    let inbox = Inbox::builder(&db_url)
        .consumer(GROUP)
        .connect()
        .await
        .map_err(text)?;
    let dir = root().join("target/outbox-tests");
    std::fs::create_dir_all(&dir).map_err(text)?;
    let marks = dir.join(format!("{topic}.marks"));
    let stop = dir.join(format!("{topic}.stop"));
    let mut children = Vec::new();
    for _ in 0..2 {
        children.push(store_child(&column, &db_url, &topic, &marks, &stop)?);
    }
    // Both consuming before anything is published, so the queue hands out to both.
    let deadline = Instant::now() + Duration::from_secs(60);
    let pids = loop {
        let (ready, _) = store_marks(&marks)?;
        if ready.len() == 2 {
            break ready;
        }
        for child in &mut children {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "a consumer process exited ({status}) before consuming"
                ));
            }
        }
        ensure(Instant::now() < deadline, || {
            format!("{} of 2 consumer processes ready in 60 s", ready.len())
        })?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("{topic}-{i}")).collect();
    let producer = broker.producer();
    let publish = |id: String| {
        let (producer, topic) = (producer.clone(), topic.clone());
        async move {
            producer
                .publish(&topic, Event::new("effect").with_id(id))
                .await
                .map_err(text)
        }
    };
    // Every event twice back to back, as a publisher that retried a send the broker had taken: the
    // queue hands the copies out in turn, mostly to the two processes at once.
    for id in &ids {
        publish(id.clone()).await?;
        publish(id.clone()).await?;
    }
    let settled = |want_skipped: u64| {
        let (marks, pids) = (marks.clone(), pids.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let (_, effects) = store_marks(&marks)?;
                let skipped: u64 = pids.iter().map(|p| store_counts(&marks, p).1).sum();
                let repeated: Vec<_> = effects.iter().filter(|(_, by)| by.len() > 1).collect();
                ensure(repeated.is_empty(), || {
                    format!(
                        "effects repeated (id, by pids): {repeated:?}; {skipped} copies skipped"
                    )
                })?;
                if effects.len() == EVENTS && skipped >= want_skipped {
                    return Ok::<_, String>(());
                }
                ensure(Instant::now() < deadline, || {
                    format!(
                        "in 120 s: effects for {} of {EVENTS} events, {skipped} of {want_skipped} copies skipped",
                        effects.len()
                    )
                })?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    settled(EVENTS as u64).await?;
    // Then every event again, after all are done: a redelivery the inbox answers from the database.
    for id in &ids {
        publish(id.clone()).await?;
    }
    settled(2 * EVENTS as u64).await?;
    std::fs::write(&stop, "").map_err(text)?;
    for child in &mut children {
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .map_err(|_| "a consumer process did not stop in 60 s".to_string())?
            .map_err(text)?;
        ensure(status.success(), || {
            format!("a consumer process failed: {status}")
        })?;
    }
    let (_, effects) = store_marks(&marks)?;
    let repeated: Vec<_> = effects.iter().filter(|(_, by)| by.len() != 1).collect();
    ensure(effects.len() == EVENTS && repeated.is_empty(), || {
        format!(
            "effects for {} of {EVENTS} events; repeated (id, by pids): {repeated:?}",
            effects.len()
        )
    })?;
    let per_process: Vec<(usize, u64)> = pids
        .iter()
        .map(|pid| {
            let made = effects.values().filter(|by| by[0] == *pid).count();
            (made, store_counts(&marks, pid).1)
        })
        .collect();
    ensure(per_process.iter().all(|(made, _)| *made > 0), || {
        format!("one process made every effect (effects, skipped per process: {per_process:?})")
    })?;
    let skipped: u64 = per_process.iter().map(|(_, s)| s).sum();
    ensure(skipped == 2 * EVENTS as u64, || {
        format!(
            "{skipped} copies skipped, want {} ({per_process:?})",
            2 * EVENTS
        )
    })?;
    let counts = inbox.counts().await.map_err(text)?;
    ensure(counts.done == EVENTS as u64, || {
        format!("the inbox holds {counts:?}, want {EVENTS} done")
    })?;
    let _ = std::fs::remove_file(&marks);
    let _ = std::fs::remove_file(&stop);
    for pid in &pids {
        let _ = std::fs::remove_file(marks.with_extension(format!("marks.{pid}")));
    }
    Ok(format!(
        "{EVENTS} events × 3 deliveries over 2 processes: one effect each; (effects, copies skipped) per process {per_process:?}"
    ))
}
