//! Dead letter queue operations: list, show, replay, purge — the same on every broker, written once.
//!
//! An SRE triaging at night should not need to know how a broker stores dead letters. Entries are
//! addressed by the *source* topic they were consumed from and an id the broker gives them (an offset, a
//! message id). Every operation here runs the same steps over a broker's [`DlqSession`]: read the entries,
//! decode them, pick those the [`DlqFilter`] selects, then act — a replay sends the event back to its
//! origin with the payload, key and producer headers unedited, attempts restarted and the replay count
//! raised, and removes (or marks) the entry only after the broker confirmed the copy — and finally give
//! back what was not removed. A broker supplies only the five steps of its session.

mod groups;
mod migrate;

pub use groups::{FailureGroup, Fingerprint, failure_groups, normalize};
pub use migrate::{MigrationReport, MigrationTarget, Moved, MovedEntry, migration_mark};

use bytes::Bytes;

use crate::adapter::{DlqSession, Native, StoredDeadLetter, Transport};
use crate::classify::FailureKind;
use crate::error::Error;
use crate::event::Event;
use crate::metadata::{self, DeadInfo};
use crate::time::Timestamp;

/// One dead letter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The broker's id for the entry (stable until the entry is removed).
    pub id: String,
    /// The event, with its dead-letter metadata ([`DeadLetter::dead`]).
    pub event: Event,
    /// The consumer group that dead-lettered it, where the broker keeps one (Kafka, RabbitMQ, Pulsar):
    /// a replay goes back to that group alone.
    pub group: Option<String>,
    /// What the broker holds beyond payload, key and header bytes: message properties and header types.
    pub native: Native,
}

impl DeadLetter {
    /// Why, when and by which consumer the event was dead-lettered.
    pub fn dead(&self) -> Option<&DeadInfo> {
        self.event.metadata().dead.as_ref()
    }

    /// Decodes a stored entry; metadata that does not parse is skipped (a poison entry keeps what did).
    fn decode(stored: StoredDeadLetter) -> Self {
        let (meta, headers, _) = metadata::decode_lenient(&stored.message.headers);
        DeadLetter {
            id: stored.id,
            event: Event::from_parts(stored.message.payload, stored.message.key, headers, meta),
            group: stored.group,
            native: stored.native,
        }
    }

    /// Which dead-lettering this entry records: the event id and its replay count. A redelivered event
    /// can be dead-lettered twice in one life (the broker delivered it again before the first copy's
    /// original was settled); such entries are copies of one dead-lettering, and replaying both would run
    /// the event twice. `None` for an entry without an event id (it is its own).
    pub fn dead_lettering(&self) -> Option<(&str, u32)> {
        let meta = self.event.metadata();
        meta.event_id.as_deref().map(|id| (id, meta.replay_count))
    }

    /// What a replay sends back, and where: the event with its payload, key and headers unedited, its
    /// attempts restarted and its replay count raised ([`metadata::RetryMetadata::reset_for_replay`]),
    /// and the topic it was dead-lettered from (`source_topic` when its metadata names none).
    pub fn for_replay(&self, source_topic: &str) -> (Event, String) {
        let mut event = self.event.clone();
        event.metadata_mut().reset_for_replay(Timestamp::now());
        let origin = event
            .metadata()
            .origin
            .as_ref()
            .map_or(source_topic, |o| &*o.topic)
            .to_string();
        (event, origin)
    }
}

/// Which dead letters an operation applies to; an empty filter selects all.
///
/// ```
/// use event_retry_core::classify::FailureKind;
/// use event_retry_core::dlq::DlqFilter;
/// use event_retry_core::time::Timestamp;
///
/// // The poison events of one customer from the last hour, at most 50 of them.
/// let filter = DlqFilter::all()
///     .error_kind(FailureKind::NonRetryable)
///     .key("customer-42")
///     .since(Timestamp::now().minus(std::time::Duration::from_secs(3600)))
///     .limit(50);
/// assert!(filter.ids.is_none());
/// ```
///
/// Criteria may be added, so a filter is built from [`DlqFilter::all`] or [`DlqFilter::id`]; its fields
/// stay public to read and to set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DlqFilter {
    /// Only these entry ids.
    pub ids: Option<Vec<String>>,
    /// Only entries whose last error was of this kind.
    pub error_kind: Option<FailureKind>,
    /// Only entries with this key.
    pub key: Option<Bytes>,
    /// Only entries dead-lettered at or after this time.
    pub since: Option<Timestamp>,
    /// Only entries dead-lettered before this time.
    pub until: Option<Timestamp>,
    /// Only entries whose last error contains this text (ignoring case).
    pub error_text: Option<String>,
    /// At most this many entries.
    pub limit: Option<usize>,
    /// Only entries of this failure group ([`DeadLetter::fingerprint`]).
    pub fingerprint: Option<String>,
}

