//! RabbitMQ read with lapin itself: the DLQ queue taken on a channel without acknowledging, then the
//! channel closed so the broker keeps every message. The DLQ is made unwritable by moving its entries
//! into the harness's count and deleting the queue; the SDK's copies then come back unroutable until the
//! harness declares the queue again. A classic queue is deleted only when empty (`if-empty`, checked by
//! the broker, so no entry that arrives meanwhile is lost); quorum queues do not offer `if-empty`, so
//! there the queue is deleted right after a take that emptied it, and an entry that arrived in between
//! would be lost by the harness, not the SDK.

use async_trait::async_trait;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeleteOptions};
use lapin::{Channel, Connection, ConnectionProperties};

use super::{BoxError, RawBroker};

/// RabbitMQ's own client on the broker at `url`.
pub(crate) struct RawRabbit {
    url: String,
}

impl RawRabbit {
    /// A client of the broker at the `amqp://` URL `url`.
    pub(crate) fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
        }
    }

    async fn channel(&self) -> Result<(Connection, Channel), BoxError> {
        let connection = Connection::connect(&self.url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        Ok((connection, channel))
    }

    /// Takes every message of `queue`; with `remove`, acknowledges each (it leaves the queue).
    async fn take_all(
        channel: &Channel,
        queue: &str,
        remove: bool,
    ) -> Result<Vec<String>, BoxError> {
        let mut payloads = Vec::new();
        while let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await?
        {
            payloads.push(String::from_utf8_lossy(&message.delivery.data).into_owned());
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
    async fn dlq_payloads(&self, dlq: &str) -> Result<Vec<String>, BoxError> {
        let (connection, channel) = self.channel().await?;
        let payloads = Self::take_all(&channel, dlq, false).await;
        // Closing the connection gives back every message taken without an acknowledgement.
        let _ = connection.close(200, "read".into()).await;
        payloads
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
                return Ok(moved);
            }
        }
        // A quorum queue: take what is there and delete it at once.
        let (connection, channel) = self.channel().await?;
        moved.extend(Self::take_all(&channel, dlq, true).await?);
        channel
            .queue_delete(dlq.into(), QueueDeleteOptions::default())
            .await?;
        let _ = connection.close(200, "done".into()).await;
        Ok(moved)
    }

    async fn accept_dlq_writes(&self, _dlq: &str) -> Result<Vec<String>, BoxError> {
        // The harness declares the queue again.
        Ok(Vec::new())
    }
}
