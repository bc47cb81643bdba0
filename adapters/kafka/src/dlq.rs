//! DLQ operations on `<topic>.dlq`, whose records cannot be deleted: what is done is kept as committed
//! offsets of one consumer group (`event-retry-dlq` by default).
//!
//! Per DLQ partition, the group's committed offset says "every entry below this was replayed or purged",
//! and the commit's metadata lists the entries above it that were removed out of order (a filtered replay
//! or purge). An operation reads each partition from that offset to its end, skips what the metadata
//! marks, applies itself, then commits the new mark: a replayed entry only after its copy to the origin
//! was acknowledged, so a replay is never repeated once it is marked, and never marked before it is safe.
//! Operations are meant for one operator at a time: two running at once on one DLQ may both replay an
//! entry.
//!
//! This module is the Kafka side of a DLQ operation only (read, replay one, mark removed, commit); the
//! operation itself — filters, limits, "replay, confirm, then remove" — is `event_retry_core::dlq`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use event_retry_core::adapter::{DlqSession, Native, StoredDeadLetter};
use event_retry_core::error::{Error, Kind, wrap};
use event_retry_core::event::{Event, RawMessage};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::codec;
use crate::error::{error, settings_error};
use crate::link::{Link, REQUEST_TIMEOUT};

/// How long reading a DLQ to its end may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The most bytes of removal marks a commit may carry (Kafka's default limit is 4096).
const MAX_MARKS: usize = 4_000;
/// The most entries above a partition's committed offset that may be marked removed (each is held in
/// memory while an operation runs).
const MAX_MARKED: usize = 1_000_000;
/// The tag that starts the marks, so metadata written by something else is not misread.
const MARKS_TAG: &str = "event-retry/v1:";

/// One DLQ partition as an operation sees it.
#[derive(Debug, Default)]
struct PartitionView {
    partition: i32,
    /// Everything below is removed.
    done_below: i64,
    /// Removed entries at or above `done_below`.
    removed: BTreeSet<i64>,
    /// The offsets holding records, read up to `end`.
    present: BTreeSet<i64>,
    /// The partition's end (the next offset to be written) when it was read.
    end: i64,
}

impl PartitionView {
    /// Marks `offsets` removed; returns the new commit position and its metadata.
    fn remove(&mut self, offsets: &[i64]) -> (i64, String) {
        self.removed.extend(offsets);
        while self.done_below < self.end
            && (self.removed.remove(&self.done_below) || !self.present.contains(&self.done_below))
        {
            self.done_below += 1;
        }
        (self.done_below, encode_marks(&self.removed))
    }
}

/// Offsets as ranges, `3-5,9`, after the tag.
fn encode_marks(removed: &BTreeSet<i64>) -> String {
    let mut out = String::from(MARKS_TAG);
    let mut iter = removed.iter().copied().peekable();
    let mut first = true;
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        if !first {
            out.push(',');
        }
        first = false;
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
    }
    out
}

fn decode_marks(text: &str) -> BTreeSet<i64> {
    let Some(body) = text.strip_prefix(MARKS_TAG) else {
        return BTreeSet::new();
    };
    let mut out = BTreeSet::new();
    for part in body.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>()) {
            out.extend(a..=b);
        }
    }
    out
}

/// An entry read from the DLQ.
struct Read {
    partition: i32,
    offset: i64,
    /// The consumer group that dead-lettered it (its replay goes back to that group's retry topic).
    group: Option<String>,
    message: RawMessage,
    /// Its headers whose value is null, written null again in a replay.
    nulls: codec::Nulls,
}

/// A DLQ read to its end, with the consumer that will commit the marks.
struct Snapshot {
    topic: String,
    consumer: BaseConsumer,
    views: Vec<PartitionView>,
    entries: Vec<Read>,
}

/// Opens one operation on `source`'s DLQ: reads it from the marks to its end (on a blocking thread);
/// `None` when the DLQ topic does not exist (nothing was dead-lettered).
pub(crate) async fn open(
    link: Arc<Link>,
    source: &str,
) -> Result<Option<Box<dyn DlqSession>>, Error> {
    let topic = link.config.dlq_topic(source);
    let reader = link.clone();
    let snapshot = tokio::task::spawn_blocking(move || read_blocking(&reader, topic))
        .await
        .map_err(wrap(Kind::Other, "read the DLQ"))??;
    Ok(snapshot.map(|snapshot| {
        Box::new(KafkaDlqSession {
            link,
            snapshot,
            read: 0,
            removed: Vec::new(),
        }) as Box<dyn DlqSession>
    }))
}

