//! Consuming a group's work queue and retry queue: manual acks, prefetch bound to the runtime's
//! concurrency, and receipts that settle a delivery only after its retry or DLQ copy was confirmed.
//!
//! Both queues are consumed on one channel, and a delivery from the retry queue is handed out before one
//! from the work queue: the runtime asks for the next delivery only when a handler slot is free, so a
//! retry that fell due waits for one slot, never for the backlog in the work queue.
//!
//! A blocking pause cancels the consumer (the broker stops sending) and hands out what was already
//! prefetched after the resume, in order, then consumes again on the same channel (deliveries in hand
//! are acknowledged on it). An ordered consumer keeps its consumer through a pause (cancelling it would
//! hand the queue to a standby); prefetch bounds what it is sent meanwhile. An ordered subscription consumes exclusively, so one consumer
//! at a time sees a queue and per-key order holds; a second one stands by until the queue is free. A
//! broken channel or connection ends the current consumer: `next` reports it once, and the following call
//! consumes again on a new channel (the broker has already requeued what was unacknowledged).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use event_retry_core::adapter::{
    Delivery, DeliveryInfo, Receipt, Subscription, SubscriptionSpec, Unsettled,
};
use event_retry_core::error::{Error, Kind};
use event_retry_core::event::Event;
use event_retry_core::metadata::Origin;
use futures::StreamExt;
use lapin::Acker;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::protocol::AMQPSoftError;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Consumer};
use tracing::debug;

use crate::acks::Acks;
use crate::codec;
use crate::error::{connection_error, is_soft_error};
use crate::link::Link;

/// How long closing waits for the broker to confirm a consumer's cancel.
const CANCEL_WITHIN: Duration = Duration::from_secs(5);

/// How long closing waits for the last batch of acknowledgements to be sent.
const ACKS_SENT_WITHIN: Duration = Duration::from_secs(10);

/// How often a standby (ordered) consumer asks again for the queue.
const STANDBY_INTERVAL: Duration = Duration::from_millis(500);

/// One consumer of a work queue.
pub(crate) struct RabbitSubscription {
    link: Arc<Link>,
    spec: SubscriptionSpec,
    channel: Option<Arc<Channel>>,
    /// The acknowledgements of the current channel's deliveries, sent in batches.
    acks: Arc<Acks>,
    /// The consumers of the retry queue and the work queue, both on `channel` (both or neither).
    consumers: Option<Consumers>,
    /// Consumers cancelled by `pause`, still handing out what they had prefetched.
    draining: Option<Consumers>,
    paused: bool,
    /// A `basic_consume` was sent and its answer not yet received (the call may have been cancelled).
    consume_pending: bool,
    generation: u64,
}

impl RabbitSubscription {
    pub(crate) fn new(link: Arc<Link>, spec: SubscriptionSpec) -> Self {
        Self {
            link,
            spec,
            channel: None,
            acks: Acks::new(None),
            consumers: None,
            draining: None,
            paused: false,
            consume_pending: false,
            generation: 0,
        }
    }

    /// Consumes the work queue and the retry queue, on a new channel (after closing a half-started one)
    /// or on the current one after a pause.
    async fn start(&mut self) -> Result<(), Error> {
        loop {
            // After a pause the channel still carries deliveries in hand (and their acks): consume on it
            // again. A consume cut short by a cancelled call may have left a consumer nobody reads on
            // it, so then (and when the channel broke) it is replaced.
            let reusable = self
                .channel
                .as_ref()
                .filter(|ch| !self.consume_pending && ch.status().connected())
                .cloned();
            let channel = match reusable {
                Some(channel) => channel,
                None => {
                    if let Some(old) = self.channel.take()
                        && self.consume_pending
                    {
                        let _ = old.close(200, "restart".into()).await;
                    }
                    self.consume_pending = false;
                    self.link
                        .ensure_group(&self.spec.topic, &self.spec.group)
                        .await?;
                    let channel = Arc::new(self.link.channel().await?);
                    self.channel = Some(channel.clone());
                    self.acks = Acks::new(Some(channel.clone()));
                    let prefetch =
                        u16::try_from(self.spec.max_in_flight.max(1)).unwrap_or(u16::MAX);
                    channel
                        .basic_qos(prefetch, BasicQosOptions::default())
                        .await
                        .map_err(connection_error("set the prefetch"))?;
                    channel
                }
            };
            self.generation += 1;
            self.consume_pending = true;
            // The work queue first, then the retry queue: ordered consumers all take them in this order,
            // so the one holding the work queue is the one that gets the retry queue.
            let consumed = match self.consume(&channel, &self.queue(), "work").await {
                Ok(work) => self
                    .consume(&channel, &self.retry_queue(), "retries")
                    .await
                    .map(|retries| Consumers { retries, work }),
                Err(e) => Err(e),
            };
            self.consume_pending = false;
            match consumed {
                Ok(consumers) => {
                    self.consumers = Some(consumers);
                    return Ok(());
                }
                // A refused consume closes its channel at the broker, and with it a consumer already
                // started there on the other queue (the broker gives back what it was sent).
                Err(e) if self.spec.ordered && is_soft_error(&e, AMQPSoftError::ACCESSREFUSED) => {
                    debug!(topic = %self.spec.topic, "another ordered consumer holds the queues; standing by");
                    self.channel = None;
                    tokio::time::sleep(STANDBY_INTERVAL).await;
                }
                Err(e) => {
                    return Err(crate::error::amqp_error(
                        e,
                        format!("consume {}", self.spec.topic),
                    ));
                }
            }
        }
    }

