//! Moving dead letters from one broker to another with their history — the step of a broker migration
//! that teams otherwise script by hand, losing the history on the way.
//!
//! An entry moves in three steps: copy it to the target, wait for the target's confirmation, then remove
//! it from the source. A migration that dies at any point therefore loses nothing, and one started again
//! leaves no duplicate: each copy carries the entry it was copied from (`x-retry-migrated-from`:
//! transport, source topic and entry id), the target's DLQ is listed once before anything is copied, and
//! a source entry whose copy is already there is only removed from the source.
//!
//! What moves: payload, key and the producer's headers byte for byte; the SDK's whole history (event id,
//! attempts, retries, first seen, origin, last error and its kind, last delay, replay count and time,
//! why, when and by which consumer it was dead-lettered); and the consumer group that dead-lettered it,
//! where the target keeps one per entry (a replay on the target goes back to that group). What a broker
//! holds beyond those — AMQP properties, typed header values, a Kafka null header, a Pulsar event time —
//! is written in the target's plain form, and every such fact is reported per entry as not kept. The
//! target gives each entry an id of its own.

use std::collections::HashSet;

use super::{DeadLetter, DeadLetters, DlqFilter, Progress, finish, select};
use crate::adapter::DlqSession;
use crate::error::Error;

/// What a migration did with one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Moved {
    /// Copied to the target, confirmed, and removed from the source.
    Copied,
    /// Already in the target (an earlier run copied it and stopped before removing it): removed from
    /// the source only.
    AlreadyThere,
    /// A dry run: it would be copied.
    WouldCopy,
    /// A dry run: it is already in the target and would only be removed from the source.
    WouldRemove,
}

impl Moved {
    /// The outcome in words.
    pub fn as_str(self) -> &'static str {
        match self {
            Moved::Copied => "copied",
            Moved::AlreadyThere => "already there",
            Moved::WouldCopy => "would copy",
            Moved::WouldRemove => "already there, would remove",
        }
    }
}

impl std::fmt::Display for Moved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of a migration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovedEntry {
    /// Its id in the source DLQ.
    pub id: String,
    /// Its event id.
    pub event_id: Option<String>,
    /// What was done with it.
    pub moved: Moved,
    /// What the source held of it that the target does not keep (see [`DeadLetters::migrate`]).
    pub not_kept: Vec<String>,
}

/// What a migration did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Every entry selected, in the source's order.
    pub entries: Vec<MovedEntry>,
}

impl MigrationReport {
    /// How many entries had `outcome`.
    pub fn count(&self, outcome: Moved) -> usize {
        self.entries.iter().filter(|e| e.moved == outcome).count()
    }

    /// How many entries kept everything the source held.
    pub fn complete(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| e.not_kept.is_empty())
            .count()
    }
}

/// Where a migration goes and how.
#[derive(Clone, Copy, Debug)]
pub struct MigrationTarget<'a> {
    /// The target broker's DLQ operations.
    pub dead_letters: &'a DeadLetters,
    /// The source topic on the target whose DLQ receives the entries (often the same name).
    pub topic: &'a str,
    /// Only report what would be done.
    pub dry_run: bool,
}

/// The mark a migration's copy of entry `id` of `source_topic`'s DLQ on the `transport` transport carries
/// in [`RetryMetadata::migrated_from`](crate::metadata::RetryMetadata::migrated_from): by it a rerun
/// knows what it already copied.
pub fn migration_mark(transport: &str, source_topic: &str, id: &str) -> String {
    format!("{transport}:{source_topic}:{id}")
}

/// Whether `target` holds source entry `entry` itself, not a copy: the same id and the same event, mark
/// included (a copy always carries a new mark) — the two sides are one DLQ.
fn same_entry(target: &DeadLetter, entry: &DeadLetter) -> bool {
    target.id == entry.id && target.event == entry.event
}

