//! DLQ operations on a queue's DLQ.
//!
//! SQS cannot read a queue without receiving from it, so an operation receives the entries (hiding them
//! for the operation's length), deletes the ones it removes — a replayed entry only after its copy to the
//! source queue was sent — and makes every other one visible again at once. Batch calls are checked entry
//! by entry (their failures come back with HTTP 200). An entry's id is its SQS message id.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message,
};
use retry_core::dlq::{DeadLetter, DeadLetterQueue, DlqFilter, ReplayReport};
use retry_core::event::Event;
use retry_core::metadata;
use retry_core::transport::TransportError;

use crate::codec;
use crate::queues::sdk_error;
use crate::shared::{COPY, SendOptions, Shared, group_of};

/// How long an operation hides the entries it looks at.
const HOLD_SECONDS: i32 = 60;

/// The DLQs of one transport.
pub(crate) struct SqsDlq {
    pub(crate) shared: Arc<Shared>,
}

struct Held {
    entry: DeadLetter,
    handle: String,
}

impl SqsDlq {
    /// The DLQ URL of `source_topic`, if the source and its DLQ exist.
    async fn dlq_url(&self, source_topic: &str) -> Result<Option<String>, TransportError> {
        let queues = &self.shared.queues;
        if queues.url_of(source_topic).await?.is_none() {
            return Ok(None);
        }
        let info = queues.resolve(source_topic).await?;
        queues.url_of(&info.dlq_name).await
    }

    /// Receives every entry of the DLQ; returns those passing `filter` (up to its limit) and gives back the rest.
    async fn take(&self, dlq: &str, filter: &DlqFilter) -> Result<Vec<Held>, TransportError> {
        let client = &self.shared.queues.client;
        let limit = filter.limit.unwrap_or(usize::MAX);
        let mut held = Vec::new();
        let mut others = Vec::new();
        let mut confirming = false;
        // Entries are hidden for HOLD_SECONDS: the reading stops well before, and an entry seen twice
        // (visible again on real SQS) is given back rather than taken twice.
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_secs(HOLD_SECONDS as u64 * 3 / 4);
        let mut seen = std::collections::HashSet::new();
        loop {
            if std::time::Instant::now() >= deadline {
                tracing::warn!(
                    dlq,
                    "the DLQ is too long to read within one hold; this operation covers the entries read so far"
                );
                break;
            }
            let got = client
                .receive_message()
                .queue_url(dlq)
                .max_number_of_messages(10)
                .visibility_timeout(HOLD_SECONDS)
                .wait_time_seconds(i32::from(confirming))
                .message_attribute_names("All")
                .send()
                .await;
            let messages = match got {
                Ok(out) => out.messages.unwrap_or_default(),
                Err(e) => {
                    self.give_back(dlq, &others).await;
                    self.give_back(
                        dlq,
                        &held
                            .iter()
                            .map(|h: &Held| h.handle.clone())
                            .collect::<Vec<_>>(),
                    )
                    .await;
                    return Err(sdk_error("read the DLQ", e));
                }
            };
            if messages.is_empty() {
                // An empty short poll may miss messages on real SQS; a 1 s long poll confirms the end.
                if confirming {
                    break;
                }
                confirming = true;
                continue;
            }
            confirming = false;
            for m in messages {
                let handle = m.receipt_handle().unwrap_or_default().to_string();
                if !seen.insert(m.message_id().unwrap_or_default().to_string()) {
                    others.push(handle);
                    continue;
                }
                let entry = entry_of(&m);
                if held.len() < limit && filter.matches(&entry) {
                    held.push(Held { entry, handle });
                } else {
                    others.push(handle);
                }
            }
        }
        self.give_back(dlq, &others).await;
        Ok(held)
    }

