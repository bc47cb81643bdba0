//! `retryctl migrate`: moves the dead letters of one topic from one broker to another with their
//! history, for a team moving a service between brokers.
//!
//! Each entry is copied to the target's DLQ, the target confirms it, and only then is it removed from
//! the source; a run that dies anywhere loses nothing, and running the same command again finishes the
//! job without duplicates (entries already in the target are only removed from the source). What moves
//! and what a target cannot keep is `event_retry_core::dlq`'s migration; this module is its command line.

use std::io::Write;

use clap::Args;
use event_retry_core::dlq::{MigrationReport, MigrationTarget, Moved};
use event_retry_core::options::redact_url;

use crate::dlq::Selection;
use crate::{CliError, progress, render};

/// `retryctl migrate …`
#[derive(Debug, Args)]
#[command(after_help = WHAT_MOVES)]
pub struct MigrateArgs {
    /// The broker URL the DLQ is on now.
    #[arg(long)]
    pub from: String,
    /// The broker URL to move it to.
    #[arg(long)]
    pub to: String,
    /// The source topic or queue whose dead letters move.
    #[arg(long)]
    pub topic: String,
    /// The topic on the target whose DLQ receives them (by default the same name); entries whose
    /// origin is the source topic then name this one, so a replay on the target goes there.
    #[arg(long)]
    pub to_topic: Option<String>,
    /// Which entries (all by default).
    #[command(flatten)]
    pub selection: Selection,
    /// Only report what would be done; nothing is written or removed.
    #[arg(long)]
    pub dry_run: bool,
    /// One JSON document instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// What `--help` says moves, per broker.
pub const WHAT_MOVES: &str = "What moves: payload, key and headers byte for byte; the history (event id, attempts,
retries, first seen, origin, last error and its kind, last delay, replay count, dead reason/time/
consumer); the consumer group that dead-lettered an entry, to Kafka, RabbitMQ and Pulsar (SQS keeps
none). Not kept, and reported per entry: AMQP properties and typed header values (RabbitMQ), Kafka
null headers, SQS Number and custom data types, Pulsar event time and ordering key. Retries waiting in
the source broker do not move: let them finish there (docs/MIGRATING.md).";

/// Runs `retryctl migrate`.
pub async fn run(args: MigrateArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let to_topic = args.to_topic.as_deref().unwrap_or(&args.topic);
    if args.from == args.to && args.topic == to_topic {
        return Err(CliError::Usage(
            "--from and --to name the same broker and topic: nothing to move".into(),
        ));
    }
    let from = event_retry::connect(&args.from).await?;
    let to = event_retry::connect(&args.to).await?;
    let filter = args.selection.filter()?;
    let target_dlq = to.dead_letters();
    let target = MigrationTarget {
        dead_letters: &target_dlq,
        topic: to_topic,
        dry_run: args.dry_run,
    };
    let bar = progress::Bar::new(if args.dry_run { "checked" } else { "migrated" });
    let report = from
        .dead_letters()
        .migrate(&args.topic, &filter, target, &bar)
        .await?;
    drop(bar);
    let from_name = format!("{} ({})", args.topic, from.name());
    let to_name = format!("{to_topic} ({})", to.name());
    if args.json {
        let doc = report_json(&report, &args, to_topic);
        let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
        writeln!(out, "{text}")?;
    } else {
        write_report(&report, args.dry_run, &from_name, &to_name, out)?;
    }
    Ok(())
}

/// The report for people: what was done, then each entry that lost something.
fn write_report(
    report: &MigrationReport,
    dry_run: bool,
    from: &str,
    to: &str,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let total = render::counted(report.entries.len(), "dead letter", "dead letters");
    if dry_run {
        writeln!(
            out,
            "dry run: {total} in {from}; {} would be copied to {to}, {} already there would only be \
             removed from the source",
            report.count(Moved::WouldCopy),
            report.count(Moved::WouldRemove),
        )?;
    } else {
        writeln!(
            out,
            "migrated {total} from {from} to {to}: {} copied, {} already there (removed from the source \
             only)",
            report.count(Moved::Copied),
            report.count(Moved::AlreadyThere),
        )?;
    }
    let lossy: Vec<_> = report
        .entries
        .iter()
        .filter(|e| !e.not_kept.is_empty())
        .collect();
    if lossy.is_empty() {
        writeln!(out, "every entry kept everything the source held")?;
        return Ok(());
    }
    writeln!(
        out,
        "{} with something the target does not keep:",
        render::counted(lossy.len(), "entry", "entries")
    )?;
    for entry in lossy {
        writeln!(
            out,
            "  {} (event {}): {}",
            entry.id,
            entry.event_id.as_deref().unwrap_or("-"),
            entry.not_kept.join("; ")
        )?;
    }
    Ok(())
}

/// The report for scripts.
fn report_json(report: &MigrationReport, args: &MigrateArgs, to_topic: &str) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = report
        .entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "id": e.id,
                "event_id": e.event_id,
                "outcome": e.moved.as_str(),
                "not_kept": e.not_kept,
            })
        })
        .collect();
    serde_json::json!({
        "from": redact_url(&args.from),
        "to": redact_url(&args.to),
        "topic": args.topic,
        "to_topic": to_topic,
        "dry_run": args.dry_run,
        "copied": report.count(Moved::Copied),
        "already_there": report.count(Moved::AlreadyThere),
        "would_copy": report.count(Moved::WouldCopy),
        "would_remove": report.count(Moved::WouldRemove),
        "entries": entries,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::Cli;
    use crate::dlq::tests::dead_letters;
    use clap::Parser;
    use event_retry::DlqFilter;

    async fn migrate(args: &[&str]) -> Result<String, CliError> {
        let mut argv = vec!["retryctl", "migrate"];
        argv.extend(args);
        let mut out = Vec::new();
        crate::run(Cli::try_parse_from(argv).unwrap(), &mut out).await?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[tokio::test]
    async fn a_dry_run_then_the_move_between_two_brokers() {
        let (a, b) = ("memory://migrate-a", "memory://migrate-b");
        let source = event_retry::connect(a).await.unwrap();
        dead_letters(&source, "orders", 3).await;
        let dry = migrate(&["--from", a, "--to", b, "--topic", "orders", "--dry-run"])
            .await
            .unwrap();
        assert!(dry.starts_with("dry run: 3 dead letters"), "{dry}");
        assert!(dry.contains("3 would be copied"), "{dry}");
        let done = migrate(&["--from", a, "--to", b, "--topic", "orders"])
            .await
            .unwrap();
        assert!(
            done.starts_with(
                "migrated 3 dead letters from orders (memory) to orders (memory): 3 copied"
            ),
            "{done}"
        );
        let target = event_retry::connect(b).await.unwrap();
        let moved = target
            .dead_letters()
            .list("orders", &DlqFilter::all())
            .await
            .unwrap();
        assert_eq!(moved.len(), 3);
        let again = migrate(&["--from", a, "--to", b, "--topic", "orders", "--json"])
            .await
            .unwrap();
        let doc: serde_json::Value = serde_json::from_str(&again).unwrap();
        assert_eq!(doc["copied"], 0, "{doc}");
        assert_eq!(doc["entries"].as_array().unwrap().len(), 0);
    }

    #[tokio::test]
    async fn the_same_broker_and_topic_is_refused() {
        let err = migrate(&["--from", "memory://x", "--to", "memory://x", "--topic", "t"])
            .await
            .unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
    }
}