impl DeadLetters {
    /// Moves the entries of `source_topic`'s DLQ that `filter` selects into the DLQ of `to.topic` on
    /// `to`'s broker, with their history: each is copied, confirmed by the target, then removed from the
    /// source. Each copy carries the entry it came from ([`migration_mark`]); before copying, the
    /// target's DLQ is listed once, and an entry whose copy is already there (an earlier run died before
    /// removing it) is only removed from the source: a run that dies anywhere loses nothing, and running
    /// it again finishes without duplicates. Refuses, before it does anything, a target DLQ that holds the
    /// source's entries themselves (one DLQ under two URLs). Stops at the first entry that cannot be
    /// copied or removed, with an error naming it.
    ///
    /// What moves: payload, key and the producer's headers byte for byte; the whole history (event id,
    /// attempts, retries, first seen, origin, last error and its kind, last delay, replay count and time,
    /// why, when and by which consumer it was dead-lettered); the consumer group that dead-lettered it,
    /// where the target keeps one per entry. What a broker holds beyond those ([`DeadLetter::native`]:
    /// AMQP properties, typed headers, a Kafka null header, a Pulsar event time) is written in the
    /// target's plain form and listed per entry in [`MovedEntry::not_kept`].
    pub async fn migrate(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
        to: MigrationTarget<'_>,
        progress: &dyn Progress,
    ) -> Result<MigrationReport, Error> {
        let in_target = to.dead_letters.list(to.topic, &DlqFilter::all()).await?;
        let Some(mut session) = self.transport.open_dead_letters(source_topic).await? else {
            return Ok(MigrationReport::default());
        };
        let source = Source {
            transport: self.transport.name(),
            topic: source_topic,
        };
        let result = move_entries(session.as_mut(), source, filter, to, &in_target, progress).await;
        finish(session, result).await
    }
}

/// Where a migration takes its entries from.
#[derive(Clone, Copy)]
struct Source<'a> {
    transport: &'static str,
    topic: &'a str,
}

async fn move_entries(
    session: &mut dyn DlqSession,
    source: Source<'_>,
    filter: &DlqFilter,
    to: MigrationTarget<'_>,
    in_target: &[DeadLetter],
    progress: &dyn Progress,
) -> Result<MigrationReport, Error> {
    let source_topic = source.topic;
    let chosen = select(session, filter).await?;
    if let Some((_, entry)) = chosen
        .iter()
        .find(|(_, e)| in_target.iter().any(|t| same_entry(t, e)))
    {
        return Err(Error::new(
            crate::error::Kind::InvalidInput,
            format!(
                "the target DLQ holds source entry {} itself: source and target are one DLQ",
                entry.id
            ),
        ));
    }
    let present: HashSet<&str> = in_target
        .iter()
        .filter_map(|t| t.event.metadata().migrated_from.as_deref())
        .collect();
    if !chosen.is_empty() {
        // A dry run checks too: it must not promise what the real run would refuse.
        let indices: Vec<usize> = chosen.iter().map(|(i, _)| *i).collect();
        session.check_removal(&indices).await?;
    }
    progress.start(chosen.len());
    let target = to.dead_letters.transport();
    let keeps_groups = target.capabilities_for(to.topic).fan_out;
    let mut report = MigrationReport::default();
    for (index, entry) in chosen {
        let mark = migration_mark(source.transport, source_topic, &entry.id);
        let there = present.contains(mark.as_str());
        let moved = match (there, to.dry_run) {
            (true, true) => Moved::WouldRemove,
            (false, true) => Moved::WouldCopy,
            (true, false) => Moved::AlreadyThere,
            (false, false) => {
                let mut event = retargeted(&entry, source_topic, to.topic);
                event.metadata_mut().migrated_from = Some(mark);
                let group = if keeps_groups {
                    entry.group.as_deref()
                } else {
                    None
                };
                target
                    .write_dead_letter(to.topic, group, &event)
                    .await
                    .map_err(|e| named(e, &entry))?;
                Moved::Copied
            }
        };
        if !to.dry_run {
            session
                .remove(&[index])
                .await
                .map_err(|e| named(e, &entry))?;
        }
        report.entries.push(MovedEntry {
            id: entry.id.clone(),
            event_id: entry.event.id().map(str::to_string),
            moved,
            not_kept: not_kept(&entry, keeps_groups, target.name()),
        });
        progress.advance(report.entries.len());
    }
    Ok(report)
}

/// The event as the target's DLQ holds it: the same, but for an origin on the source topic, which names
/// the target topic when that has another name (a replay on the target goes to its origin).
fn retargeted(entry: &DeadLetter, source_topic: &str, to_topic: &str) -> crate::event::Event {
    let mut event = entry.event.clone();
    if source_topic != to_topic
        && let Some(origin) = event.metadata_mut().origin.as_mut()
        && *origin.topic == *source_topic
    {
        origin.topic = to_topic.into();
    }
    event
}

