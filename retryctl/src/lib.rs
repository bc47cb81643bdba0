//! The operator CLI as a library: argument types and the commands behind them, so they can be tested and
//! embedded; the `retryctl` binary only parses arguments and prints.
//!
//! * `retryctl policy explain '<dsl>' [--broker URL]` — the schedule table (attempt, delay, cumulative),
//!   and with a broker, how it honours each delay (exact, rounded, split, refused).
//! * `retryctl dlq <list|show|replay|purge> --url URL --topic TOPIC` — the dead letter queue of a topic,
//!   on any broker whose adapter is compiled in.
//! * `retryctl migrate --from URL --to URL --topic TOPIC` — moves a DLQ to another broker with the
//!   entries' history: copy, confirm, then remove; safe to run again after a crash.
//! * `retryctl serve --url URL --topic TOPIC` (or `--config FILE`) — a DLQ console in the browser:
//!   filter, inspect, replay and purge, behind an access token.
//! * `retryctl outbox --db URL <list|show|replay|purge>` — the transactional outbox's rows (SQLite or
//!   PostgreSQL): by state, topic, key and time; replay `DEAD` rows, purge `DEAD` or `PUBLISHED` ones.
//! * `retryctl completions <shell>` — a completion script for bash, zsh, fish, elvish or PowerShell.
//!
//! Read commands print for people (times in UTC with their age, durations such as `2h 8m 15s`) or,
//! with `--json`, one JSON document for scripts. Long operations (replay, purge, migrate) show a
//! progress bar on a terminal and a line per step otherwise.

use std::io::Write;

pub mod console;
pub mod dlq;
pub mod migrate;
pub mod outbox;
pub mod policy;
pub mod progress;
pub mod render;

use clap::{Parser, Subcommand};
use event_retry::error::Kind;

pub use dlq::{DlqArgs, DlqCommand, Selection, entry_json};
pub use migrate::MigrateArgs;
pub use policy::{PolicyCommand, explain, explain_json};

/// `retryctl` arguments.
#[derive(Debug, Parser)]
#[command(
    name = "retryctl",
    version,
    about = "Explain retry policies; inspect, replay, purge and migrate dead letter queues; outbox rows",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// What the exit codes mean, for `--help`.
pub const EXIT_CODES: &str = "Exit codes:
  0  done
  1  the broker or the database failed (unreachable, refused, an operation that did not complete)
  2  bad input: arguments, a policy that does not parse, a URL or setting the adapter refuses, an
     unconfirmed purge";

/// The top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Retry policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Dead letter queues.
    Dlq(DlqArgs),
    /// Moves a DLQ to another broker with its history (copy, confirm, remove; resumable).
    Migrate(MigrateArgs),
    /// A DLQ console in the browser (token required; 127.0.0.1 unless told otherwise).
    Serve(console::ServeArgs),
    /// The transactional outbox.
    Outbox(outbox::OutboxArgs),
    /// Prints a shell completion script (e.g. `retryctl completions bash > /etc/bash_completion.d/retryctl`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The policy did not parse.
    #[error("invalid policy\n{0}")]
    Policy(String),
    /// The broker URL could not be used, or the broker failed.
    #[error(transparent)]
    Broker(#[from] event_retry::Error),
    /// The request is incomplete or unsafe.
    #[error("{0}")]
    Usage(String),
    /// Writing the output failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The outbox database failed.
    #[error("{0}")]
    Outbox(String),
}

impl CliError {
    /// The process exit code: 2 for bad input, 1 for failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Policy(_) | CliError::Usage(_) => 2,
            CliError::Broker(e)
                if matches!(
                    e.kind(),
                    Kind::Config | Kind::Unsupported | Kind::InvalidInput
                ) =>
            {
                2
            }
            CliError::Broker(_) | CliError::Io(_) | CliError::Outbox(_) => 1,
        }
    }
}

/// Runs a command, writing its output to `out`.
pub async fn run(cli: Cli, out: &mut dyn Write) -> Result<(), CliError> {
    match cli.command {
        Command::Policy(PolicyCommand::Explain {
            policy,
            broker,
            limit,
            json,
        }) => {
            let broker = match broker {
                Some(url) => Some(event_retry::connect(&url).await?),
                None => None,
            };
            if json {
                explain_json(&policy, broker.as_ref(), limit, out)
            } else {
                explain(&policy, broker.as_ref(), limit, out)
            }
        }
        Command::Dlq(args) => {
            let broker = event_retry::connect(&args.url).await?;
            dlq::dlq(&broker, &args.topic, args.command, out).await
        }
        Command::Migrate(args) => migrate::run(args, out).await,
        Command::Serve(args) => console::run(args, out).await,
        Command::Outbox(args) => outbox::run(args, out).await,
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "retryctl", out);
            Ok(())
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn completions_and_exit_codes_in_help() {
        let cli = Cli::try_parse_from(["retryctl", "completions", "bash"]).unwrap();
        let mut o = Vec::new();
        run(cli, &mut o).await.unwrap();
        let script = String::from_utf8(o).unwrap();
        assert!(
            script.contains("retryctl") && script.contains("complete"),
            "{script}"
        );
        let help = <Cli as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        assert!(
            help.contains("Exit codes:") && help.contains("2  bad input"),
            "{help}"
        );
    }

    #[tokio::test]
    async fn bad_urls_exit_with_2_and_broker_failures_with_1() {
        let cli = Cli::try_parse_from([
            "retryctl", "dlq", "--url", "nats://x", "--topic", "t", "list",
        ])
        .unwrap();
        let err = run(cli, &mut Vec::new()).await.unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        let failed = CliError::Broker(event_retry::Error::new(Kind::Connection, "refused"));
        assert_eq!(failed.exit_code(), 1);
    }

    #[test]
    fn cli_parses() {
        let cli = Cli::try_parse_from([
            "retryctl",
            "dlq",
            "--url",
            "memory://",
            "--topic",
            "t",
            "purge",
            "--kind",
            "deferred",
            "--yes",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Dlq(DlqArgs {
                command: DlqCommand::Purge { yes: true, .. },
                ..
            })
        ));
        assert!(
            Cli::try_parse_from([
                "retryctl", "dlq", "--url", "x", "--topic", "t", "list", "--kind", "fatal"
            ])
            .is_err()
        );
    }
}