    /// Makes entries visible again (checked per entry; a failure leaves the entry hidden for the hold).
    async fn give_back(&self, dlq: &str, handles: &[String]) {
        for chunk in handles.chunks(10) {
            let entries: Vec<_> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, h)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(h)
                        .visibility_timeout(0)
                        .build()
                        .ok()
                })
                .collect();
            match self
                .shared
                .queues
                .client
                .change_message_visibility_batch()
                .queue_url(dlq)
                .set_entries(Some(entries))
                .send()
                .await
            {
                Ok(out) if !out.failed().is_empty() => {
                    tracing::warn!(
                        failed = out.failed().len(),
                        "some DLQ entries stay hidden until the hold ends"
                    );
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %sdk_error("give back DLQ entries", e), "DLQ entries stay hidden until the hold ends")
                }
            }
        }
    }

    async fn remove(&self, dlq: &str, held: &Held) -> Result<(), TransportError> {
        self.shared
            .queues
            .client
            .delete_message()
            .queue_url(dlq)
            .receipt_handle(&held.handle)
            .send()
            .await
            .map(drop)
            .map_err(|e| sdk_error("remove a DLQ entry", e))
    }
}

fn entry_of(m: &Message) -> DeadLetter {
    let mut raw = codec::decode(m);
    raw.headers.retain(|name, _| name != COPY);
    let (meta, headers, _) = metadata::decode_lenient(&raw.headers);
    DeadLetter {
        id: m.message_id().unwrap_or_default().to_string(),
        event: Event {
            payload: raw.payload,
            key: raw.key,
            headers,
            meta,
        },
    }
}

#[async_trait]
impl DeadLetterQueue for SqsDlq {
    async fn list(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<Vec<DeadLetter>, TransportError> {
        let Some(dlq) = self.dlq_url(source_topic).await? else {
            return Ok(Vec::new());
        };
        let held = self.take(&dlq, filter).await?;
        let handles: Vec<String> = held.iter().map(|h| h.handle.clone()).collect();
        self.give_back(&dlq, &handles).await;
        Ok(held.into_iter().map(|h| h.entry).collect())
    }

    async fn replay(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<ReplayReport, TransportError> {
        let Some(dlq) = self.dlq_url(source_topic).await? else {
            return Ok(ReplayReport::default());
        };
        let held = self.take(&dlq, filter).await?;
        let mut report = ReplayReport::default();
        let mut result = Ok(());
        let mut rest = Vec::new();
        for h in held {
            if result.is_err() {
                rest.push(h.handle);
                continue;
            }
            let (event, origin) = h.entry.for_replay(source_topic);
            let sent = async {
                let queue = self.shared.queues.resolve(&origin).await?;
                let out = codec::encode(&event)?;
                let group = group_of(event.key.as_deref());
                self.shared
                    .send(
                        &queue,
                        &queue.url,
                        out,
                        SendOptions {
                            group,
                            ..SendOptions::default()
                        },
                        &format!("replay to {origin}"),
                    )
                    .await?;
                self.remove(&dlq, &h).await
            }
            .await;
            match sent {
                Ok(()) => {
                    report.replayed += 1;
                    report.ids.push(h.entry.id);
                }
                Err(e) => {
                    rest.push(h.handle);
                    result = Err(e);
                }
            }
        }
        self.give_back(&dlq, &rest).await;
        result.map(|()| report)
    }

    async fn purge(&self, source_topic: &str, filter: &DlqFilter) -> Result<usize, TransportError> {
        let Some(dlq) = self.dlq_url(source_topic).await? else {
            return Ok(0);
        };
        let held = self.take(&dlq, filter).await?;
        let mut removed = 0;
        let mut failed = Vec::new();
        for chunk in held.chunks(10) {
            let entries: Vec<_> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, h)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(&h.handle)
                        .build()
                        .ok()
                })
                .collect();
            let out = self
                .shared
                .queues
                .client
                .delete_message_batch()
                .queue_url(&dlq)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| sdk_error("purge DLQ entries", e))?;
            // Per-entry failures arrive with HTTP 200.
            for f in out.failed() {
                if let Some(h) = f.id().parse::<usize>().ok().and_then(|i| chunk.get(i)) {
                    failed.push(format!(
                        "{} ({})",
                        h.entry.id,
                        f.message().unwrap_or(f.code())
                    ));
                }
            }
            removed += out.successful().len();
        }
        if failed.is_empty() {
            Ok(removed)
        } else {
            Err(TransportError::Rejected {
                operation: format!("purge of the DLQ of {source_topic}"),
                reason: format!(
                    "{removed} removed, {} failed: {}",
                    failed.len(),
                    failed.join(", ")
                ),
            })
        }
    }
}