/// What the source held of `entry` that the target does not keep.
fn not_kept(entry: &DeadLetter, keeps_groups: bool, target: &str) -> Vec<String> {
    let mut lost = entry.native.describe();
    if let (Some(group), false) = (&entry.group, keeps_groups) {
        lost.push(format!(
            "group {group} (the {target} transport keeps no group per dead letter)"
        ));
    }
    lost
}

/// `error`, naming the entry it happened to.
fn named(error: Error, entry: &DeadLetter) -> Error {
    let what = format!(
        "migrating DLQ entry {} (event {})",
        entry.id,
        entry.event.id().unwrap_or("without an id")
    );
    error.with_operation(what)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::broker::Broker;
    use crate::classify::HandlerError;
    use crate::event::Event;
    use crate::runtime::{Context, handler_fn};

    /// Dead-letters `n` events of `topic` on `broker` (each after one retry, so attempts is 2).
    async fn dead(broker: &Broker, topic: &str, n: usize) {
        let handle = broker
            .consumer(topic)
            .policy(crate::policy::RetryPolicy::parse("10ms x1").unwrap())
            .start(handler_fn(|_e: Event, _c: Context| async {
                Err::<(), _>(HandlerError::deferred("still down"))
            }))
            .await
            .unwrap();
        for i in 0..n {
            let event = Event::new(format!("p{i}"))
                .with_id(format!("e{i}"))
                .with_key("k")
                .with_header("trace", vec![0xff, 0x00]);
            broker.producer().publish(topic, event).await.unwrap();
        }
        tokio::time::timeout(
            Duration::from_secs(5),
            handle.wait_until(|s| s.dead_lettered >= n as u64),
        )
        .await
        .unwrap();
        handle.shutdown().await.unwrap();
    }

    /// Every entry of the DLQ of `orders` that `dlq` operates on.
    async fn orders(dlq: &DeadLetters) -> Vec<DeadLetter> {
        dlq.list("orders", &DlqFilter::all()).await.unwrap()
    }

    /// Migrates every entry of `orders` from `from` to the DLQ operations `to`.
    async fn migrate(
        from: &Broker,
        to: &DeadLetters,
        dry_run: bool,
    ) -> Result<MigrationReport, Error> {
        let target = MigrationTarget {
            dead_letters: to,
            topic: "orders",
            dry_run,
        };
        from.dead_letters()
            .migrate(
                "orders",
                &DlqFilter::all(),
                target,
                &super::super::NoProgress,
            )
            .await
    }

    #[tokio::test]
    async fn entries_move_with_their_history_and_leave_the_source() {
        let (from, to) = (Broker::memory(), Broker::memory());
        dead(&from, "orders", 3).await;
        let before = orders(&from.dead_letters()).await;
        let to_dlq = to.dead_letters();
        let report = migrate(&from, &to_dlq, false).await.unwrap();
        assert_eq!(report.count(Moved::Copied), 3);
        let after = orders(&to_dlq).await;
        assert_eq!(after.len(), 3);
        for (a, b) in before.iter().zip(&after) {
            let mut copy = b.event.clone();
            let mark = copy.metadata_mut().migrated_from.take();
            assert_eq!(mark, Some(migration_mark("memory", "orders", &a.id)));
            assert_eq!(a.event, copy, "payload, key, headers and history");
            assert_eq!(a.event.metadata().attempts, 2);
            assert_eq!(a.group, b.group);
        }
        let left = orders(&from.dead_letters()).await;
        assert!(left.is_empty(), "removed from the source");
    }

    #[tokio::test]
    async fn a_run_after_an_interrupted_one_copies_nothing_twice() {
        let (from, to) = (Broker::memory(), Broker::memory());
        dead(&from, "orders", 3).await;
        // An earlier run copied the first entry and died before removing it from the source.
        let first = orders(&from.dead_letters()).await.remove(0);
        let mut copy = first.event.clone();
        copy.metadata_mut().migrated_from = Some(migration_mark("memory", "orders", &first.id));
        to.transport()
            .write_dead_letter("orders", first.group.as_deref(), &copy)
            .await
            .unwrap();
        let to_dlq = to.dead_letters();
        let dry = migrate(&from, &to_dlq, true).await.unwrap();
        assert_eq!(
            (dry.count(Moved::WouldRemove), dry.count(Moved::WouldCopy)),
            (1, 2)
        );
        assert_eq!(orders(&to_dlq).await.len(), 1, "a dry run writes nothing");
        let report = migrate(&from, &to_dlq, false).await.unwrap();
        assert_eq!(
            (
                report.count(Moved::AlreadyThere),
                report.count(Moved::Copied)
            ),
            (1, 2)
        );
        let ids: HashSet<String> = orders(&to_dlq)
            .await
            .iter()
            .map(|e| e.event.id().unwrap().to_string())
            .collect();
        assert_eq!(ids.len(), 3, "each event once: {ids:?}");
        assert_eq!(orders(&to_dlq).await.len(), 3);
    }

    #[tokio::test]
    async fn one_dlq_under_two_names_is_refused_and_keeps_its_entries() {
        let broker = Broker::memory();
        dead(&broker, "orders", 2).await;
        let err = migrate(&broker, &broker.dead_letters(), false)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("one DLQ"), "{err}");
        let left = orders(&broker.dead_letters()).await;
        assert_eq!(left.len(), 2);
        assert!(
            left.iter()
                .all(|e| e.event.metadata().migrated_from.is_none())
        );
    }

    #[tokio::test]
    async fn copies_carry_their_source_and_unrelated_look_alikes_are_not_taken_for_them() {
        let (from, to) = (Broker::memory(), Broker::memory());
        dead(&from, "orders", 2).await;
        // The target holds an entry equal in every way but the mark (dead-lettered there on its own).
        let twin = orders(&from.dead_letters()).await.remove(0);
        to.transport()
            .write_dead_letter("orders", twin.group.as_deref(), &twin.event)
            .await
            .unwrap();
        let to_dlq = to.dead_letters();
        let report = migrate(&from, &to_dlq, false).await.unwrap();
        assert_eq!(
            report.count(Moved::Copied),
            2,
            "the look-alike is not a copy"
        );
        let marks: Vec<Option<String>> = orders(&to_dlq)
            .await
            .into_iter()
            .map(|e| e.event.metadata().migrated_from.clone())
            .collect();
        assert_eq!(marks.iter().filter(|m| m.is_some()).count(), 2);
        assert!(
            marks
                .iter()
                .flatten()
                .all(|m| m.starts_with("memory:orders:"))
        );
    }

    #[tokio::test]
    async fn an_unwritable_target_keeps_the_entry_in_the_source() {
        let (from, to) = (Broker::memory(), crate::memory::MemoryTransport::new());
        dead(&from, "orders", 2).await;
        to.set_dlq_writable("orders", false);
        let to_broker =
            Broker::from(std::sync::Arc::new(to) as std::sync::Arc<dyn crate::adapter::Transport>);
        let to_dlq = to_broker.dead_letters();
        let err = migrate(&from, &to_dlq, false).await.unwrap_err();
        assert!(err.to_string().contains("event e0"), "{err}");
        assert_eq!(orders(&from.dead_letters()).await.len(), 2);
    }

    #[test]
    fn natives_and_groups_the_target_cannot_hold_are_reported() {
        let mut entry = DeadLetter {
            id: "1".into(),
            event: Event::new("x"),
            group: Some("billing".into()),
            native: crate::adapter::Native::default(),
        };
        entry.native.property("amqp.priority", "5");
        entry.native.header_type("retries", "long-int");
        assert_eq!(
            not_kept(&entry, false, "sqs"),
            [
                "amqp.priority=5",
                "header retries: long-int",
                "group billing (the sqs transport keeps no group per dead letter)"
            ]
        );
        assert_eq!(not_kept(&entry, true, "kafka").len(), 2);
    }

    #[test]
    fn an_origin_on_the_source_topic_follows_a_renamed_topic() {
        let mut event = Event::new("x");
        event.metadata_mut().origin = Some(crate::metadata::Origin::new("orders").at(2, 7));
        let entry = DeadLetter {
            id: "1".into(),
            event,
            group: None,
            native: crate::adapter::Native::default(),
        };
        let moved = retargeted(&entry, "orders", "orders-v2");
        let origin = moved.metadata().origin.clone().unwrap();
        assert_eq!(
            (&*origin.topic, origin.partition, origin.offset),
            ("orders-v2", Some(2), Some(7))
        );
        assert_eq!(retargeted(&entry, "orders", "orders"), entry.event);
    }
}
