//! The operator CLI as a library: argument types and the commands behind them, so they can be tested and
//! embedded; the `retryctl` binary only parses arguments and prints.
//!
//! * `retryctl policy explain '<dsl>' [--broker URL]` — the schedule table (attempt, delay, cumulative),
//!   and with a broker, how it honours each delay (exact, rounded, split, refused).
//! * `retryctl dlq <list|show|replay|purge> --url URL --topic TOPIC` — the dead letter queue of a topic,
//!   on any broker whose adapter is compiled in.
//! * `retryctl outbox --db URL <list|show|replay|purge>` — the transactional outbox's rows (SQLite or
//!   PostgreSQL): by state, topic, key and time; replay `DEAD` rows, purge `DEAD` or `PUBLISHED` ones.

use std::io::Write;

pub mod outbox;

use clap::{Args, Parser, Subcommand};
use event_retry::adapter::Honour;
use event_retry::check::DelayReport;
use event_retry::classify::ErrorKind;
use event_retry::error::Kind;
use event_retry::policy::RetryPolicy;
use event_retry::time::format_duration;
use event_retry::{Broker, DeadLetter, DlqFilter};

/// `retryctl` arguments.
#[derive(Debug, Parser)]
#[command(
    name = "retryctl",
    version,
    about = "Explain retry policies; inspect, replay and purge dead letter queues and outbox rows"
)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Retry policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Dead letter queues.
    Dlq(DlqArgs),
    /// The transactional outbox.
    Outbox(outbox::OutboxArgs),
}

/// `retryctl policy …`
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Prints the schedule of a policy: attempt, delay before it, cumulative time.
    Explain {
        /// The policy, e.g. '5000x3,10000x5' or 'exp(500ms, 1m, 2, 6); jitter=full'.
        policy: String,
        /// A broker URL: also show how that broker honours each delay.
        #[arg(long)]
        broker: Option<String>,
        /// At most this many retries (for unlimited policies).
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
}

/// `retryctl dlq …`
#[derive(Debug, Args)]
pub struct DlqArgs {
    /// The broker URL.
    #[arg(long)]
    pub url: String,
    /// The source topic or queue whose dead letters to work on.
    #[arg(long)]
    pub topic: String,
    /// What to do.
    #[command(subcommand)]
    pub command: DlqCommand,
}

/// Which entries a DLQ command selects.
#[derive(Debug, Args, Default)]
pub struct Selection {
    /// Only these entry ids.
    #[arg(long = "id")]
    pub ids: Vec<String>,
    /// Only entries whose last error was of this kind (non_retryable, transient, blocking, deferred).
    #[arg(long)]
    pub kind: Option<ErrorKind>,
    /// Only entries with this key (UTF-8).
    #[arg(long)]
    pub key: Option<String>,
    /// At most this many entries.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Select every entry (required when no other filter is given, for replay and purge).
    #[arg(long)]
    pub all: bool,
}

impl Selection {
    fn filter(&self) -> DlqFilter {
        DlqFilter {
            ids: (!self.ids.is_empty()).then(|| self.ids.clone()),
            error_kind: self.kind,
            key: self.key.clone().map(Into::into),
            limit: self.limit,
            ..DlqFilter::default()
        }
    }

    fn is_narrowed(&self) -> bool {
        !self.ids.is_empty() || self.kind.is_some() || self.key.is_some() || self.limit.is_some()
    }
}

/// `retryctl dlq --url … --topic … <command>`
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Lists entries, oldest first.
    List(Selection),
    /// Shows one entry with all its metadata.
    Show {
        /// The entry id.
        id: String,
    },
    /// Sends entries back to their origin (payload unedited, attempts restarted).
    Replay(Selection),
    /// Removes entries.
    Purge {
        /// Which entries.
        #[command(flatten)]
        selection: Selection,
        /// Confirms the purge.
        #[arg(long)]
        yes: bool,
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
        }) => {
            let broker = match broker {
                Some(url) => Some(event_retry::connect(&url).await?),
                None => None,
            };
            explain(&policy, broker.as_ref(), limit, out)
        }
        Command::Dlq(args) => {
            let broker = event_retry::connect(&args.url).await?;
            dlq(&broker, &args.topic, args.command, out).await
        }
        Command::Outbox(args) => outbox::run(args, out).await,
    }
}

