//! The consumer under test: a separate process (so it can be killed, or put in a network namespace) that
//! runs the SDK's consumer with the workload's handler and records every call.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use event_retry::prelude::*;

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
}

/// Runs the consumer until SIGTERM (a graceful shutdown) or SIGKILL.
pub(crate) async fn run(args: ConsumeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut options = event_retry::Options::new();
    for (k, v) in &args.options {
        options = options.set(k, v);
    }
    let broker = event_retry::connect_with(&args.url, options).await?;
    let recorder = Arc::new(Recorder::open(&args.record)?);
    let work = Duration::from_millis(args.work_ms);
    let handler = handler_fn(move |event: Event, ctx: Context| {
        let recorder = recorder.clone();
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
            recorder
                .call(&id, ctx.attempt, outcome)
                .map_err(|e| HandlerError::blocking(format!("the record is not writable: {e}")))?;
            result
        }
    });
    let handle = broker
        .consumer(&args.topic)
        .group(&args.group)
        .policy(RetryPolicy::parse(workload::POLICY)?)
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
