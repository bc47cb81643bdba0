//! DLQ operations on a topic's DLQ queue.
//!
//! RabbitMQ has no way to read a queue without taking from it, so an operation takes the messages on a
//! channel of its own without acknowledging them, acknowledges the ones it removes (a replayed entry only
//! after its copy to the origin was confirmed), and closes the channel: the broker puts every other message
//! back where it was. While an operation runs, the entries it holds are invisible to another one.

use std::sync::Arc;

use async_trait::async_trait;
use lapin::Channel;
use lapin::message::BasicGetMessage;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::protocol::AMQPSoftError;
use lapin::types::FieldTable;
use retry_core::dlq::{DeadLetter, DeadLetterQueue, DlqFilter, ReplayReport};
use retry_core::event::Event;
use retry_core::metadata;
use retry_core::transport::TransportError;

use crate::codec;
use crate::link::{Link, connection_error, is_soft_error};

/// The DLQs of one transport.
pub(crate) struct RabbitDlq {
    pub(crate) link: Arc<Link>,
}

/// A DLQ message taken (unacknowledged) on the operation's channel.
struct Held {
    entry: DeadLetter,
    message: BasicGetMessage,
}

impl RabbitDlq {
    /// Takes the entries of `source_topic`'s DLQ that pass `filter` (up to its limit), on `channel`.
    async fn take(
        &self,
        channel: &Channel,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<Vec<Held>, TransportError> {
        let dlq = self.link.names.dlq(source_topic);
        let limit = filter.limit.unwrap_or(usize::MAX);
        let mut held = Vec::new();
        let exists = channel
            .queue_declare(
                dlq.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        match exists {
            Ok(_) => {}
            // No DLQ queue: nothing was dead-lettered (or it was deleted); there are no entries.
            Err(e) if is_soft_error(&e, AMQPSoftError::NOTFOUND) => return Ok(held),
            Err(e) => return Err(TransportError::Connection(format!("check DLQ {dlq}: {e}"))),
        }
        while held.len() < limit {
            let got = channel
                .basic_get(dlq.as_str().into(), BasicGetOptions { no_ack: false })
                .await
                .map_err(|e| TransportError::Config(format!("read DLQ {dlq}: {e}")))?;
            let Some(mut message) = got else { break };
            let raw = codec::raw_message(
                std::mem::take(&mut message.delivery.data),
                &message.delivery.properties,
            );
            let (meta, headers, _) = metadata::decode_lenient(&raw.headers);
            let id = message
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map_or_else(
                    || format!("tag-{}", message.delivery.delivery_tag),
                    |id| id.to_string(),
                );
            let entry = DeadLetter {
                id,
                event: Event {
                    payload: raw.payload,
                    key: raw.key,
                    headers,
                    meta,
                },
            };
            let remaining = message.message_count;
            if filter.matches(&entry) {
                held.push(Held { entry, message });
            }
            if remaining == 0 {
                break;
            }
        }
        Ok(held)
    }

    async fn with_channel<T>(
        &self,
        op: impl AsyncFnOnce(&Channel) -> Result<T, TransportError>,
    ) -> Result<T, TransportError> {
        let channel = self.link.channel().await?;
        let result = op(&channel).await;
        // Closing the channel gives back every message the operation did not acknowledge.
        let _ = channel.close(200, "done".into()).await;
        result
    }
}

async fn remove(held: &Held) -> Result<(), TransportError> {
    held.message
        .delivery
        .acker
        .ack(BasicAckOptions::default())
        .await
        .map(drop)
        .map_err(connection_error("remove a DLQ entry"))
}

#[async_trait]
impl DeadLetterQueue for RabbitDlq {
    async fn list(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<Vec<DeadLetter>, TransportError> {
        self.with_channel(async |ch| {
            Ok(self
                .take(ch, source_topic, filter)
                .await?
                .into_iter()
                .map(|h| h.entry)
                .collect())
        })
        .await
    }

    async fn replay(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<ReplayReport, TransportError> {
        self.with_channel(async |ch| {
            let mut report = ReplayReport::default();
            for held in self.take(ch, source_topic, filter).await? {
                let (event, origin) = held.entry.for_replay(source_topic);
                self.link.ensure_topic(&origin).await?;
                let id = event.id().unwrap_or(&held.entry.id).to_string();
                self.link
                    .publish(
                        "",
                        &origin,
                        &event.to_raw(),
                        &id,
                        &format!("replay to {origin}"),
                    )
                    .await?;
                remove(&held).await?;
                report.replayed += 1;
                report.ids.push(held.entry.id);
            }
            Ok(report)
        })
        .await
    }

    async fn purge(&self, source_topic: &str, filter: &DlqFilter) -> Result<usize, TransportError> {
        self.with_channel(async |ch| {
            let held = self.take(ch, source_topic, filter).await?;
            for h in &held {
                remove(h).await?;
            }
            Ok(held.len())
        })
        .await
    }
}