    /// Starts a consumer of `queue` on `channel` (exclusive for an ordered subscription).
    async fn consume(
        &self,
        channel: &Channel,
        queue: &str,
        role: &str,
    ) -> Result<Consumer, lapin::Error> {
        let tag = format!(
            "{}-{role}-{}-{}",
            self.spec.consumer,
            uuid::Uuid::new_v4().simple(),
            self.generation
        );
        channel
            .basic_consume(
                queue.into(),
                tag.into(),
                BasicConsumeOptions {
                    exclusive: self.spec.ordered,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
    }

    fn deliver(&self, d: AmqpDelivery) -> Delivery {
        let channel = self.channel.clone();
        let body = Bytes::from(d.data);
        let message = codec::raw_message(body.clone(), &d.properties);
        let message_id = d
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_else(|| format!("{}/{}", self.spec.topic, d.delivery_tag));
        self.acks.opened(d.delivery_tag);
        let info = DeliveryInfo::new(message_id.clone(), Origin::new(self.spec.topic.clone()));
        let receipt = Box::new(RabbitReceipt {
            link: self.link.clone(),
            _channel: channel,
            acker: Unsettled::new(d.acker),
            acks: self.acks.clone(),
            tag: d.delivery_tag,
            topic: self.spec.topic.clone(),
            group: self.spec.group.clone(),
            retry_queue: self.retry_queue(),
            body,
            native: d.properties,
            message_id,
        });
        Delivery::new(message, info, receipt)
    }

    /// The work queue of this subscription's group.
    fn queue(&self) -> String {
        self.link
            .names
            .group_queue(&self.spec.topic, &self.spec.group)
    }

    /// The retry queue of this subscription's group.
    fn retry_queue(&self) -> String {
        self.link
            .names
            .retry_queue(&self.spec.topic, &self.spec.group)
    }

    fn reset(&mut self) {
        self.consumers = None;
        self.channel = None;
    }
}

#[async_trait]
impl Subscription for RabbitSubscription {
    async fn next(&mut self) -> Result<Option<Delivery>, Error> {
        loop {
            if let Some(draining) = self.draining.as_mut() {
                match draining.next_prefetched().await {
                    Some(d) => return Ok(Some(self.deliver(d))),
                    None => self.draining = None,
                }
                continue;
            }
            if self.paused {
                return std::future::pending().await;
            }
            if self.consumers.is_none() {
                self.start().await?;
            }
            let Some(consumers) = self.consumers.as_mut() else {
                continue;
            };
            match consumers.next().await {
                Some(Ok(d)) => return Ok(Some(self.deliver(d))),
                Some(Err(e)) => {
                    self.reset();
                    return Err(crate::error::amqp_error(
                        e,
                        format!("consume {}", self.spec.topic),
                    ));
                }
                None => {
                    self.reset();
                    return Err(Error::new(
                        Kind::Connection,
                        format!(
                            "the broker ended a consumer of {} (queue deleted or channel closed)",
                            self.spec.topic
                        ),
                    ));
                }
            }
        }
    }

    async fn pause(&mut self) -> Result<(), Error> {
        self.paused = true;
        // An ordered (exclusive) consumer keeps its consumers: cancelling them would hand the queues to
        // a standby consumer, and later events of the held key with them. Prefetch bounds what it is sent.
        if self.spec.ordered {
            return Ok(());
        }
        if let (Some(consumers), Some(channel)) = (self.consumers.take(), self.channel.clone()) {
            let tags = [consumers.retries.tag(), consumers.work.tag()];
            // What the cancelled consumers already hold is handed out after the resume, in order.
            self.draining = Some(consumers);
            for tag in tags {
                channel
                    .basic_cancel(tag, BasicCancelOptions::default())
                    .await
                    .map_err(connection_error("pause (cancel the consumer)"))?;
            }
        }
        Ok(())
    }

    async fn resume(&mut self) -> Result<(), Error> {
        self.paused = false;
        Ok(())
    }

    async fn close(mut self: Box<Self>) -> Result<(), Error> {
        if let Some(work) = self.give_back() {
            work.await;
        }
        // The runtime has settled every delivery it handled; their acks may still be in a batch.
        if tokio::time::timeout(ACKS_SENT_WITHIN, self.acks.sent())
            .await
            .is_err()
        {
            tracing::warn!(topic = %self.spec.topic, "acknowledgements still unsent at close; the broker redelivers those messages");
        }
        Ok(())
    }
}

impl RabbitSubscription {
    /// Cancels the consumer and gives back (nack with requeue) what it was sent but never handed out, so
    /// a consumer that stops — cleanly or not — holds nothing on a channel that stays open.
    fn give_back(&mut self) -> Option<impl Future<Output = ()> + Send + 'static> {
        let channel = self.channel.clone()?;
        let consumers: Vec<Consumer> = self
            .consumers
            .take()
            .into_iter()
            .chain(self.draining.take())
            .flat_map(|c| [c.retries, c.work])
            .collect();
        if consumers.is_empty() {
            return None;
        }
        Some(async move {
            for mut consumer in consumers {
                // Bounded: a quorum queue whose leader just died may never answer the cancel, and a
                // shutdown must not wait for it (closing the channel gives the deliveries back too).
                let cancel = channel.basic_cancel(consumer.tag(), BasicCancelOptions::default());
                if tokio::time::timeout(CANCEL_WITHIN, cancel).await.is_err() {
                    tracing::warn!(queue = %consumer.queue(), "the broker did not answer a consumer's cancel within {CANCEL_WITHIN:?}; closing without it");
                    continue;
                }
                // After the cancel the stream yields what the broker had already sent, then ends.
                while let Ok(Some(Ok(d))) =
                    tokio::time::timeout(Duration::from_secs(1), consumer.next()).await
                {
                    let _ = d
                        .acker
                        .nack(BasicNackOptions {
                            requeue: true,
                            multiple: false,
                        })
                        .await;
                }
            }
        })
    }
}

impl Drop for RabbitSubscription {
    /// A subscription dropped without `close` (an aborted consumer) still gives back what it was sent.
    fn drop(&mut self) {
        if let Some(work) = self.give_back()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            handle.spawn(work);
        }
    }
}

