//! RabbitMQ read with lapin itself: a queue's depth, and its messages taken on a channel without
//! acknowledging, then the channel closed so the broker keeps every message. The DLQ is made unwritable by moving its entries
//! into the harness's count and deleting the queue; the SDK's copies then come back unroutable until the
//! harness declares the queue again. A classic queue is deleted only when empty (`if-empty`, checked by
//! the broker, so no entry that arrives meanwhile is lost); quorum queues do not offer `if-empty`, so
//! there the queue is deleted right after a take that emptied it, and an entry that arrived in between
//! would be lost by the harness, not the SDK.

use async_trait::async_trait;
use lapin::message::BasicGetMessage;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};

use super::{BoxError, RawBroker, RawEntry, payloads};

/// RabbitMQ's own client on the broker at `url`.
pub struct RawRabbit {
    url: String,
}

/// A header value's bytes: strings and byte arrays as they are, anything else in its debug text.
fn value_bytes(value: &AMQPValue) -> Vec<u8> {
    match value {
        AMQPValue::LongString(s) => s.as_bytes().to_vec(),
        AMQPValue::ShortString(s) => s.as_str().as_bytes().to_vec(),
        AMQPValue::ByteArray(b) => b.as_slice().to_vec(),
        other => format!("{other:?}").into_bytes(),
    }
}

/// A message as RabbitMQ holds it: the body and the header table (RabbitMQ has no key).
fn entry(message: &BasicGetMessage) -> RawEntry {
    let headers = message
        .delivery
        .properties
        .headers()
        .as_ref()
        .map(|t| {
            t.inner()
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), value_bytes(v)))
                .collect()
        })
        .unwrap_or_default();
    RawEntry {
        payload: message.delivery.data.clone(),
        key: None,
        headers,
    }
}

impl RawRabbit {
    /// A client of the broker at the `amqp://` URL `url`.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
        }
    }

    async fn channel(&self) -> Result<(Connection, Channel), BoxError> {
        let connection = Connection::connect(&self.url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        Ok((connection, channel))
    }

    /// How many messages `queue` holds that no consumer has taken.
    pub async fn depth(&self, queue: &str) -> Result<u32, BoxError> {
        Ok(u32::try_from(self.total_depth(&[queue]).await?)?)
    }

    /// How many messages `queues` hold together that no consumer has taken, read on one connection.
    pub async fn total_depth(&self, queues: &[&str]) -> Result<u64, BoxError> {
        let (connection, channel) = self.channel().await?;
        let mut total = Ok(0u64);
        for queue in queues {
            let declared = channel
                .queue_declare(
                    (*queue).into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await;
            match declared {
                Ok(q) => total = total.map(|t| t + u64::from(q.message_count())),
                Err(e) => {
                    total = Err(e.into());
                    break;
                }
            }
        }
        let _ = connection.close(200, "read".into()).await;
        total
    }

    /// Deletes `queue` with whatever it holds (a fault test's way to make a DLQ unwritable).
    pub async fn delete_queue(&self, queue: &str) -> Result<(), BoxError> {
        let (connection, channel) = self.channel().await?;
        let deleted = channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await;
        let _ = connection.close(200, "deleted".into()).await;
        deleted.map(drop).map_err(Into::into)
    }

    /// Takes every message of `queue`; with `remove`, acknowledges each (it leaves the queue).
    async fn take_all(
        channel: &Channel,
        queue: &str,
        remove: bool,
    ) -> Result<Vec<RawEntry>, BoxError> {
        let mut payloads = Vec::new();
        while let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await?
        {
            payloads.push(entry(&message));
            if remove {
                message.delivery.ack(BasicAckOptions::default()).await?;
            }
            if message.message_count == 0 {
                break;
            }
        }
        Ok(payloads)
    }
}

#[async_trait]
impl RawBroker for RawRabbit {
    async fn messages(&self, queue: &str) -> Result<Vec<RawEntry>, BoxError> {
        let (connection, channel) = self.channel().await?;
        let payloads = Self::take_all(&channel, queue, false).await;
        // Closing the connection gives back every message taken without an acknowledgement.
        let _ = connection.close(200, "read".into()).await;
        payloads
    }

    /// The messages ready in the group's queue `queue` (deliveries a consumer holds unacknowledged are
    /// not counted: AMQP's passive declare does not tell them).
    async fn waiting(&self, queue: &str, _group: &str) -> Result<u64, BoxError> {
        Ok(u64::from(self.depth(queue).await?))
    }

    async fn refuse_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError> {
        let mut moved = Vec::new();
        for _ in 0..5 {
            let (connection, channel) = self.channel().await?;
            moved.extend(Self::take_all(&channel, dlq, true).await?);
            let deleted = channel
                .queue_delete(
                    dlq.into(),
                    QueueDeleteOptions {
                        if_empty: true,
                        ..QueueDeleteOptions::default()
                    },
                )
                .await;
            let _ = connection.close(200, "done".into()).await;
            // Not empty (an entry arrived after the last take: take again), or a queue type without
            // `if-empty`.
            if deleted.is_ok() {
                return Ok(payloads(moved));
            }
        }
        // A quorum queue: take what is there and delete it at once.
        let (connection, channel) = self.channel().await?;
        moved.extend(Self::take_all(&channel, dlq, true).await?);
        channel
            .queue_delete(dlq.into(), QueueDeleteOptions::default())
            .await?;
        let _ = connection.close(200, "done".into()).await;
        Ok(payloads(moved))
    }

    async fn accept_dlq_writes(&self, _dlq: &str) -> Result<Vec<String>, BoxError> {
        // The harness declares the queue again.
        Ok(Vec::new())
    }
}
