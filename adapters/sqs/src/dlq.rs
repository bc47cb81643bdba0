//! The SQS side of a DLQ operation on a queue's DLQ.
//!
//! SQS cannot read a queue without receiving from it, so a session receives the entries (hiding them for
//! the operation's length), deletes the ones it removes — a replayed entry only after its copy to the
//! source queue was sent, the order being `event_retry_core::dlq`'s — and when it finishes makes every other
//! one visible again at once (if the process dies, they come back when the hold ends). Batch calls are
//! checked entry by entry: their failures come back with HTTP 200. An entry's id is its SQS message id.
//!
//! With consumer groups through SNS each group's queue has a DLQ of its own: an operation on a topic
//! reads the DLQ of every group subscribed to it, one after the other, tags each entry with its group,
//! and replays an entry to its group's queue alone.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_sqs::types::Message;
use event_retry_core::adapter::{DlqSession, StoredDeadLetter};
use event_retry_core::error::{Error, Kind};
use event_retry_core::event::Event;

use crate::codec;
use crate::error::sdk_error;
use crate::link::{Link, asking_system_attributes};
use crate::settle::{BatchApi, Entry, MAX_BATCH, Op, SqsBatches};

/// How long an operation hides the entries it looks at.
const HOLD_SECONDS: i32 = 60;

/// Opens one operation on `source_topic`'s DLQ; `None` when the source or its DLQ does not exist.
pub(crate) async fn open(
    link: Arc<Link>,
    source_topic: &str,
) -> Result<Option<Box<dyn DlqSession>>, Error> {
    let queues = &link.queues;
    if queues.url_of(source_topic).await?.is_none() {
        return Ok(None);
    }
    let info = queues.resolve(source_topic).await?;
    let Some(dlq) = queues.url_of(&info.dlq_name).await? else {
        return Ok(None);
    };
    Ok(Some(Box::new(SqsDlqSession::new(link, dlq, None))))
}

/// Opens one operation on the DLQs of every consumer group of SNS topic `source_topic` (the groups
/// whose queues are subscribed to it); `None` when the topic does not exist.
pub(crate) async fn open_groups(
    link: Arc<Link>,
    source_topic: &str,
) -> Result<Option<Box<dyn DlqSession>>, Error> {
    if link.sns.is_none() {
        return open(link, source_topic).await;
    }
    let Some((_, subscribed)) = link.groups_of(source_topic).await? else {
        return Ok(None);
    };
    let mut groups = Vec::new();
    for (queue, group) in subscribed {
        if link.queues.url_of(&queue).await?.is_none() {
            continue;
        }
        let info = link.queues.resolve(&queue).await?;
        if let Some(dlq) = link.queues.url_of(&info.dlq_name).await? {
            groups.push(SqsDlqSession::new(link.clone(), dlq, Some(group)));
        }
    }
    Ok(Some(Box::new(GroupDlqs {
        groups,
        current: 0,
        entries: Vec::new(),
    })))
}

/// One operation: the entries received so far, and those removed.
struct SqsDlqSession {
    link: Arc<Link>,
    dlq: String,
    /// The consumer group whose DLQ this is (with SNS): its entries are replayed to its queue alone.
    group: Option<String>,
    deadline: Instant,
    /// Receipt handles of the entries handed out, by entry number.
    handles: Vec<String>,
    /// The attributes of the entries handed out, by entry number (a replay writes them again).
    attributes: Vec<codec::Attributes>,
    removed: HashSet<usize>,
    /// Received, not yet handed out.
    unread: VecDeque<Message>,
    /// Received twice (visible again on real SQS): given back, not handed out.
    others: Vec<String>,
    seen: HashSet<String>,
    confirming: bool,
    done: bool,
}

impl SqsDlqSession {
    fn new(link: Arc<Link>, dlq: String, group: Option<String>) -> Self {
        Self {
            link,
            dlq,
            group,
            // Entries are hidden for HOLD_SECONDS: the reading stops well before, and an entry seen twice
            // (visible again on real SQS) is given back rather than taken twice.
            deadline: Instant::now() + Duration::from_secs(HOLD_SECONDS as u64 * 3 / 4),
            handles: Vec::new(),
            attributes: Vec::new(),
            removed: HashSet::new(),
            unread: VecDeque::new(),
            others: Vec::new(),
            seen: HashSet::new(),
            confirming: false,
            done: false,
        }
    }