/// Writes the schedule table of `policy` (and how `broker` honours each delay).
pub fn explain(
    policy: &str,
    broker: Option<&Broker>,
    limit: u32,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let policy = RetryPolicy::parse(policy).map_err(|e| CliError::Policy(e.render()))?;
    let rows = policy.explain(limit);
    let attempts = policy
        .max_attempts()
        .map_or("unlimited".to_string(), |n| n.to_string());
    writeln!(out, "policy: {policy}")?;
    writeln!(out, "attempts: {attempts}")?;
    let capability = broker.map(|b| (b.name(), b.capabilities().delay));
    let header = capability.map_or(String::new(), |(name, _)| format!("  {name}"));
    writeln!(
        out,
        "{:>7}  {:>10}  {:>12}{header}",
        "attempt", "delay", "cumulative"
    )?;
    writeln!(out, "{:>7}  {:>10}  {:>12}", 1, "-", "0ms")?;
    for row in &rows {
        let honour = capability.map_or(String::new(), |(_, cap)| match cap.honour(row.delay) {
            Honour::Exact => "  exact".to_string(),
            other => format!("  {other}"),
        });
        writeln!(
            out,
            "{:>7}  {:>10}  {:>12}{honour}",
            row.attempt,
            format_duration(row.delay),
            format_duration(row.cumulative)
        )?;
    }
    if policy.max_retries().is_none_or(|max| max > limit) {
        writeln!(out, "   ...  (showing the first {limit} retries)")?;
    }
    if let Some(budget) = policy.max_elapsed() {
        writeln!(
            out,
            "budget: retries stop once {} have passed since the first attempt",
            format_duration(budget)
        )?;
    }
    if let Some((name, cap)) = capability {
        let report = DelayReport::new(&policy, &cap);
        if !report.is_ok() {
            writeln!(
                out,
                "\nthe {name} transport refuses this policy; a consumer with it will not start:\n{report}"
            )?;
        }
    }
    Ok(())
}

fn describe(entry: &DeadLetter) -> String {
    let m = entry.event.metadata();
    let dead = m.dead.as_ref();
    format!(
        "{:<12} {:<18} {:<14} attempts={:<3} key={} error={}",
        entry.id,
        m.event_id.as_deref().unwrap_or("-"),
        dead.map_or("-".to_string(), |d| d.reason.to_string()),
        m.attempts,
        entry
            .event
            .key
            .as_ref()
            .map_or("-".to_string(), |k| String::from_utf8_lossy(k).into_owned()),
        m.last_error.as_deref().unwrap_or("-"),
    )
}