/// The consumers of a group's two queues on one channel.
struct Consumers {
    retries: Consumer,
    work: Consumer,
}

impl Consumers {
    /// The next delivery, the retry queue's first when both have one; `None` when either consumer ended
    /// (its channel closed or its queue was deleted).
    async fn next(&mut self) -> Option<Result<AmqpDelivery, lapin::Error>> {
        tokio::select! {
            biased;
            d = self.retries.next() => d,
            d = self.work.next() => d,
        }
    }

    /// After a cancel: what either consumer had been sent and not yet handed out, the retry queue's
    /// first; `None` once both have handed out everything.
    async fn next_prefetched(&mut self) -> Option<AmqpDelivery> {
        if let Some(Ok(d)) = self.retries.next().await {
            return Some(d);
        }
        match self.work.next().await {
            Some(Ok(d)) => Some(d),
            _ => None,
        }
    }
}

/// Settles one delivery. Dropping it unsettled gives the message back to the queue (nack with requeue).
struct RabbitReceipt {
    link: Arc<Link>,
    /// Keeps the channel open until the delivery is settled (acks go on the channel it came from).
    _channel: Option<Arc<Channel>>,
    acker: Unsettled<Acker>,
    /// Where its ack goes, to be sent with the channel's next batch.
    acks: Arc<Acks>,
    /// Its delivery tag on the channel.
    tag: u64,
    topic: String,
    /// The consumer group, recorded on dead letters so a replay goes back to this group only.
    group: String,
    /// The group's retry queue, where its retries come back.
    retry_queue: String,
    /// The original's body and properties: a release sends them back unchanged, and every other copy
    /// keeps the properties and typed headers the producer set.
    body: Bytes,
    native: BasicProperties,
    message_id: String,
}

impl RabbitReceipt {
    /// Marks the delivery acknowledged; its `basic.ack` goes out with the channel's next batch (see
    /// [`Acks`]). A channel already gone is reported here; one lost before the batch is sent makes the
    /// broker redeliver the message (at least once), as a lost single ack would.
    async fn ack(&mut self) -> Result<(), Error> {
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
        let key = self.link.names.routing_key(units as u64, &self.retry_queue);
        self.link
            .publish(&self.link.names.entry(), &key, body, props, operation)
            .await
    }
}

#[async_trait]
impl Receipt for RabbitReceipt {
    async fn ack(&mut self) -> Result<(), Error> {
        RabbitReceipt::ack(self).await
    }

    async fn retry(&mut self, event: &Event, delay: Duration) -> Result<(), Error> {
        self.acker.get()?;
        let id = event.id().unwrap_or(&self.message_id).to_string();
        let operation = format!("retry of {id} through the delay ladder");
        let props = codec::properties(event, Some(&self.native), &id, &self.link.user, &[]);
        self.delay_copy(&event.payload, props, delay, &operation)
            .await?;
        RabbitReceipt::ack(self).await
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
        RabbitReceipt::ack(self).await
    }

    async fn release(&mut self, after: Duration) -> Result<(), Error> {
        self.acker.get()?;
        if after.is_zero() {
            return self.requeue().await;
        }
        let props = codec::unchanged(&self.native, &self.link.user);
        let body = self.body.clone();
        match self.delay_copy(&body, props, after, "release").await {
            Ok(()) => RabbitReceipt::ack(self).await,
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