    /// Receives the next batch into `unread`; `false` when the DLQ is read to its end.
    async fn receive(&mut self) -> Result<bool, Error> {
        loop {
            if Instant::now() >= self.deadline {
                tracing::warn!(
                    dlq = self.dlq,
                    "the DLQ is too long to read within one hold; this operation covers the entries read so far"
                );
                return Ok(false);
            }
            let messages = asking_system_attributes(self.link.queues.client.receive_message())
                .queue_url(&self.dlq)
                .max_number_of_messages(10)
                .visibility_timeout(HOLD_SECONDS)
                .wait_time_seconds(i32::from(self.confirming))
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| sdk_error("read the DLQ", e))?
                .messages
                .unwrap_or_default();
            if messages.is_empty() {
                // An empty short poll may miss messages on real SQS; a 1 s long poll confirms the end.
                if self.confirming {
                    return Ok(false);
                }
                self.confirming = true;
                continue;
            }
            self.confirming = false;
            for m in messages {
                let id = m.message_id().unwrap_or_default().to_string();
                if self.seen.insert(id) {
                    self.unread.push_back(m);
                } else {
                    self.others
                        .push(m.receipt_handle().unwrap_or_default().to_string());
                }
            }
            if !self.unread.is_empty() {
                return Ok(true);
            }
        }
    }

    fn handle(&self, entry: usize) -> Result<&str, Error> {
        self.handles
            .get(entry)
            .map(String::as_str)
            .ok_or_else(|| Error::new(Kind::NotFound, format!("no DLQ entry #{entry}")))
    }

    /// The batch calls on the DLQ (the same ones receipts settle with).
    fn batches(&self) -> SqsBatches {
        SqsBatches {
            client: self.link.queues.client.clone(),
            url: self.dlq.clone(),
        }
    }

    /// Makes entries visible again (checked per entry; a failure leaves the entry hidden for the hold).
    async fn give_back(&self, handles: &[&str]) {
        let batches = self.batches();
        for chunk in handles.chunks(MAX_BATCH) {
            match batches
                .hide(&entries(chunk.iter().copied(), Op::Hide(0)))
                .await
            {
                Ok(failed) if !failed.is_empty() => {
                    tracing::warn!(
                        failed = failed.len(),
                        "some DLQ entries stay hidden until the hold ends"
                    );
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "DLQ entries stay hidden until the hold ends")
                }
            }
        }
    }
}

/// Batch entries for `handles`, numbered from 0 within the call.
fn entries<'a>(handles: impl Iterator<Item = &'a str>, op: Op) -> Vec<Entry> {
    handles
        .enumerate()
        .map(|(i, handle)| Entry {
            id: i.to_string(),
            handle: handle.to_string(),
            op,
        })
        .collect()
}

fn stored(m: &Message) -> (StoredDeadLetter, codec::Attributes) {
    let decoded = codec::decode(m);
    (
        StoredDeadLetter::new(m.message_id().unwrap_or_default(), decoded.raw)
            .with_native(decoded.attributes.native()),
        decoded.attributes,
    )
}

#[async_trait]
impl DlqSession for SqsDlqSession {
    async fn next(&mut self) -> Result<Option<StoredDeadLetter>, Error> {
        if self.unread.is_empty() && (self.done || !self.receive().await?) {
            self.done = true;
            return Ok(None);
        }
        let Some(m) = self.unread.pop_front() else {
            return Ok(None);
        };
        self.handles
            .push(m.receipt_handle().unwrap_or_default().to_string());
        let (entry, attributes) = stored(&m);
        self.attributes.push(attributes);
        Ok(Some(entry.with_group(self.group.clone())))
    }

