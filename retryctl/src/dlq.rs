//! `retryctl dlq list|show|replay|purge`: the dead letter queue of one topic, on any broker whose
//! adapter is compiled in, for people (UTC times with their age, counted nouns, payloads as text, JSON
//! or hex) or, with `--json`, for scripts.

use std::io::Write;

use clap::{Args, Subcommand};
use event_retry::{Broker, DeadLetter, DlqFilter};
use event_retry_core::classify::FailureKind;
use event_retry_core::dlq::FailureGroup;
use event_retry_core::time::Timestamp;

use crate::{CliError, progress, render};

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
    pub kind: Option<FailureKind>,
    /// Only entries with this key (UTF-8).
    #[arg(long)]
    pub key: Option<String>,
    /// Only entries dead-lettered at or after this time (RFC 3339, or a duration ago such as `2h`).
    #[arg(long)]
    pub since: Option<String>,
    /// Only entries dead-lettered before this time (RFC 3339, or a duration ago such as `30m`).
    #[arg(long)]
    pub until: Option<String>,
    /// Only entries whose last error contains this text (ignoring case).
    #[arg(long)]
    pub error: Option<String>,
    /// At most this many entries.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Only entries of this failure group (a fingerprint `dlq groups` prints).
    #[arg(long = "group")]
    pub group: Option<String>,
    /// Select every entry (required when no other filter is given, for replay and purge).
    #[arg(long)]
    pub all: bool,
}

impl Selection {
    /// The library's filter for this selection.
    pub fn filter(&self) -> Result<DlqFilter, CliError> {
        let mut filter = DlqFilter::all();
        filter.ids = (!self.ids.is_empty()).then(|| self.ids.clone());
        filter.error_kind = self.kind;
        filter.key = self.key.clone().map(Into::into);
        filter.since = self.since.as_deref().map(render::parse_time).transpose()?;
        filter.until = self.until.as_deref().map(render::parse_time).transpose()?;
        filter.error_text = self.error.clone();
        filter.limit = self.limit;
        filter.fingerprint = self.group.clone();
        Ok(filter)
    }

    /// Whether any filter is given.
    pub fn is_narrowed(&self) -> bool {
        !self.ids.is_empty()
            || self.kind.is_some()
            || self.key.is_some()
            || self.since.is_some()
            || self.until.is_some()
            || self.error.is_some()
            || self.limit.is_some()
            || self.group.is_some()
    }
}

/// The filters a replay or purge needs one of.
pub(crate) const FILTERS: &str =
    "--all or a filter (--id, --kind, --key, --since, --until, --error, --group, --limit)";

