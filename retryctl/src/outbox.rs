//! `retryctl outbox --db URL list|show|replay|purge`: the outbox's rows, for an operator.
//!
//! The same operations as the library ([`event_retry_outbox::Outbox`]), so a refused transition (a purge
//! of waiting rows, a replay of a published one) is refused here with the lifecycle's words. Times are
//! shown in UTC (RFC 3339) and `--since`/`--until` take either such a time or a duration ago (`2h`).

use std::io::Write;

use clap::{Args, Subcommand};
use event_retry_core::time::Timestamp;
use event_retry_outbox::{Outbox, OutboxError, OutboxRow, RowFilter, State};

use crate::CliError;

/// `retryctl outbox …`
#[derive(Debug, Args)]
pub struct OutboxArgs {
    /// The outbox database (`sqlite:path/to/app.db`, `postgres://user@host/db`).
    #[arg(long)]
    pub db: String,
    /// What to do.
    #[command(subcommand)]
    pub command: OutboxCommand,
}

/// Which rows an outbox command selects.
#[derive(Debug, Args, Default)]
pub struct RowSelection {
    /// Only these row ids.
    #[arg(long = "id")]
    pub ids: Vec<i64>,
    /// Only rows in this state (pending, claimed, published, dead).
    #[arg(long)]
    pub state: Option<State>,
    /// Only rows for this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only rows with this key (UTF-8).
    #[arg(long)]
    pub key: Option<String>,
    /// Only rows enqueued at or after this time (RFC 3339, or a duration ago such as `2h`).
    #[arg(long)]
    pub since: Option<String>,
    /// Only rows enqueued before this time (RFC 3339, or a duration ago such as `30m`).
    #[arg(long)]
    pub until: Option<String>,
    /// At most this many rows (list).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Select every row (required when no other filter is given, for replay and purge).
    #[arg(long)]
    pub all: bool,
}

impl RowSelection {
    fn filter(&self) -> Result<RowFilter, CliError> {
        Ok(RowFilter {
            ids: self.ids.clone(),
            state: self.state,
            topic: self.topic.clone(),
            key: self.key.clone().map(Into::into),
            since: self.since.as_deref().map(parse_time).transpose()?,
            until: self.until.as_deref().map(parse_time).transpose()?,
            limit: self.limit,
        })
    }
}

/// `retryctl outbox --db … <command>`
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Lists rows, oldest first, with counts by state.
    List {
        /// Which rows.
        #[command(flatten)]
        selection: RowSelection,
        /// One JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Shows one row with every field.
    Show {
        /// The row id.
        id: i64,
        /// One JSON document instead of the text.
        #[arg(long)]
        json: bool,
    },
    /// Moves DEAD rows back to PENDING (due now, attempts restarted, replay count kept and raised).
    Replay(RowSelection),
    /// Deletes DEAD or PUBLISHED rows (never waiting ones).
    Purge {
        /// Which rows (name --state dead or --state published, or ids).
        #[command(flatten)]
        selection: RowSelection,
        /// Confirms the purge.
        #[arg(long)]
        yes: bool,
    },
}

impl From<OutboxError> for CliError {
    fn from(e: OutboxError) -> Self {
        match e {
            OutboxError::Forbidden { .. }
            | OutboxError::InvalidInput(_)
            | OutboxError::Config(_)
            | OutboxError::NotFound(_) => CliError::Usage(e.to_string()),
            other => CliError::Outbox(other.to_string()),
        }
    }
}

/// Runs an outbox command.
pub async fn run(args: OutboxArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let outbox = Outbox::connect_with(&args.db, 2).await?;
    match args.command {
        OutboxCommand::List { selection, json } => {
            let rows = outbox.list(&selection.filter()?).await?;
            if json {
                let doc: Vec<_> = rows.iter().map(|r| row_json(r, false)).collect();
                let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
                writeln!(out, "{text}")?;
                return Ok(());
            }
            writeln!(out, "{}", summary(&rows))?;
            for row in &rows {
                writeln!(out, "{}", line(row))?;
            }
        }
        OutboxCommand::Show { id, json } => {
            let row = outbox.get(id).await?;
            if json {
                let text = serde_json::to_string_pretty(&row_json(&row, true))
                    .map_err(std::io::Error::other)?;
                writeln!(out, "{text}")?;
            } else {
                show(&row, out)?;
            }
        }
        OutboxCommand::Replay(selection) => {
            narrowed(&selection, "replay")?;
            let n = outbox.replay(&selection.filter()?).await?;
            writeln!(out, "replayed {}: PENDING again, due now", rows(n))?;
        }
        OutboxCommand::Purge { selection, yes } => {
            narrowed(&selection, "purge")?;
            let filter = selection.filter()?;
            if !yes {
                let n = outbox.list(&filter).await?.len() as u64;
                return Err(CliError::Usage(format!(
                    "purge would remove {}; add --yes to confirm",
                    rows(n)
                )));
            }
            let n = outbox.purge(&filter).await?;
            writeln!(out, "purged {}", rows(n))?;
        }
    }
    Ok(())
}