/// One DLQ operation: a snapshot of the DLQ, and the entries removed so far (committed at the end).
struct KafkaDlqSession {
    link: Arc<Link>,
    snapshot: Snapshot,
    read: usize,
    removed: Vec<(i32, i64)>,
}

#[async_trait]
impl DlqSession for KafkaDlqSession {
    async fn next(&mut self) -> Result<Option<StoredDeadLetter>, Error> {
        let Some(read) = self.snapshot.entries.get(self.read) else {
            return Ok(None);
        };
        self.read += 1;
        let mut native = Native::default();
        for name in read.nulls.names() {
            native.header_type(name, "null");
        }
        Ok(Some(
            StoredDeadLetter::new(
                format!("{}:{}", read.partition, read.offset),
                read.message.clone(),
            )
            .with_group(read.group.clone())
            .with_native(native),
        ))
    }

    async fn check_removal(&mut self, entries: &[usize]) -> Result<(), Error> {
        check_marks_fit(&self.snapshot, entries)
    }

    /// Sends the entry back: to the retry topic of the group that dead-lettered it (due at once, so
    /// other groups of the topic do not handle it again), else to the origin topic; in the partition the
    /// DLQ kept from the source (when the target has it).
    async fn replay(&mut self, entry: usize, origin: &str, event: &Event) -> Result<(), Error> {
        let read = self
            .snapshot
            .entries
            .get(entry)
            .ok_or_else(|| Error::new(Kind::NotFound, format!("no DLQ entry #{entry}")))?;
        let target = match &read.group {
            Some(group) => self.link.config.retry_topic(origin, group),
            None => origin.to_string(),
        };
        self.link.partitions(&target).await?;
        self.link
            .send(
                &target,
                Some(read.partition),
                &event.to_raw(),
                &read.nulls,
                &[],
                &format!("replay to {target}"),
            )
            .await
            .map(drop)
    }

    async fn remove(&mut self, entries: &[usize]) -> Result<(), Error> {
        for &i in entries {
            if let Some(read) = self.snapshot.entries.get(i) {
                self.removed.push((read.partition, read.offset));
            }
        }
        Ok(())
    }

    /// Commits the marks of the removed entries; nothing needs giving back (nothing was taken).
    async fn finish(self: Box<Self>) -> Result<(), Error> {
        if self.removed.is_empty() {
            return Ok(());
        }
        let KafkaDlqSession {
            mut snapshot,
            removed,
            ..
        } = *self;
        tokio::task::spawn_blocking(move || commit_marks(&mut snapshot, &removed))
            .await
            .map_err(wrap(Kind::Other, "record the DLQ marks"))?
    }
}

/// Refuses an operation whose marks would not fit in a commit, before it does anything.
fn check_marks_fit(snapshot: &Snapshot, chosen: &[usize]) -> Result<(), Error> {
    for view in &snapshot.views {
        let mut trial = PartitionView {
            partition: view.partition,
            done_below: view.done_below,
            removed: view.removed.clone(),
            present: view.present.clone(),
            end: view.end,
        };
        let offsets: Vec<i64> = chosen
            .iter()
            .map(|&i| &snapshot.entries[i])
            .filter(|r| r.partition == view.partition)
            .map(|r| r.offset)
            .collect();
        let (_, marks) = trial.remove(&offsets);
        if marks.len() > MAX_MARKS || trial.removed.len() > MAX_MARKED {
            return Err(Error::new(
                Kind::Unsupported,
                format!(
                    "this would leave too many scattered removals in partition {} of {} to record; \
                     replay or purge the older entries first (e.g. without a filter, or with --limit)",
                    view.partition, snapshot.topic
                ),
            ));
        }
    }
    Ok(())
}

fn commit_marks(snapshot: &mut Snapshot, marks: &[(i32, i64)]) -> Result<(), Error> {
    let mut tpl = TopicPartitionList::new();
    for view in &mut snapshot.views {
        let offsets: Vec<i64> = marks
            .iter()
            .filter(|(p, _)| *p == view.partition)
            .map(|(_, o)| *o)
            .collect();
        if offsets.is_empty() {
            continue;
        }
        let (position, metadata) = view.remove(&offsets);
        tpl.add_partition_offset(&snapshot.topic, view.partition, Offset::Offset(position))
            .map_err(error("record the DLQ marks"))?;
        if let Some(mut element) = tpl.find_partition(&snapshot.topic, view.partition) {
            element.set_metadata(metadata);
        }
    }
    if tpl.count() == 0 {
        return Ok(());
    }
    snapshot
        .consumer
        .commit(&tpl, CommitMode::Sync)
        .map_err(error(format!("record the DLQ marks of {}", snapshot.topic)))
}