impl DlqFilter {
    /// Selects every entry.
    pub fn all() -> Self {
        Self::default()
    }

    /// Selects one entry by id.
    pub fn id(id: impl Into<String>) -> Self {
        Self {
            ids: Some(vec![id.into()]),
            ..Self::default()
        }
    }

    /// The same filter, only these entry ids.
    pub fn ids(mut self, ids: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.ids = Some(ids.into_iter().map(Into::into).collect());
        self
    }

    /// The same filter, only entries whose last error was of `kind`.
    pub fn error_kind(mut self, kind: FailureKind) -> Self {
        self.error_kind = Some(kind);
        self
    }

    /// The same filter, only entries with this key.
    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The same filter, only entries dead-lettered at or after `at`.
    pub fn since(mut self, at: Timestamp) -> Self {
        self.since = Some(at);
        self
    }

    /// The same filter, only entries dead-lettered before `at`.
    pub fn until(mut self, at: Timestamp) -> Self {
        self.until = Some(at);
        self
    }

    /// The same filter, only entries whose last error contains `text` (ignoring case).
    pub fn error_text(mut self, text: impl Into<String>) -> Self {
        self.error_text = Some(text.into());
        self
    }

    /// The same filter, only entries of the failure group `fingerprint`.
    pub fn fingerprint(mut self, fingerprint: impl Into<String>) -> Self {
        self.fingerprint = Some(fingerprint.into());
        self
    }

    /// The same filter, at most `n` entries.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }

    /// Whether `entry` passes the filter (ignoring `limit`).
    pub fn matches(&self, entry: &DeadLetter) -> bool {
        let meta = entry.event.metadata();
        let dead_at = meta.dead.as_ref().map(|d| d.at);
        self.ids.as_ref().is_none_or(|ids| ids.contains(&entry.id))
            && self.error_kind.is_none_or(|k| meta.error_kind == Some(k))
            && self
                .key
                .as_ref()
                .is_none_or(|k| entry.event.key.as_ref() == Some(k))
            && self.since.is_none_or(|t| dead_at.is_some_and(|d| d >= t))
            && self.until.is_none_or(|t| dead_at.is_some_and(|d| d < t))
            && self.error_text.as_deref().is_none_or(|text| {
                meta.last_error
                    .as_deref()
                    .is_some_and(|e| e.to_lowercase().contains(&text.to_lowercase()))
            })
            && self
                .fingerprint
                .as_deref()
                .is_none_or(|f| entry.fingerprint().as_str() == f.trim())
    }
}

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Entries sent back to their origin (and removed or marked in the DLQ).
    pub replayed: usize,
    /// Ids of the entries replayed, in order.
    pub ids: Vec<String>,
    /// Ids of the entries removed without a replay because they copy a replayed one (the same event id
    /// and replay count: [`DeadLetter::dead_lettering`]), selected or not: one dead-lettering is
    /// replayed once.
    pub copies_removed: Vec<String>,
}

/// How many of `entries` copy an earlier one's dead-lettering ([`DeadLetter::dead_lettering`]): the
/// entries beyond one per event id and replay count.
pub fn copies(entries: &[DeadLetter]) -> usize {
    let mut seen = std::collections::HashSet::new();
    entries
        .iter()
        .filter_map(DeadLetter::dead_lettering)
        .filter(|key| !seen.insert(*key))
        .count()
}

/// What an operation does with the entries it selects (a replay has its own steps: [`replay`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    List,
    Purge,
}

