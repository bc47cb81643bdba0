//! Counted fault runs against real brokers: `scripts/faults` builds and calls this binary.
//!
//! A run produces events with unique ids whose fate is fixed (most succeed, some fail once and retry
//! through the broker, a few are non-retryable), starts a consumer in a process of its own, injects one
//! fault mid-stream — the consumer killed, the broker killed, stalled or cut off, the DLQ unwritable, a
//! cluster's partition leader killed — and counts, from the handler's own record and the broker's state
//! read with its raw client, what was lost and what was duplicated. Each run is one row of
//! `target/faults/report.md`.
//!
//! ```text
//! faults run --broker kafka --fault F2        one row (brokers from RETRY_TEST_* variables)
//! faults report                               the report again, from the rows on disk
//! ```

mod account;
mod consume;
mod effects;
mod faults;
mod forward;
mod netns;
mod outage;
mod process;
mod record;
mod report;
mod run;
mod target;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Counted fault runs against real brokers.
#[derive(Debug, Parser)]
#[command(name = "faults")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs every named fault on every named broker, one row each, and writes the report.
    Run {
        /// Brokers: kafka, rabbitmq, rabbitmq4, sqs, pulsar (F6 runs on kafka-cluster and F7 on
        /// rabbitmq-cluster, by themselves).
        #[arg(long = "broker", required = true)]
        brokers: Vec<target::BrokerName>,
        /// Faults: F1 … F7.
        #[arg(long = "fault", required = true)]
        faults: Vec<faults::Fault>,
        /// Events per run.
        #[arg(long, default_value_t = 10_000)]
        events: usize,
        /// Where rows, records, logs and the report go.
        #[arg(long, default_value = "target/faults")]
        out: PathBuf,
        /// Adapter options (`key=value`) for every run, e.g. `queue_type=quorum`; the row notes them.
        #[arg(long = "option", value_parser = parse_option)]
        options: Vec<(String, String)>,
        /// Seconds a stall, cut or DLQ outage lasts (the matrix's 20 unless told).
        #[arg(long, default_value_t = faults::OUTAGE.as_secs())]
        outage: u64,
        /// Seconds a failing-once event waits before its retry (the matrix's 1 unless told; a longer
        /// wait keeps more copies in the broker's retry route when the fault lands).
        #[arg(long, default_value_t = workload::RETRY_AFTER.as_secs())]
        retry_after: u64,
        /// Milliseconds of work per event (the matrix's 10 unless told; more slows the consumer).
        #[arg(long, default_value_t = workload::DEFAULT_WORK.as_millis() as u64)]
        work_ms: u64,
        /// Where the consumer's inbox writes each event's side effect: sqlite (a file per run),
        /// postgres (`RETRY_TEST_POSTGRES`) or none.
        #[arg(long, value_enum, default_value_t = effects::InboxDb::Sqlite)]
        inbox: effects::InboxDb,
    },
    /// Writes the report from the rows already on disk.
    Report {
        /// Where the rows are and the report goes.
        #[arg(long, default_value = "target/faults")]
        out: PathBuf,
    },
    /// The consumer under test (started by `run`, in a process of its own).
    Consume(consume::ConsumeArgs),
    /// Forwards loopback ports to another address (inside the consumer's network namespace).
    Forward(forward::ForwardArgs),
}

/// Parses a `key=value` option.
fn parse_option(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected key=value, found {s:?}"))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,rdkafka=off,librdkafka=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("faults: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<bool, Box<dyn std::error::Error>> = runtime.block_on(async {
        match cli.command {
            Command::Run {
                brokers,
                faults,
                events,
                out,
                options,
                outage,
                retry_after,
                work_ms,
                inbox,
            } => {
                let settings = run::Settings {
                    events,
                    options,
                    outage: std::time::Duration::from_secs(outage),
                    retry_after: std::time::Duration::from_secs(retry_after),
                    work: std::time::Duration::from_millis(work_ms),
                    inbox,
                };
                run::matrix(&brokers, &faults, &settings, &out).await
            }
            Command::Report { out } => report::write(&out).map(|_| true),
            Command::Consume(args) => consume::run(args).await.map(|()| true),
            Command::Forward(args) => forward::run(args).await.map(|()| true),
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("faults: {e}");
            ExitCode::from(2)
        }
    }
}