    async fn replay(&mut self, entry: usize, origin: &str, event: &Event) -> Result<(), Error> {
        let native = self.attributes.get(entry).cloned();
        if let Some(group) = &self.group {
            return self
                .link
                .send_to_group(origin, group, event, native.as_ref())
                .await
                .map(drop);
        }
        self.link
            .send_event(
                origin,
                event,
                native.as_ref(),
                &format!("replay to {origin}"),
            )
            .await
            .map(drop)
    }

    /// Deletes the entries in batches of 10; an entry SQS did not delete is an error naming it.
    async fn remove(&mut self, entries_to_remove: &[usize]) -> Result<(), Error> {
        let batches = self.batches();
        let mut failed = Vec::new();
        let mut deleted = 0;
        for chunk in entries_to_remove.chunks(MAX_BATCH) {
            let handles = chunk
                .iter()
                .map(|&entry| self.handle(entry))
                .collect::<Result<Vec<&str>, Error>>()?;
            let refused = batches
                .delete(&entries(handles.into_iter(), Op::Delete))
                .await
                .map_err(|e| e.with_operation(format!("remove entries of {}", self.dlq)))?;
            for (i, &entry) in chunk.iter().enumerate() {
                match refused.iter().find(|(id, _)| *id == i.to_string()) {
                    Some((_, why)) => failed.push(format!("#{entry} ({why})")),
                    None => {
                        self.removed.insert(entry);
                        deleted += 1;
                    }
                }
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(Error::new(
                Kind::Rejected,
                format!(
                    "{deleted} removed, {} failed: {}",
                    failed.len(),
                    failed.join(", ")
                ),
            )
            .with_operation(format!("remove entries of {}", self.dlq)))
        }
    }

    async fn finish(self: Box<Self>) -> Result<(), Error> {
        let mut back: Vec<&str> = self
            .handles
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.removed.contains(i))
            .map(|(_, h)| h.as_str())
            .collect();
        back.extend(self.others.iter().map(String::as_str));
        back.extend(self.unread.iter().filter_map(|m| m.receipt_handle()));
        self.give_back(&back).await;
        Ok(())
    }
}

/// One operation over the DLQs of a topic's consumer groups (with SNS): each group's DLQ read to its end
/// in turn; entries are numbered across all of them.
struct GroupDlqs {
    groups: Vec<SqsDlqSession>,
    /// The group whose DLQ is being read.
    current: usize,
    /// Entry number → (group, the entry's number in that group's session).
    entries: Vec<(usize, usize)>,
}

impl GroupDlqs {
    fn locate(&self, entry: usize) -> Result<(usize, usize), Error> {
        self.entries
            .get(entry)
            .copied()
            .ok_or_else(|| Error::new(Kind::NotFound, format!("no DLQ entry #{entry}")))
    }
}

#[async_trait]
impl DlqSession for GroupDlqs {
    async fn next(&mut self) -> Result<Option<StoredDeadLetter>, Error> {
        while let Some(session) = self.groups.get_mut(self.current) {
            if let Some(entry) = session.next().await? {
                self.entries
                    .push((self.current, session.handles.len().saturating_sub(1)));
                return Ok(Some(entry));
            }
            self.current += 1;
        }
        Ok(None)
    }

    async fn replay(&mut self, entry: usize, origin: &str, event: &Event) -> Result<(), Error> {
        let (group, local) = self.locate(entry)?;
        self.groups[group].replay(local, origin, event).await
    }

    async fn remove(&mut self, entries: &[usize]) -> Result<(), Error> {
        let mut per_group: Vec<Vec<usize>> = vec![Vec::new(); self.groups.len()];
        for &entry in entries {
            let (group, local) = self.locate(entry)?;
            per_group[group].push(local);
        }
        let mut failed = Vec::new();
        for (session, locals) in self.groups.iter_mut().zip(per_group) {
            if locals.is_empty() {
                continue;
            }
            if let Err(e) = session.remove(&locals).await {
                failed.push(e.to_string());
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(Error::new(Kind::Rejected, failed.join("; ")))
        }
    }

    async fn finish(self: Box<Self>) -> Result<(), Error> {
        for session in self.groups {
            Box::new(session).finish().await?;
        }
        Ok(())
    }
}
