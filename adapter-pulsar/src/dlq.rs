//! DLQ operations on `<topic>-DLQ`, through one subscription kept for them (`event-retry-dlq`).
//!
//! Pulsar removes a message from a subscription when it is acknowledged there, so that subscription *is*
//! the DLQ's content: an operation reads every entry it holds (until nothing more arrives for a moment),
//! acknowledges what it removes — a replayed entry only after its copy to the origin was confirmed — and
//! negatively acknowledges the rest, which the broker redelivers for the next operation. The transport
//! keeps one consumer per DLQ for this and lets one operation use it at a time: closing and reopening
//! consumers would race with the entries a closing one still holds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use pulsar::consumer::Message;
use pulsar::{Consumer, TokioExecutor};
use retry_core::dlq::{DeadLetter, DeadLetterQueue, DlqFilter, ReplayReport};
use retry_core::event::Event;
use retry_core::metadata;
use retry_core::transport::TransportError;
use tokio::sync::Mutex;

use crate::codec;
use crate::link::{Link, error};

/// How long an operation waits for the first entry, and then for each next one, before it has them all.
const FIRST_WAIT: Duration = Duration::from_millis(1_500);
const NEXT_WAIT: Duration = Duration::from_millis(300);

type DlqConsumer = Arc<Mutex<Consumer<Vec<u8>, TokioExecutor>>>;

/// The DLQs of one transport.
pub(crate) struct PulsarDlq {
    pub(crate) link: Arc<Link>,
    pub(crate) consumers: Arc<Mutex<HashMap<String, DlqConsumer>>>,
}

/// What an operation does with the entries it selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    List,
    Replay,
    Purge,
}

struct Held {
    entry: DeadLetter,
    message: Message<Vec<u8>>,
}

/// The consumer group that dead-lettered `message`, if it says.
fn group_of(message: &Message<Vec<u8>>) -> Option<String> {
    message
        .payload
        .metadata
        .properties
        .iter()
        .find(|kv| kv.key == codec::GROUP)
        .map(|kv| kv.value.clone())
}

fn entry_of(message: &Message<Vec<u8>>) -> DeadLetter {
    let mut raw = codec::decode(message.payload.data.clone(), &message.payload.metadata);
    raw.headers.retain(|name, _| name != codec::GROUP);
    let (meta, headers, _) = metadata::decode_lenient(&raw.headers);
    let id = message.message_id();
    DeadLetter {
        id: format!(
            "{}:{}:{}",
            id.ledger_id,
            id.entry_id,
            id.batch_index.unwrap_or(-1)
        ),
        event: Event {
            payload: raw.payload,
            key: raw.key,
            headers,
            meta,
        },
    }
}

impl PulsarDlq {
    /// Drops the consumer of `topic`'s DLQ (after the DLQ topic was deleted or recreated).
    pub(crate) async fn forget(&self, topic: &str) {
        self.consumers.lock().await.remove(topic);
    }

    async fn consumer(&self, topic: &str) -> Result<DlqConsumer, TransportError> {
        let mut consumers = self.consumers.lock().await;
        if let Some(c) = consumers.get(topic) {
            return Ok(c.clone());
        }
        let consumer = Arc::new(Mutex::new(self.link.dlq_consumer(topic).await?));
        consumers.insert(topic.to_string(), consumer.clone());
        Ok(consumer)
    }

    /// Sends a DLQ entry back to its origin (payload, key and headers unedited, attempts restarted).
    async fn replay_one(&self, source_topic: &str, held: &Held) -> Result<(), TransportError> {
        let (event, origin) = held.entry.for_replay(source_topic);
        // Back to the group that dead-lettered it (its retry topic, due at once), so other groups of
        // the topic do not handle it again; an entry without a group goes to the topic.
        let message = codec::encode(&event.to_raw(), None)?;
        let target = match group_of(&held.message) {
            Some(group) => self.link.config.retry_topic(&origin, &group),
            None => self.link.config.full_name(&origin),
        };
        self.link
            .send(&target, message, &format!("replay to {target}"))
            .await
    }

    /// Applies `action` to the entries of `topic`'s DLQ that pass `filter` (up to its limit); returns
    /// them. Removed entries are acknowledged, the others given back.
    async fn each(
        &self,
        topic: &str,
        filter: &DlqFilter,
        action: Action,
    ) -> Result<Vec<DeadLetter>, TransportError> {
        let consumer = self.consumer(topic).await?;
        let mut consumer = consumer.lock().await;
        let mut held = Vec::new();
        let mut wait = FIRST_WAIT;
        while let Ok(next) = tokio::time::timeout(wait, consumer.next()).await {
            let Some(message) = next else { break };
            let message = message.map_err(error(&format!("read the DLQ of {topic}")))?;
            held.push(Held {
                entry: entry_of(&message),
                message,
            });
            wait = NEXT_WAIT;
        }
        let limit = filter.limit.unwrap_or(usize::MAX);
        let mut selected = Vec::new();
        let mut failure = None;
        let mut removed = 0;
        for h in held {
            let chosen = failure.is_none() && selected.len() < limit && filter.matches(&h.entry);
            let remove = match (chosen, action) {
                (false, _) | (true, Action::List) => false,
                (true, Action::Purge) => true,
                (true, Action::Replay) => match self.replay_one(topic, &h).await {
                    Ok(()) => true,
                    Err(e) => {
                        failure = Some(e);
                        false
                    }
                },
            };
            let settled = if remove {
                consumer.ack(&h.message).await
            } else {
                consumer.nack(&h.message).await
            };
            settled.map_err(|e| TransportError::Connection(format!("settle a DLQ entry: {e}")))?;
            removed += usize::from(remove);
            if chosen && failure.is_none() {
                selected.push(h.entry);
            }
        }
        // The client queues acknowledgements without a receipt; a request on the same consumer after
        // them returns once the broker has read them, so a short-lived caller (retryctl) does not exit
        // before its removals reached the broker.
        if removed > 0
            && let Err(e) = consumer.get_last_message_id().await
        {
            tracing::warn!(error = %e, topic, "could not confirm that the DLQ removals reached the broker");
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(selected),
        }
    }
}

#[async_trait]
impl DeadLetterQueue for PulsarDlq {
    async fn list(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<Vec<DeadLetter>, TransportError> {
        self.each(source_topic, filter, Action::List).await
    }

    async fn replay(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<ReplayReport, TransportError> {
        let replayed = self.each(source_topic, filter, Action::Replay).await?;
        Ok(ReplayReport {
            replayed: replayed.len(),
            ids: replayed.into_iter().map(|e| e.id).collect(),
        })
    }

    async fn purge(&self, source_topic: &str, filter: &DlqFilter) -> Result<usize, TransportError> {
        Ok(self.each(source_topic, filter, Action::Purge).await?.len())
    }
}