fn narrowed(selection: &RowSelection, what: &str) -> Result<(), CliError> {
    let f = selection.filter()?;
    if selection.all || f.is_narrowed() {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "{what} needs --all or a filter (--id, --state, --topic, --key, --since, --until)"
        )))
    }
}

fn rows(n: u64) -> String {
    crate::render::counted(usize::try_from(n).unwrap_or(usize::MAX), "row", "rows")
}

fn summary(list: &[OutboxRow]) -> String {
    let parts: Vec<String> = State::ALL
        .iter()
        .filter_map(|state| {
            let n = list.iter().filter(|r| r.state == *state).count();
            (n > 0).then(|| format!("{n} {state}"))
        })
        .collect();
    if parts.is_empty() {
        rows(list.len() as u64)
    } else {
        format!("{} ({})", rows(list.len() as u64), parts.join(", "))
    }
}

use crate::render::{parse_time, text_or_hex, time as human_time};

fn opt_time(t: Option<Timestamp>) -> String {
    t.map_or_else(|| "-".into(), human_time)
}

/// A row in JSON: every field, times in UTC with their epoch milliseconds, bytes as text or hex.
fn row_json(row: &OutboxRow, with_payload: bool) -> serde_json::Value {
    use crate::render::{bytes_json, time_json};
    let headers: Vec<serde_json::Value> = row
        .headers
        .iter()
        .map(|(name, value)| serde_json::json!({ "name": name, "value": bytes_json(value) }))
        .collect();
    let mut doc = serde_json::json!({
        "id": row.id,
        "event_id": row.event_id,
        "topic": row.topic,
        "key": row.key.as_deref().map(bytes_json),
        "state": row.state.as_str(),
        "attempts": row.attempts,
        "replay_count": row.replay_count,
        "available_at": time_json(Some(row.available_at)),
        "claimed_at": time_json(row.claimed_at),
        "lease_until": time_json(row.lease_until),
        "claimed_by": row.claimed_by,
        "last_error": row.last_error,
        "created_at": time_json(Some(row.created_at)),
        "published_at": time_json(row.published_at),
        "dead_at": time_json(row.dead_at),
        "headers": headers,
        "headers_error": row.headers_error,
        "payload_bytes": row.payload.len(),
    });
    if with_payload {
        doc["payload"] = bytes_json(&row.payload);
    }
    doc
}

fn line(row: &OutboxRow) -> String {
    let key = row.key.as_deref().map_or_else(|| "-".into(), text_or_hex);
    let error = row.last_error.as_deref().unwrap_or("-");
    let error: String = error.chars().take(80).collect();
    format!(
        "{:>6}  {:<9}  {}  key={}  attempts={}  available_at={}  claimed_at={}  last_error={}",
        row.id,
        row.state.as_str(),
        row.topic,
        key,
        row.attempts,
        human_time(row.available_at),
        opt_time(row.claimed_at),
        error
    )
}

fn show(row: &OutboxRow, out: &mut dyn Write) -> Result<(), CliError> {
    let key = row.key.as_deref().map_or_else(|| "-".into(), text_or_hex);
    let fields: [(&str, String); 15] = [
        ("event_id", row.event_id.clone()),
        ("topic", row.topic.clone()),
        ("key", key),
        ("state", row.state.to_string()),
        ("attempts", row.attempts.to_string()),
        ("replay_count", row.replay_count.to_string()),
        ("available_at", human_time(row.available_at)),
        ("claimed_at", opt_time(row.claimed_at)),
        ("lease_until", opt_time(row.lease_until)),
        (
            "claimed_by",
            row.claimed_by.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "last_error",
            row.last_error.clone().unwrap_or_else(|| "-".into()),
        ),
        ("created_at", human_time(row.created_at)),
        ("published_at", opt_time(row.published_at)),
        ("dead_at", opt_time(row.dead_at)),
        (
            "payload",
            format!(
                "{} ({} bytes)",
                text_or_hex(&row.payload),
                row.payload.len()
            ),
        ),
    ];
    writeln!(out, "row {}", row.id)?;
    for (name, value) in fields {
        writeln!(out, "  {name:<13} {value}")?;
    }
    for (name, value) in row.headers.iter() {
        writeln!(out, "  header        {name}: {}", text_or_hex(value))?;
    }
    if let Some(error) = &row.headers_error {
        writeln!(out, "  headers       unreadable: {error}")?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn plurals_and_summaries_read_right() {
        assert_eq!(rows(1), "1 row");
        assert_eq!(rows(0), "0 rows");
        assert_eq!(summary(&[]), "0 rows");
        assert_eq!(text_or_hex(&[0xff, 0x01]), "0xff01");
    }
}