fn read_blocking(link: &Link, topic: String) -> Result<Option<Snapshot>, Error> {
    let partitions = match link.partitions_blocking(&topic) {
        Ok(n) => n,
        // No DLQ topic yet: nothing was dead-lettered.
        Err(e) if e.kind() == Kind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let consumer: BaseConsumer = link
        .consumer_config(&link.config.dlq_group)
        .create()
        .map_err(settings_error("consumer"))?;
    let mut all = TopicPartitionList::new();
    for p in 0..partitions {
        all.add_partition(&topic, p);
    }
    let committed = consumer
        .committed_offsets(all, REQUEST_TIMEOUT)
        .map_err(error(format!("read the DLQ marks of {topic}")))?;
    let mut views = Vec::new();
    let mut assign = TopicPartitionList::new();
    for p in 0..partitions {
        let (low, high) = consumer
            .fetch_watermarks(&topic, p, REQUEST_TIMEOUT)
            .map_err(error(format!("read the end of {topic}")))?;
        let (done, removed) = match committed.find_partition(&topic, p) {
            Some(e) => match e.offset() {
                Offset::Offset(o) => (o, decode_marks(e.metadata())),
                _ => (low, BTreeSet::new()),
            },
            None => (low, BTreeSet::new()),
        };
        let start = done.max(low);
        // Marks below the log's start (records gone by retention) are dropped.
        let removed: BTreeSet<i64> = removed.into_iter().filter(|&o| o >= start).collect();
        if start < high {
            assign
                .add_partition_offset(&topic, p, Offset::Offset(start))
                .map_err(error("assign the DLQ"))?;
        }
        views.push(PartitionView {
            partition: p,
            done_below: start,
            removed,
            present: BTreeSet::new(),
            end: high,
        });
    }
    let mut entries = Vec::new();
    if assign.count() > 0 {
        consumer
            .assign(&assign)
            .map_err(error(format!("read {topic}")))?;
        let deadline = Instant::now() + READ_TIMEOUT;
        let mut seen: Vec<i64> = views.iter().map(|v| v.done_below - 1).collect();
        // A partition is read to its end once its last record was read, or the consumer's position
        // passed its end: the last offsets of a log written in transactions are commit markers (or
        // records of an aborted transaction), which a `read_committed` reader never gets.
        while views
            .iter()
            .zip(&seen)
            .any(|(v, s)| *s < v.end - 1 && position_of(&consumer, &topic, v.partition) < v.end)
        {
            if Instant::now() > deadline {
                return Err(Error::new(
                    Kind::Timeout,
                    format!("reading {topic} to its end took longer than {READ_TIMEOUT:?}"),
                ));
            }
            let Some(message) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let message = message.map_err(error(format!("read {topic}")))?;
            let (p, offset) = (message.partition(), message.offset());
            let Some(i) = views.iter().position(|v| v.partition == p) else {
                continue;
            };
            if offset >= views[i].end {
                continue;
            }
            seen[i] = seen[i].max(offset);
            views[i].present.insert(offset);
            if views[i].removed.contains(&offset) {
                continue;
            }
            let decoded = codec::decode(&message);
            entries.push(Read {
                partition: p,
                offset,
                group: decoded.group,
                message: decoded.raw,
                nulls: decoded.nulls,
            });
        }
    }
    Ok(Some(Snapshot {
        topic,
        consumer,
        views,
        entries,
    }))
}

/// The consumer's position on `partition` of `topic`: the offset it reads next (-1 if unknown).
fn position_of(consumer: &BaseConsumer, topic: &str, partition: i32) -> i64 {
    consumer
        .position()
        .ok()
        .and_then(|tpl| {
            tpl.find_partition(topic, partition)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
        })
        .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip_as_ranges() {
        let set: BTreeSet<i64> = [3, 4, 5, 9, 11, 12].into_iter().collect();
        let text = encode_marks(&set);
        assert_eq!(text, "event-retry/v1:3-5,9,11-12");
        assert_eq!(decode_marks(&text), set);
        assert!(decode_marks("something else").is_empty());
    }

    #[test]
    fn the_mark_advances_over_removed_and_missing_offsets() {
        let mut view = PartitionView {
            partition: 0,
            done_below: 0,
            removed: BTreeSet::new(),
            present: [0, 1, 2, 4, 5].into_iter().collect(),
            end: 6,
        };
        // Removing 1 leaves 0: nothing moves, 1 is marked.
        assert_eq!(view.remove(&[1]), (0, "event-retry/v1:1".to_string()));
        // Removing 0 and 2 moves past 3 (no record there) up to 4.
        assert_eq!(view.remove(&[0, 2]), (4, "event-retry/v1:".to_string()));
        assert_eq!(view.remove(&[4, 5]), (6, "event-retry/v1:".to_string()));
    }
}