/// `retryctl dlq --url … --topic … <command>`
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Lists entries, oldest first.
    List {
        /// Which entries.
        #[command(flatten)]
        selection: Selection,
        /// One JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// The entries grouped by cause (error kind, normalised message, origin topic, group), the largest
    /// group first: each group's fingerprint (for `--group`), count, first and last dead-letter time,
    /// and a sample.
    Groups {
        /// Which entries.
        #[command(flatten)]
        selection: Selection,
        /// One JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Shows one entry with all its metadata.
    Show {
        /// The entry id.
        id: String,
        /// One JSON document instead of the text.
        #[arg(long)]
        json: bool,
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

/// One line of `dlq list`.
fn describe(entry: &DeadLetter) -> String {
    let m = entry.event.metadata();
    let dead = m.dead.as_ref();
    let error: String = m
        .last_error
        .as_deref()
        .unwrap_or("-")
        .chars()
        .take(100)
        .collect();
    format!(
        "{:<12} {:<20} {:<20} {:<14} attempts={:<3} key={} error={}",
        entry.id,
        dead.map_or("-".to_string(), |d| render::time(d.at)),
        m.event_id.as_deref().unwrap_or("-"),
        dead.map_or("-".to_string(), |d| d.reason.to_string()),
        m.attempts,
        entry
            .event
            .key
            .as_deref()
            .map_or("-".to_string(), render::text_or_hex),
        error,
    )
}

/// An entry in JSON: its id, the SDK's metadata with times in UTC, the key, the producer's headers,
/// and (`with_payload`) the payload.
pub fn entry_json(entry: &DeadLetter, with_payload: bool) -> serde_json::Value {
    let e = &entry.event;
    let m = e.metadata();
    let dead = m.dead.as_ref();
    let headers: Vec<serde_json::Value> = e
        .headers
        .iter()
        .map(
            |(name, value)| serde_json::json!({ "name": name, "value": render::bytes_json(value) }),
        )
        .collect();
    let mut doc = serde_json::json!({
        "id": entry.id,
        "event_id": m.event_id.as_deref(),
        "key": e.key.as_deref().map(render::bytes_json),
        "reason": dead.map(|d| d.reason.to_string()),
        "dead_at": render::time_json(dead.map(|d| d.at)),
        "consumer": dead.map(|d| d.consumer.clone()),
        "error_kind": m.error_kind.map(|k| k.as_str()),
        "last_error": m.last_error,
        "attempts": m.attempts,
        "retries": m.retries,
        "first_seen": render::time_json(m.first_seen),
        "last_delay_ms": m.last_delay.map(|d| d.as_millis() as u64),
        "origin": m.origin.as_ref().map(|o| serde_json::json!({
            "topic": &*o.topic, "partition": o.partition, "offset": o.offset,
        })),
        "replay_count": m.replay_count,
        "replayed_at": render::time_json(m.replayed_at),
        "headers": headers,
        "payload_bytes": e.payload.len(),
    });
    if with_payload {
        let (kind, _) = render::payload(&e.payload);
        doc["payload_format"] = kind.into();
        doc["payload"] = render::bytes_json(&e.payload);
    }
    doc
}

/// A failure group in JSON: its fingerprint, cause, count, times, sample and entries per hour over the
/// last day.
pub fn group_json(group: &FailureGroup, now: Timestamp) -> serde_json::Value {
    serde_json::json!({
        "fingerprint": group.fingerprint.as_str(),
        "error_kind": group.error_kind.map(|k| k.as_str()),
        "pattern": group.pattern,
        "topic": group.topic,
        "group": group.group,
        "count": group.count,
        "first_dead_at": render::time_json(group.first_dead_at()),
        "last_dead_at": render::time_json(group.last_dead_at()),
        "sample_id": group.sample_id,
        "sample_error": group.sample_error,
        "per_hour_last_24h": group.per_hour(now, 24),
    })
}

/// `dlq groups` for a person: one block per group.
fn show_groups(groups: &[FailureGroup], topic: &str, out: &mut dyn Write) -> Result<(), CliError> {
    let entries: usize = groups.iter().map(|g| g.count).sum();
    writeln!(
        out,
        "{} from {topic} in {}",
        render::counted(entries, "dead letter", "dead letters"),
        render::counted(groups.len(), "failure group", "failure groups")
    )?;
    let now = Timestamp::now();
    for group in groups {
        writeln!(
            out,
            "\n{}  {}  {}",
            group.fingerprint,
            render::counted(group.count, "entry", "entries"),
            group.error_kind.map_or("-", |k| k.as_str()),
        )?;
        writeln!(out, "  cause   {}", group.pattern)?;
        let from = match &group.group {
            Some(g) => format!("{} (group {g})", group.topic),
            None => group.topic.clone(),
        };
        writeln!(out, "  from    {from}")?;
        if let (Some(first), Some(last)) = (group.first_dead_at(), group.last_dead_at()) {
            writeln!(
                out,
                "  died    {} .. {}",
                render::time(first),
                render::time_ago(last)
            )?;
            writeln!(
                out,
                "  24 h    {}",
                render::sparkline(&group.per_hour(now, 24))
            )?;
        }
        writeln!(out, "  sample  {}: {}", group.sample_id, group.sample_error)?;
    }
    Ok(())
}

/// `dlq show`: every field of an entry, for a person.
fn show_entry(entry: &DeadLetter, out: &mut dyn Write) -> Result<(), CliError> {
    let e = &entry.event;
    let fields = render::entry_fields(entry);
    for (name, value) in fields {
        writeln!(out, "{name:<17} {value}")?;
    }
    let headers: Vec<_> = e.headers.iter().collect();
    writeln!(
        out,
        "{}",
        render::counted(headers.len(), "header", "headers")
    )?;
    for (name, value) in headers {
        writeln!(out, "  {name}: {}", render::text_or_hex(value))?;
    }
    let (kind, shown) = render::payload(&e.payload);
    writeln!(
        out,
        "payload ({}, {kind}):\n{shown}",
        render::counted(e.payload.len(), "byte", "bytes")
    )?;
    Ok(())
}

/// What a replay did, in words: how many went back, and the copies removed with them.
pub(crate) fn replayed(report: &event_retry_core::dlq::ReplayReport) -> String {
    let plural = |n: usize| render::counted(n, "dead letter", "dead letters");
    match report.copies_removed.len() {
        0 => format!("replayed {} to their origin", plural(report.replayed)),
        n => format!(
            "replayed {} to their origin; removed {} of them without replaying",
            plural(report.replayed),
            render::counted(n, "copy", "copies")
        ),
    }
}

/// Runs a DLQ command against `broker`.
pub async fn dlq(
    broker: &Broker,
    topic: &str,
    command: DlqCommand,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let queue = broker.dead_letters();
    let plural = |n: usize| render::counted(n, "dead letter", "dead letters");
    match command {
        DlqCommand::List { selection, json } => {
            let entries = queue.list(topic, &selection.filter()?).await?;
            if json {
                let doc: Vec<_> = entries.iter().map(|e| entry_json(e, false)).collect();
                let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
                writeln!(out, "{text}")?;
                return Ok(());
            }
            let copies = event_retry_core::dlq::copies(&entries);
            if copies == 0 {
                writeln!(out, "{} from {topic}", plural(entries.len()))?;
            } else {
                writeln!(
                    out,
                    "{} from {topic}: {} (the same event id and replay count, dead-lettered again \
                     on a redelivery; a replay sends each once)",
                    plural(entries.len()),
                    render::counted(copies, "is a copy", "are copies")
                )?;
            }
            if !entries.is_empty() {
                writeln!(
                    out,
                    "{:<12} {:<20} {:<20} {:<14} DETAILS",
                    "ID", "DEAD AT (UTC)", "EVENT ID", "REASON"
                )?;
            }
            for entry in &entries {
                writeln!(out, "{}", describe(entry))?;
            }
        }
        DlqCommand::Groups { selection, json } => {
            let groups = queue.groups(topic, &selection.filter()?).await?;
            if json {
                let now = Timestamp::now();
                let doc: Vec<_> = groups.iter().map(|g| group_json(g, now)).collect();
                let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
                writeln!(out, "{text}")?;
            } else {
                show_groups(&groups, topic, out)?;
            }
        }
        DlqCommand::Show { id, json } => {
            let entry = queue
                .show(topic, &id)
                .await?
                .ok_or_else(|| CliError::Usage(format!("no dead letter {id:?} from {topic}")))?;
            if json {
                let text = serde_json::to_string_pretty(&entry_json(&entry, true))
                    .map_err(std::io::Error::other)?;
                writeln!(out, "{text}")?;
            } else {
                show_entry(&entry, out)?;
            }
        }
        DlqCommand::Replay(selection) => {
            if !selection.all && !selection.is_narrowed() {
                return Err(CliError::Usage(format!("replay needs {FILTERS}")));
            }
            let bar = progress::Bar::new("replayed");
            let report = queue.replay_with(topic, &selection.filter()?, &bar).await?;
            drop(bar);
            writeln!(out, "{}", replayed(&report))?;
        }
        DlqCommand::Purge { selection, yes } => {
            if !selection.all && !selection.is_narrowed() {
                return Err(CliError::Usage(format!("purge needs {FILTERS}")));
            }
            let filter = selection.filter()?;
            if !yes {
                let n = queue.list(topic, &filter).await?.len();
                return Err(CliError::Usage(format!(
                    "purge would remove {}; add --yes to confirm",
                    plural(n)
                )));
            }
            let bar = progress::Bar::new("purged");
            let n = queue.purge_with(topic, &filter, &bar).await?;
            drop(bar);
            writeln!(out, "purged {}", plural(n))?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use event_retry::{Context, Event, HandlerError, handler_fn};

    pub(crate) async fn dead_letters(broker: &Broker, topic: &str, n: usize) {
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
        let list = |selection| async {
            let mut o = Vec::new();
            let command = DlqCommand::List {
                selection,
                json: false,
            };
            dlq(&broker, "orders", command, &mut o)
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
            DlqCommand::Show {
                id: id.clone(),
                json: false,
            },
            &mut o,
        )
        .await
        .unwrap();
        let shown = String::from_utf8(o).unwrap();
        assert!(
            shown.contains("dead              non_retryable")
                && shown.contains("key               k\n")
                && shown.contains("payload (2 bytes, text):\np0")
                && shown.contains(" ago)")
                && !shown.contains("Some(")
                && !shown.contains("x-retry-"),
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
        let spec = event_retry_core::adapter::SubscriptionSpec::new(
            "orders",
            event_retry_core::adapter::default_group("orders"),
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
    async fn groups_show_each_cause_and_a_purge_by_group_keeps_the_others() {
        let broker = Broker::memory();
        let handle = broker
            .consumer("orders")
            .start(handler_fn(|e: Event, _c: Context| async move {
                let n = String::from_utf8_lossy(&e.payload).into_owned();
                Err(if n.starts_with("stock") {
                    HandlerError::non_retryable(format!("no stock for sku {n}"))
                } else {
                    HandlerError::non_retryable(format!("order {n} has quantity -1"))
                })
            }))
            .await
            .unwrap();
        for (i, payload) in ["1", "2", "3", "stock-7"].iter().enumerate() {
            broker
                .producer()
                .publish("orders", Event::new(*payload).with_id(format!("e{i}")))
                .await
                .unwrap();
        }
        handle.wait_until(|s| s.dead_lettered >= 4).await;
        handle.shutdown().await.unwrap();
        let run = |command| {
            let broker = broker.clone();
            async move {
                let mut o = Vec::new();
                dlq(&broker, "orders", command, &mut o)
                    .await
                    .map(|()| String::from_utf8(o).unwrap())
            }
        };
        let text = run(DlqCommand::Groups {
            selection: Selection::default(),
            json: false,
        })
        .await
        .unwrap();
        assert!(
            text.starts_with("4 dead letters from orders in 2 failure groups"),
            "{text}"
        );
        assert!(
            text.contains("cause   order <n> has quantity -<n>"),
            "{text}"
        );
        assert!(text.contains("3 entries  non_retryable"), "{text}");
        let doc: serde_json::Value = serde_json::from_str(
            &run(DlqCommand::Groups {
                selection: Selection::default(),
                json: true,
            })
            .await
            .unwrap(),
        )
        .unwrap();
        let groups = doc.as_array().unwrap();
        assert_eq!(groups[0]["count"], 3);
        assert_eq!(groups[1]["pattern"], "no stock for sku stock-<n>");
        let hours: u64 = groups[0]["per_hour_last_24h"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(hours, 3, "every entry died within the last 24 h");
        let orders = groups[0]["fingerprint"].as_str().unwrap().to_string();
        let out = run(DlqCommand::Purge {
            selection: Selection {
                group: Some(orders),
                ..Selection::default()
            },
            yes: true,
        })
        .await
        .unwrap();
        assert_eq!(out.trim(), "purged 3 dead letters");
        let left = broker
            .dead_letters()
            .list("orders", &DlqFilter::all())
            .await
            .unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].event.metadata().event_id.as_deref(), Some("e3"));
    }

    #[tokio::test]
    async fn json_for_scripts_and_time_filters() {
        let broker = Broker::memory();
        dead_letters(&broker, "orders", 2).await;
        let run_list = |selection, json| {
            let broker = broker.clone();
            async move {
                let mut o = Vec::new();
                dlq(
                    &broker,
                    "orders",
                    DlqCommand::List { selection, json },
                    &mut o,
                )
                .await
                .map(|()| String::from_utf8(o).unwrap())
            }
        };
        let doc: serde_json::Value =
            serde_json::from_str(&run_list(Selection::default(), true).await.unwrap()).unwrap();
        let entries = doc.as_array().unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0]["reason"], "non_retryable");
        assert_eq!(entries[0]["key"], "k");
        assert_eq!(entries[0]["last_error"], "boom");
        assert!(
            entries[0]["dead_at"]["utc"]
                .as_str()
                .unwrap()
                .ends_with('Z')
        );
        let id = entries[0]["id"].as_str().unwrap().to_string();
        let mut o = Vec::new();
        dlq(
            &broker,
            "orders",
            DlqCommand::Show { id, json: true },
            &mut o,
        )
        .await
        .unwrap();
        let one: serde_json::Value = serde_json::from_slice(&o).unwrap();
        assert_eq!(one["payload"], "p0");
        assert_eq!(one["payload_format"], "text");

        // (since, until, how many of the 2 entries pass)
        let windows = [
            (Some("1h"), None, "2 dead letters"),
            (Some("2999-01-01T00:00:00Z"), None, "0 dead letters"),
            (None, Some("1h"), "0 dead letters"),
        ];
        for (since, until, want) in windows {
            let selection = Selection {
                since: since.map(Into::into),
                until: until.map(Into::into),
                ..Selection::default()
            };
            let out = run_list(selection, false).await.unwrap();
            assert!(out.starts_with(want), "{since:?}..{until:?}: {out}");
        }
        let bad = Selection {
            since: Some("last tuesday".into()),
            ..Selection::default()
        };
        assert_eq!(run_list(bad, false).await.unwrap_err().exit_code(), 2);
    }
}