/// Runs a DLQ command against `broker`.
pub async fn dlq(
    broker: &Broker,
    topic: &str,
    command: DlqCommand,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let queue = broker.dead_letters();
    match command {
        DlqCommand::List(selection) => {
            let entries = queue.list(topic, &selection.filter()).await?;
            writeln!(out, "{} dead letters from {topic}", entries.len())?;
            for entry in &entries {
                writeln!(out, "{}", describe(entry))?;
            }
        }
        DlqCommand::Show { id } => {
            let entry = queue
                .show(topic, &id)
                .await?
                .ok_or_else(|| CliError::Usage(format!("no dead letter {id:?} from {topic}")))?;
            let e = &entry.event;
            writeln!(out, "id: {}", entry.id)?;
            writeln!(
                out,
                "key: {:?}",
                e.key
                    .as_ref()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
            )?;
            writeln!(
                out,
                "payload ({} bytes): {}",
                e.payload.len(),
                String::from_utf8_lossy(&e.payload)
            )?;
            for (name, value) in event_retry::metadata::encode(e.metadata(), &e.headers).iter() {
                writeln!(out, "header {name}: {}", String::from_utf8_lossy(value))?;
            }
        }
        DlqCommand::Replay(selection) => {
            if !selection.all && !selection.is_narrowed() {
                return Err(CliError::Usage(
                    "replay needs --all or a filter (--id, --kind, --key, --limit)".into(),
                ));
            }
            let report = queue.replay(topic, &selection.filter()).await?;
            writeln!(
                out,
                "replayed {} dead letters to their origin",
                report.replayed
            )?;
        }
        DlqCommand::Purge { selection, yes } => {
            if !selection.all && !selection.is_narrowed() {
                return Err(CliError::Usage(
                    "purge needs --all or a filter (--id, --kind, --key, --limit)".into(),
                ));
            }
            if !yes {
                let n = queue.list(topic, &selection.filter()).await?.len();
                return Err(CliError::Usage(format!(
                    "purge would remove {n} dead letters; add --yes to confirm"
                )));
            }
            let n = queue.purge(topic, &selection.filter()).await?;
            writeln!(out, "purged {n} dead letters")?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use event_retry::{Context, Event, HandlerError, handler_fn};

    fn text(f: impl FnOnce(&mut Vec<u8>) -> Result<(), CliError>) -> Result<String, CliError> {
        let mut out = Vec::new();
        f(&mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn explain_prints_nine_attempts_for_the_classic_policy() {
        let out = text(|o| explain("5000x3,10000x5", None, 20, o)).unwrap();
        assert!(out.contains("attempts: 9"), "{out}");
        let rows: Vec<_> = out
            .lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .collect();
        assert_eq!(rows.len(), 9, "{out}");
        assert!(rows[8].contains("10s") && rows[8].contains("65s"), "{out}");
    }

    #[test]
    fn explain_points_at_the_column_of_a_parse_error() {
        let err = text(|o| explain("5000x", None, 20, o)).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let msg = err.to_string();
        assert!(msg.contains("column 6") && msg.contains('^'), "{msg}");
    }

    #[test]
    fn explain_with_a_broker_shows_how_it_honours_delays() {
        let memory = Broker::memory();
        let out = text(|o| explain("exp(1s, 8s, 2)", Some(&memory), 5, o)).unwrap();
        assert!(
            out.contains("memory") && out.contains("exact") && out.contains("first 5 retries"),
            "{out}"
        );
    }

    /// Dead-letters `n` events of `topic` through a consumer whose handler refuses them.
    async fn dead_letters(broker: &Broker, topic: &str, n: usize) {
        let handle = broker
            .consumer(topic)
            .start(handler_fn(|_e: Event, _c: Context| async {
                Err(HandlerError::non_retryable("boom"))
            }))
            .await
            .unwrap();
        for i in 0..n {
            broker
                .producer()
                .publish(
                    topic,
                    Event::new(format!("p{i}"))
                        .with_id(format!("e{i}"))
                        .with_key("k"),
                )
                .await
                .unwrap();
        }
        handle.wait_until(|s| s.dead_lettered >= n as u64).await;
        handle.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn dlq_list_show_replay_purge() {
        let broker = Broker::memory();
        dead_letters(&broker, "orders", 3).await;
        let list = |sel| async {
            let mut o = Vec::new();
            dlq(&broker, "orders", DlqCommand::List(sel), &mut o)
                .await
                .map(|()| String::from_utf8(o).unwrap())
        };
        let out = list(Selection::default()).await.unwrap();
        assert!(out.starts_with("3 dead letters from orders"), "{out}");
        let id = broker
            .dead_letters()
            .list("orders", &DlqFilter::all())
            .await
            .unwrap()[0]
            .id
            .clone();

        let mut o = Vec::new();
        dlq(
            &broker,
            "orders",
            DlqCommand::Show { id: id.clone() },
            &mut o,
        )
        .await
        .unwrap();
        let shown = String::from_utf8(o).unwrap();
        assert!(
            shown.contains("x-retry-dead-reason: non_retryable")
                && shown.contains("payload (2 bytes): p0"),
            "{shown}"
        );

        let mut o = Vec::new();
        let refused = dlq(
            &broker,
            "orders",
            DlqCommand::Replay(Selection::default()),
            &mut o,
        )
        .await
        .unwrap_err();
        assert!(refused.to_string().contains("--all"));
        dlq(
            &broker,
            "orders",
            DlqCommand::Replay(Selection {
                ids: vec![id],
                ..Selection::default()
            }),
            &mut o,
        )
        .await
        .unwrap();
        // The replayed event is back with the group that dead-lettered it (the default group): a
        // subscriber of that group gets it, with the replay count raised.
        let spec = event_retry::adapter::SubscriptionSpec::new(
            "orders",
            event_retry::adapter::default_group("orders"),
            "c",
        );
        let mut sub = broker.transport().subscribe(&spec).await.unwrap();
        let back = sub.next().await.unwrap().unwrap();
        let event = Event::from_raw(back.message).unwrap();
        assert_eq!(event.metadata().replay_count, 1, "replayed to the origin");
        drop(back.receipt);

        let purge_all = |yes| DlqCommand::Purge {
            selection: Selection {
                all: true,
                ..Selection::default()
            },
            yes,
        };
        let unconfirmed = dlq(&broker, "orders", purge_all(false), &mut o)
            .await
            .unwrap_err();
        assert!(
            unconfirmed.to_string().contains("would remove 2"),
            "{unconfirmed}"
        );
        dlq(&broker, "orders", purge_all(true), &mut o)
            .await
            .unwrap();
        assert!(
            list(Selection::default())
                .await
                .unwrap()
                .starts_with("0 dead letters")
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