/// The dead letter queues of one broker: list, show, replay and purge by source topic.
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use event_retry_core::broker::Broker;
/// use event_retry_core::dlq::DlqFilter;
///
/// let broker = Broker::memory();
/// let dlq = broker.dead_letters();
/// for entry in dlq.list("orders", &DlqFilter::all()).await? {
///     let dead = entry.dead();
///     println!("{} {:?} {:?}", entry.id, dead.map(|d| d.reason), entry.event.metadata().last_error);
/// }
/// // Send one entry back to its origin: attempts restart, the replay count rises, and the entry is
/// // removed only after the broker confirmed the copy.
/// let report = dlq.replay("orders", &DlqFilter::id("0")).await?;
/// assert_eq!(report.replayed, 0); // nothing was dead-lettered on this fresh broker
/// assert_eq!(dlq.purge("orders", &DlqFilter::all()).await?, 0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DeadLetters {
    transport: std::sync::Arc<dyn Transport>,
}

impl std::fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetters")
            .field("broker", &self.transport.name())
            .finish()
    }
}

impl DeadLetters {
    /// The DLQ operations of `transport`.
    pub fn new(transport: std::sync::Arc<dyn Transport>) -> Self {
        Self { transport }
    }

    /// Entries dead-lettered from `source_topic` that pass `filter`, oldest first.
    pub async fn list(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<Vec<DeadLetter>, Error> {
        self.run(source_topic, filter, Action::List, &NoProgress)
            .await
    }

    /// The selected entries grouped by cause ([`failure_groups`]), the largest group first.
    pub async fn groups(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<Vec<FailureGroup>, Error> {
        Ok(failure_groups(&self.list(source_topic, filter).await?))
    }

    /// One entry with all its metadata.
    pub async fn show(&self, source_topic: &str, id: &str) -> Result<Option<DeadLetter>, Error> {
        Ok(self.list(source_topic, &DlqFilter::id(id)).await?.pop())
    }

    /// Sends the selected entries back to their origin (payload unedited, attempts restarted, replay count
    /// raised) and removes or marks each only after the broker confirmed its copy. On a failure, the
    /// entries replayed before it stay replayed and removed, and the error is returned.
    pub async fn replay(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<ReplayReport, Error> {
        self.replay_with(source_topic, filter, &NoProgress).await
    }

    /// [`DeadLetters::replay`], telling `progress` how far it is.
    pub async fn replay_with(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
        progress: &dyn Progress,
    ) -> Result<ReplayReport, Error> {
        let Some(mut session) = self.transport.open_dead_letters(source_topic).await? else {
            return Ok(ReplayReport::default());
        };
        let result = replay(session.as_mut(), source_topic, filter, progress).await;
        finish(session, result).await
    }

    /// Removes (or marks as purged) the selected entries; returns how many.
    pub async fn purge(&self, source_topic: &str, filter: &DlqFilter) -> Result<usize, Error> {
        self.purge_with(source_topic, filter, &NoProgress).await
    }

    /// [`DeadLetters::purge`], telling `progress` how far it is.
    pub async fn purge_with(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
        progress: &dyn Progress,
    ) -> Result<usize, Error> {
        Ok(self
            .run(source_topic, filter, Action::Purge, progress)
            .await?
            .len())
    }

    /// The broker these operations run on.
    pub fn transport(&self) -> &std::sync::Arc<dyn Transport> {
        &self.transport
    }

    async fn run(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
        action: Action,
        progress: &dyn Progress,
    ) -> Result<Vec<DeadLetter>, Error> {
        let Some(mut session) = self.transport.open_dead_letters(source_topic).await? else {
            return Ok(Vec::new());
        };
        let result = apply(session.as_mut(), filter, action, progress).await;
        finish(session, result).await
    }
}

/// Ends `session` — it gives back what was not removed — after a failure too; the operation's own
/// error comes first.
async fn finish<T>(session: Box<dyn DlqSession>, result: Result<T, Error>) -> Result<T, Error> {
    let finished = session.finish().await;
    let done = result?;
    finished?;
    Ok(done)
}

/// Where a long DLQ operation tells how far it is: a progress bar, a console's live view.
pub trait Progress: Send + Sync {
    /// The operation selected `total` entries and starts acting on them.
    fn start(&self, total: usize) {
        let _ = total;
    }

    /// `done` of the selected entries are done.
    fn advance(&self, done: usize) {
        let _ = done;
    }
}

/// A [`Progress`] that reports nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// How many entries a purge removes in one call: progress shows between calls.
const PURGE_CHUNK: usize = 256;

/// Reads the entries and picks those `filter` selects (up to its limit), each with its index in the
/// session.
async fn select(
    session: &mut dyn DlqSession,
    filter: &DlqFilter,
) -> Result<Vec<(usize, DeadLetter)>, Error> {
    let limit = filter.limit.unwrap_or(usize::MAX);
    let mut chosen: Vec<(usize, DeadLetter)> = Vec::new();
    let mut index = 0;
    while chosen.len() < limit {
        let Some(stored) = session.next().await? else {
            break;
        };
        let entry = DeadLetter::decode(stored);
        if filter.matches(&entry) {
            chosen.push((index, entry));
        }
        index += 1;
    }
    Ok(chosen)
}

/// One selected entry of a replay: replayed with the unselected copies of it that go too (`first`), or
/// removed as a copy of a selected entry replayed before it.
struct Step<'a> {
    index: usize,
    entry: &'a DeadLetter,
    /// Session index and entry id of each unselected copy.
    copies: Vec<(usize, String)>,
    first: bool,
}

impl Step<'_> {
    /// The session indices this step removes.
    fn removals(&self) -> Vec<usize> {
        std::iter::once(self.index)
            .chain(self.copies.iter().map(|(c, _)| *c))
            .collect()
    }
}

/// Replays the entries `filter` selects, one per dead-lettering: the first entry of each is sent back
/// and removed with every copy of it in the DLQ (read to its end to find them), after the broker
/// confirmed the replay.
async fn replay(
    session: &mut dyn DlqSession,
    source_topic: &str,
    filter: &DlqFilter,
    progress: &dyn Progress,
) -> Result<ReplayReport, Error> {
    // The selection, and every other entry by dead-lettering: the copies a replay also removes.
    let limit = filter.limit.unwrap_or(usize::MAX);
    let mut chosen: Vec<(usize, DeadLetter)> = Vec::new();
    let mut rest: std::collections::HashMap<(String, u32), Vec<(usize, String)>> =
        std::collections::HashMap::new();
    let mut index = 0;
    while let Some(stored) = session.next().await? {
        let entry = DeadLetter::decode(stored);
        if chosen.len() < limit && filter.matches(&entry) {
            chosen.push((index, entry));
        } else if let Some((id, replays)) = entry.dead_lettering() {
            rest.entry((id.to_string(), replays))
                .or_default()
                .push((index, entry.id.clone()));
        }
        index += 1;
    }
    if chosen.is_empty() {
        return Ok(ReplayReport::default());
    }
    // What each chosen entry does: replay it with the copies to remove, or remove it as a copy.
    let mut replayed_keys = std::collections::HashSet::new();
    let steps: Vec<Step<'_>> = chosen
        .iter()
        .map(|(index, entry)| {
            let key = entry
                .dead_lettering()
                .map(|(id, replays)| (id.to_string(), replays));
            let first = key.as_ref().is_none_or(|k| replayed_keys.insert(k.clone()));
            let copies = match (&key, first) {
                (Some(k), true) => rest.remove(k).unwrap_or_default(),
                _ => Vec::new(),
            };
            Step {
                index: *index,
                entry,
                copies,
                first,
            }
        })
        .collect();
    let mut removals: Vec<usize> = steps.iter().flat_map(Step::removals).collect();
    removals.sort_unstable();
    session.check_removal(&removals).await?;
    progress.start(steps.len());
    let mut report = ReplayReport::default();
    for (done, step) in steps.into_iter().enumerate() {
        if step.first {
            let (event, origin) = step.entry.for_replay(source_topic);
            let replayed = session.replay(step.index, &origin, &event);
            // The replay's span, in the trace the entry carries (none when it carries none).
            #[cfg(feature = "opentelemetry")]
            let replayed = tracing::Instrument::instrument(
                replayed,
                crate::trace_context::replay_span(
                    &origin,
                    event.meta.event_id.as_deref(),
                    &event.headers,
                )
                .unwrap_or_else(tracing::Span::none),
            );
            replayed.await?;
            let mut remove = step.removals();
            remove.sort_unstable();
            session.remove(&remove).await?;
            report.replayed += 1;
            report.ids.push(step.entry.id.clone());
            report
                .copies_removed
                .extend(step.copies.into_iter().map(|(_, id)| id));
        } else {
            session.remove(&[step.index]).await?;
            report.copies_removed.push(step.entry.id.clone());
        }
        progress.advance(done + 1);
    }
    Ok(report)
}

/// Reads the entries, selects, and acts; returns the entries acted on (listed or purged).
async fn apply(
    session: &mut dyn DlqSession,
    filter: &DlqFilter,
    action: Action,
    progress: &dyn Progress,
) -> Result<Vec<DeadLetter>, Error> {
    let chosen = select(session, filter).await?;
    if action == Action::List || chosen.is_empty() {
        return Ok(chosen.into_iter().map(|(_, e)| e).collect());
    }
    let indices: Vec<usize> = chosen.iter().map(|(i, _)| *i).collect();
    session.check_removal(&indices).await?;
    progress.start(chosen.len());
    let mut done = 0;
    for chunk in indices.chunks(PURGE_CHUNK) {
        session.remove(chunk).await?;
        done += chunk.len();
        progress.advance(done);
    }
    Ok(chosen.into_iter().map(|(_, e)| e).collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::metadata::DeadReason;

    fn entry(id: &str, kind: FailureKind, at: u64) -> DeadLetter {
        let mut event = Event::new("p").with_key("k1");
        let meta = event.metadata_mut();
        meta.error_kind = Some(kind);
        meta.dead = Some(DeadInfo {
            reason: DeadReason::Exhausted,
            at: Timestamp::from_millis(at),
            consumer: "c".into(),
        });
        DeadLetter {
            id: id.into(),
            event,
            group: None,
            native: Native::default(),
        }
    }

    /// A DLQ session that records what the operation asked of it.
    #[derive(Default)]
    struct Scripted {
        entries: Vec<StoredDeadLetter>,
        read: usize,
        fail_replay_of: Option<usize>,
        refuse_removal: bool,
        log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl Scripted {
        fn with(n: usize) -> Self {
            let entries = (0..n)
                .map(|i| {
                    let mut e = Event::new(format!("p{i}")).with_id(format!("e{i}"));
                    e.metadata_mut().attempts = 3;
                    e.metadata_mut().error_kind = Some(if i % 2 == 0 {
                        FailureKind::Deferred
                    } else {
                        FailureKind::NonRetryable
                    });
                    StoredDeadLetter::new(format!("id{i}"), e.to_raw())
                })
                .collect();
            Self {
                entries,
                ..Self::default()
            }
        }
        fn log(&self, line: String) {
            self.log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(line);
        }
    }

    #[async_trait::async_trait]
    impl DlqSession for Scripted {
        async fn next(&mut self) -> Result<Option<StoredDeadLetter>, Error> {
            let e = self.entries.get(self.read).cloned();
            self.read += 1;
            Ok(e)
        }
        async fn check_removal(&mut self, entries: &[usize]) -> Result<(), Error> {
            self.log(format!("check {entries:?}"));
            if self.refuse_removal {
                return Err(Error::new(crate::error::Kind::Rejected, "too many marks"));
            }
            Ok(())
        }
        async fn replay(&mut self, entry: usize, origin: &str, event: &Event) -> Result<(), Error> {
            if self.fail_replay_of == Some(entry) {
                return Err(Error::new(crate::error::Kind::Connection, "broker down"));
            }
            let m = event.metadata();
            self.log(format!(
                "replay {entry} to {origin} attempts={} replays={}",
                m.attempts, m.replay_count
            ));
            Ok(())
        }
        async fn remove(&mut self, entries: &[usize]) -> Result<(), Error> {
            self.log(format!("remove {entries:?}"));
            Ok(())
        }
        async fn finish(self: Box<Self>) -> Result<(), Error> {
            self.log("finish".into());
            Ok(())
        }
    }

    async fn run(
        session: Scripted,
        filter: &DlqFilter,
        action: Action,
    ) -> (Result<Vec<DeadLetter>, Error>, Vec<String>) {
        let log = session.log.clone();
        let mut boxed: Box<dyn DlqSession> = Box::new(session);
        let result = apply(boxed.as_mut(), filter, action, &NoProgress).await;
        boxed.finish().await.unwrap();
        let lines = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (result, lines)
    }

    async fn run_replay(
        session: Scripted,
        filter: &DlqFilter,
    ) -> (Result<ReplayReport, Error>, Vec<String>) {
        let log = session.log.clone();
        let mut boxed: Box<dyn DlqSession> = Box::new(session);
        let result = replay(boxed.as_mut(), "orders", filter, &NoProgress).await;
        boxed.finish().await.unwrap();
        let lines = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (result, lines)
    }

    #[tokio::test]
    async fn replay_removes_each_entry_only_after_its_copy() {
        let filter = DlqFilter {
            error_kind: Some(FailureKind::Deferred),
            ..DlqFilter::all()
        };
        let (result, log) = run_replay(Scripted::with(4), &filter).await;
        assert_eq!(result.unwrap().replayed, 2);
        assert_eq!(
            log,
            [
                "check [0, 2]",
                "replay 0 to orders attempts=0 replays=1",
                "remove [0]",
                "replay 2 to orders attempts=0 replays=1",
                "remove [2]",
                "finish"
            ]
        );
    }

    #[tokio::test]
    async fn a_failed_replay_stops_and_keeps_its_entry() {
        let session = Scripted {
            fail_replay_of: Some(1),
            ..Scripted::with(3)
        };
        let (result, log) = run_replay(session, &DlqFilter::all()).await;
        assert_eq!(result.unwrap_err().kind(), crate::error::Kind::Connection);
        assert_eq!(
            log,
            [
                "check [0, 1, 2]",
                "replay 0 to orders attempts=0 replays=1",
                "remove [0]",
                "finish"
            ]
        );
    }

    /// A DLQ where event e1 was dead-lettered twice in one life (entries 1 and 3), and e0 also after a
    /// replay (entry 2: a new dead-lettering, not a copy).
    fn with_copies() -> Scripted {
        let dead = |id: &str, replays: u32| {
            let mut e = Event::new("p").with_id(id);
            e.metadata_mut().replay_count = replays;
            e.metadata_mut().error_kind = Some(FailureKind::NonRetryable);
            e.to_raw()
        };
        Scripted {
            entries: vec![
                StoredDeadLetter::new("id0", dead("e0", 0)),
                StoredDeadLetter::new("id1", dead("e1", 0)),
                StoredDeadLetter::new("id2", dead("e0", 1)),
                StoredDeadLetter::new("id3", dead("e1", 0)),
            ],
            ..Scripted::default()
        }
    }

    #[tokio::test]
    async fn a_replay_sends_one_dead_lettering_once_and_removes_its_copies() {
        let (result, log) = run_replay(with_copies(), &DlqFilter::all()).await;
        let report = result.unwrap();
        assert_eq!(report.ids, ["id0", "id1", "id2"]);
        assert_eq!(report.copies_removed, ["id3"]);
        assert_eq!(
            log,
            [
                "check [0, 1, 2, 3]",
                "replay 0 to orders attempts=0 replays=1",
                "remove [0]",
                "replay 1 to orders attempts=0 replays=1",
                "remove [1]",
                "replay 2 to orders attempts=0 replays=2",
                "remove [2]",
                "remove [3]",
                "finish"
            ]
        );
        // Selecting one copy by id replays it and removes the other, unselected one too.
        let (result, log) = run_replay(with_copies(), &DlqFilter::id("id3")).await;
        let report = result.unwrap();
        assert_eq!(
            (report.ids, report.copies_removed),
            (vec!["id3".to_string()], vec!["id1".to_string()])
        );
        assert_eq!(
            log,
            [
                "check [1, 3]",
                "replay 3 to orders attempts=0 replays=1",
                "remove [1, 3]",
                "finish"
            ]
        );
        let (result, _) = run(with_copies(), &DlqFilter::all(), Action::List).await;
        assert_eq!(copies(&result.unwrap()), 1);
    }

    #[tokio::test]
    async fn a_removal_that_cannot_be_recorded_does_nothing() {
        let session = Scripted {
            refuse_removal: true,
            ..Scripted::with(3)
        };
        let (result, log) = run(session, &DlqFilter::all(), Action::Purge).await;
        assert!(result.is_err());
        assert_eq!(log, ["check [0, 1, 2]", "finish"]);
    }

    #[tokio::test]
    async fn list_reads_up_to_the_limit_and_purge_removes_in_one_call() {
        let limited = DlqFilter {
            limit: Some(2),
            ..DlqFilter::all()
        };
        let (listed, log) = run(Scripted::with(5), &limited, Action::List).await;
        let ids: Vec<String> = listed.unwrap().into_iter().map(|e| e.id).collect();
        assert_eq!(ids, ["id0", "id1"]);
        assert_eq!(log, ["finish"], "a list changes nothing");
        let (purged, log) = run(Scripted::with(3), &DlqFilter::all(), Action::Purge).await;
        assert_eq!(purged.unwrap().len(), 3);
        assert_eq!(log, ["check [0, 1, 2]", "remove [0, 1, 2]", "finish"]);
    }

    #[test]
    fn filters_combine() {
        let e = entry("7", FailureKind::Deferred, 1_000);
        assert!(DlqFilter::all().matches(&e));
        assert!(DlqFilter::id("7").matches(&e));
        assert!(!DlqFilter::id("8").matches(&e));
        let by_kind = DlqFilter {
            error_kind: Some(FailureKind::NonRetryable),
            ..DlqFilter::all()
        };
        assert!(!by_kind.matches(&e));
        let by_key = DlqFilter {
            key: Some(Bytes::from_static(b"k1")),
            ..DlqFilter::all()
        };
        assert!(by_key.matches(&e));
        let window = DlqFilter {
            since: Some(Timestamp::from_millis(500)),
            until: Some(Timestamp::from_millis(1_000)),
            ..DlqFilter::all()
        };
        assert!(!window.matches(&e), "until is exclusive");
        let mut failed = entry("9", FailureKind::Deferred, 1_000);
        failed.event.metadata_mut().last_error = Some("Connection REFUSED by db-1".into());
        let by_text = |text: &str| DlqFilter {
            error_text: Some(text.into()),
            ..DlqFilter::all()
        };
        assert!(by_text("refused by").matches(&failed), "ignoring case");
        assert!(!by_text("timeout").matches(&failed));
        assert!(!by_text("refused").matches(&e), "no error at all");
        let mut other_db = entry("10", FailureKind::Deferred, 1_000);
        other_db.event.metadata_mut().last_error = Some("Connection REFUSED by db-2".into());
        let group = DlqFilter::all().fingerprint(failed.fingerprint().as_str());
        assert!(group.matches(&failed));
        assert!(group.matches(&other_db), "one cause, another number");
        assert!(!group.matches(&e));
    }

    #[tokio::test]
    async fn a_purge_by_group_removes_that_cause_alone() {
        // The scripted entries alternate two error kinds: two causes of two entries each.
        let (listed, _) = run(Scripted::with(4), &DlqFilter::all(), Action::List).await;
        let groups = failure_groups(&listed.unwrap());
        let counts: Vec<usize> = groups.iter().map(|g| g.count).collect();
        assert_eq!(counts, [2, 2]);
        let deferred = groups
            .iter()
            .find(|g| g.error_kind == Some(FailureKind::Deferred))
            .unwrap();
        let (purged, log) = run(
            Scripted::with(4),
            &DlqFilter::all().fingerprint(deferred.fingerprint.as_str()),
            Action::Purge,
        )
        .await;
        let ids: Vec<String> = purged.unwrap().into_iter().map(|e| e.id).collect();
        assert_eq!(ids, ["id0", "id2"]);
        assert_eq!(log, ["check [0, 2]", "remove [0, 2]", "finish"]);
        let (purged, log) = run(
            Scripted::with(4),
            &DlqFilter::all().fingerprint("000000000000"),
            Action::Purge,
        )
        .await;
        assert_eq!(purged.unwrap().len(), 0);
        assert_eq!(log, ["finish"], "another group's purge touches nothing");
    }
}
