//! The consumer under test: a separate process (so it can be killed, or put in a network namespace) that
//! runs the SDK's consumer with the workload's handler and records every call.
//!
//! With an inbox database, a successful call also has a side effect: a row of `side_effects`, written in
//! one transaction with the inbox's record of the event id, as a service using the inbox would. A
//! redelivery of an event whose transaction committed finds its id done and writes nothing, so the
//! table's duplicates are side effects the service would really have repeated.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use event_retry::prelude::*;
use event_retry_outbox::{Inbox, Record, database_error};
use sqlx::AnyPool;

use crate::record::{Outcome, Recorder};
use crate::workload::{self, Fate};

/// What the consumer process is told.
#[derive(Debug, clap::Args)]
pub(crate) struct ConsumeArgs {
    /// The broker's URL.
    #[arg(long)]
    pub(crate) url: String,
    /// Adapter options (`key=value`), as the harness's own connection uses them.
    #[arg(long = "option", value_parser = crate::parse_option)]
    pub(crate) options: Vec<(String, String)>,
    /// The topic.
    #[arg(long)]
    pub(crate) topic: String,
    /// The consumer group.
    #[arg(long)]
    pub(crate) group: String,
    /// The record file.
    #[arg(long)]
    pub(crate) record: PathBuf,
    /// Milliseconds of work per event.
    #[arg(long, default_value_t = workload::DEFAULT_WORK.as_millis() as u64)]
    pub(crate) work_ms: u64,
    /// Milliseconds a failing-once event waits before its retry.
    #[arg(long, default_value_t = workload::RETRY_AFTER.as_millis() as u64)]
    pub(crate) retry_after_ms: u64,
    /// Exit at once when stdin closes (the harness gives the consumer a pipe and holds its other end,
    /// so a harness that dies takes the consumer with it).
    #[arg(long)]
    pub(crate) exit_with_stdin: bool,
    /// The inbox database (`sqlite:…`, `postgres://…`): successful calls write their side effect through it.
    #[arg(long)]
    pub(crate) inbox: Option<String>,
    /// Holds the event whose side effect is the `N`th this process commits through the inbox: its
    /// call is recorded as `held` and never returns, so a kill leaves a committed event unacknowledged
    /// (the broker hands it out again, and the next process's inbox must skip it).
    #[arg(long, value_name = "N")]
    pub(crate) hold_after_commits: Option<usize>,
}

/// The table a successful call writes its side effect to.
pub(crate) const SIDE_EFFECTS: &str = "side_effects";

/// The side effect of a successful call, once per event through the inbox.
#[derive(Clone)]
struct SideEffects {
    pool: AnyPool,
    inbox: Inbox,
}

impl SideEffects {
    async fn open(url: &str, group: &str) -> Result<Self, Box<dyn std::error::Error>> {
        let inbox = Inbox::builder(url).consumer(group).connect().await?;
        // The handler's own pool, through sqlx's `Any` driver (SQLite or PostgreSQL by the URL).
        sqlx::any::install_default_drivers();
        let pool = sqlx::any::AnyPoolOptions::new()
            .max_connections(16)
            .connect(url)
            .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {SIDE_EFFECTS} (event TEXT NOT NULL)"
        )))
        .execute(&pool)
        .await?;
        Ok(Self { pool, inbox })
    }

    /// Records the event in the inbox and writes its side effect, in one transaction; nothing when the
    /// inbox finds it done. `true` when the effect was written, `false` when the inbox skipped it.
    async fn apply(&self, id: &str, ctx: &Context) -> Result<bool, HandlerError> {
        let mut tx = self.pool.begin().await.map_err(database_error)?;
        if self.inbox.record(&mut *tx, ctx).await? == Record::AlreadyDone {
            return Ok(false);
        }
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {SIDE_EFFECTS} (event) VALUES ($1)"
        )))
        .bind(id.to_string())
        .execute(&mut *tx)
        .await
        .map_err(database_error)?;
        tx.commit().await.map_err(database_error)?;
        Ok(true)
    }
}

/// Runs the consumer until SIGTERM (a graceful shutdown) or SIGKILL.
pub(crate) async fn run(args: ConsumeArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.exit_with_stdin {
        std::thread::spawn(|| {
            // Reads until end of file: the harness closed its end, or died.
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            eprintln!("faults consume: the harness is gone; exiting");
            std::process::exit(3);
        });
    }
    let mut options = event_retry::config::Options::new();
    for (k, v) in &args.options {
        options = options.set(k, v);
    }
    let broker = event_retry::connect_with(&args.url, options).await?;
    let recorder = Arc::new(Recorder::open(&args.record)?);
    let work = Duration::from_millis(args.work_ms);
    let effects = match &args.inbox {
        Some(url) => Some(SideEffects::open(url, &args.group).await?),
        None => None,
    };
    let commits = Arc::new(AtomicUsize::new(0));
    let hold_at = args.hold_after_commits;
    let handler = handler_fn(move |event: Event, ctx: Context| {
        let (recorder, effects, commits) = (recorder.clone(), effects.clone(), commits.clone());
        async move {
            let id = String::from_utf8_lossy(&event.payload).into_owned();
            let fate = workload::index_of(&id).map(Fate::of);
            tokio::time::sleep(work).await;
            let (outcome, result) = match fate {
                Some(Fate::NonRetryable) => (
                    Outcome::Refused,
                    Err(HandlerError::non_retryable("refused for good")),
                ),
                Some(Fate::FailOnce) if ctx.attempt == 1 => (
                    Outcome::Failed,
                    Err(HandlerError::deferred("fails on its first attempt")),
                ),
                _ => (Outcome::Ok, Ok(())),
            };
            let unwritable = |e: std::io::Error| {
                HandlerError::blocking(format!("the record is not writable: {e}"))
            };
            if let (Outcome::Ok, Some(effects)) = (outcome, &effects) {
                if !effects.apply(&id, &ctx).await? {
                    recorder
                        .call_skipped(&id, ctx.attempt)
                        .map_err(unwritable)?;
                    return result;
                }
                let committed = commits.fetch_add(1, Ordering::SeqCst) + 1;
                if hold_at == Some(committed) {
                    recorder
                        .call(&id, ctx.attempt, Outcome::Held)
                        .map_err(unwritable)?;
                    // Committed and never acknowledged: the harness kills this process now.
                    std::future::pending::<()>().await;
                }
            }
            recorder
                .call(&id, ctx.attempt, outcome)
                .map_err(unwritable)?;
            result
        }
    });
    let handle = broker
        .consumer(&args.topic)
        .group(&args.group)
        .policy(RetryPolicy::parse(&workload::policy(
            Duration::from_millis(args.retry_after_ms),
        ))?)
        .concurrency(16)
        .start(handler)
        .await?;
    // The harness waits for this line before it counts the consumer as started.
    println!("consumer started pid={}", std::process::id());
    let stop = handle.shutdown_trigger();
    tokio::spawn(async move {
        event_retry::shutdown_signal().await;
        stop.trigger();
    });
    handle.await?;
    println!("consumer stopped");
    Ok(())
}
