//! The receipt of one delivery: its ack batched with its channel's others, a retry or a delayed release
//! sent into the delay ladder, a dead letter sent to the DLQ, each confirmed before the delivery is
//! acknowledged. Separate from the subscription: a receipt outlives the call that handed it out and
//! needs none of the lanes' state.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use event_retry_core::adapter::{Receipt, Unsettled};
use event_retry_core::error::{Error, Kind};
use event_retry_core::event::Event;
use lapin::options::BasicNackOptions;
use lapin::{Acker, BasicProperties, Channel};
use tracing::debug;

use crate::codec;
use crate::error::connection_error;
use crate::ladder::mover;
use crate::link::Link;
use crate::settle::Acks;

/// Settles one delivery. Dropping it unsettled gives the message back to the queue (nack with requeue).
pub(super) struct RabbitReceipt {
    pub(super) link: Arc<Link>,
    /// Keeps the channel open until the delivery is settled (acks go on the channel it came from).
    pub(super) _channel: Option<Arc<Channel>>,
    pub(super) acker: Unsettled<Acker>,
    /// Where its ack goes, to be sent with the channel's next batch.
    pub(super) acks: Arc<Acks>,
    /// Its delivery tag on the channel.
    pub(super) tag: u64,
    pub(super) topic: String,
    /// The consumer group, recorded on dead letters so a replay goes back to this group only.
    pub(super) group: String,
    /// The group's retry queue, where its retries come back.
    pub(super) retry_queue: String,
    /// The original's body and properties: a release sends them back unchanged, and every other copy
    /// keeps the properties and typed headers the producer set.
    pub(super) body: Bytes,
    pub(super) native: BasicProperties,
    pub(super) message_id: String,
}

impl RabbitReceipt {
    /// Marks the delivery acknowledged; its `basic.ack` goes out with the channel's next batch (see
    /// [`Acks`]). A channel already gone is reported here; one lost before the batch is sent makes the
    /// broker redeliver the message (at least once), as a lost single ack would.
    fn ack(&mut self) -> Result<(), Error> {
        if !self.acker.get()?.usable() {
            return Err(Error::new(
                Kind::Connection,
                "the channel is gone; the broker redelivers the message",
            )
            .with_operation("ack"));
        }
        let acker = self.acker.take()?;
        self.acks.ack(self.tag, acker);
        Ok(())
    }

    async fn requeue(&mut self) -> Result<(), Error> {
        let acker = self.acker.take()?;
        let sent = acker
            .nack(BasicNackOptions {
                requeue: true,
                multiple: false,
            })
            .await;
        // Sent (or the channel is gone): a batched ack may pass this delivery now.
        self.acks.closed(self.tag);
        sent.map(drop).map_err(connection_error("requeue"))
    }

    /// Sends `body` with `props` into the delay ladder, to come back to the group's retry queue after
    /// `delay` (rounded up).
    async fn delay_copy(
        &self,
        body: &[u8],
        props: BasicProperties,
        delay: Duration,
        operation: &str,
    ) -> Result<(), Error> {
        // Rounded up to whole granularity steps, counting the delay's fraction of a millisecond too.
        let g = self.link.config.granularity.as_nanos().max(1);
        let units = delay.as_nanos().div_ceil(g);
        let max = (1u128 << self.link.config.levels) - 1;
        if units > max {
            return Err(Error::new(
                Kind::Unsupported,
                format!(
                    "a delay of {delay:?} exceeds the ladder's maximum of {:?}",
                    self.link.config.max_delay()
                ),
            )
            .with_operation(operation.to_string()));
        }
        let names = &self.link.names;
        let key = names.ladder.routing_key(units as u64, &self.retry_queue);
        // The time the copy leaves the first level it waits in; the ladder's movers take it from there.
        let due = names
            .ladder
            .next_due(&key, names.ladder.levels(), mover::now_ms());
        let props = mover::with_hop_due(props, due);
        self.link
            .publish(&names.ladder.entry(), &key, body, props, operation)
            .await
    }
}

#[async_trait]
impl Receipt for RabbitReceipt {
    async fn ack(&mut self) -> Result<(), Error> {
        RabbitReceipt::ack(self)
    }

    fn try_ack(&mut self) -> Option<Result<(), Error>> {
        Some(RabbitReceipt::ack(self))
    }

    async fn retry(&mut self, event: &Event, delay: Duration) -> Result<(), Error> {
        self.acker.get()?;
        let id = event.id().unwrap_or(&self.message_id).to_string();
        let operation = format!("retry of {id} through the delay ladder");
        let props = codec::properties(event, Some(&self.native), &id, &self.link.user, &[]);
        self.delay_copy(&event.payload, props, delay, &operation)
            .await?;
        RabbitReceipt::ack(self)
    }

    async fn dead_letter(&mut self, event: &Event) -> Result<(), Error> {
        self.acker.get()?;
        // The delivery's channel died with its connection (a broker restart): the broker gives the
        // message to a consumer again, and nothing sent for it here could be acknowledged. A closed
        // receipt ends the runtime's wait for the DLQ instead of holding consumption on it for ever.
        if self
            ._channel
            .as_ref()
            .is_some_and(|c| !c.status().connected())
        {
            return Err(Error::new(
                Kind::Closed,
                "the delivery's channel closed with its connection; the broker delivers it again",
            ));
        }
        self.link
            .dead_letter(&self.topic, Some(&self.group), event, Some(&self.native))
            .await?;
        RabbitReceipt::ack(self)
    }

    async fn release(&mut self, after: Duration) -> Result<(), Error> {
        self.acker.get()?;
        if after.is_zero() {
            return self.requeue().await;
        }
        let props = codec::unchanged(&self.native, &self.link.user);
        let body = self.body.clone();
        match self.delay_copy(&body, props, after, "release").await {
            Ok(()) => RabbitReceipt::ack(self),
            Err(e) => {
                debug!(error = %e, "a delayed release failed; requeueing at once");
                self.requeue().await
            }
        }
    }
}

impl Drop for RabbitReceipt {
    fn drop(&mut self) {
        let Some(acker) = self.acker.take_unsettled() else {
            return;
        };
        let channel = self._channel.take();
        let (acks, tag) = (self.acks.clone(), self.tag);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        multiple: false,
                    })
                    .await;
                acks.closed(tag);
                drop(channel);
            });
        }
    }
}
