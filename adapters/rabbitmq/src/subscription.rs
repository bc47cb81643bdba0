//! Consuming a group's work queue and retry queue: manual acks, prefetch bound to the runtime's
//! concurrency, and receipts that settle a delivery only after its retry or DLQ copy was confirmed.
//!
//! Each queue is consumed on a channel of its own (see [`Lane`]), and a delivery from the retry queue is
//! handed out before one from the work queue: the runtime asks for the next delivery only when a handler
//! slot is free, so a retry that fell due waits for one slot, never for the backlog in the work queue.
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
use futures::{FutureExt, StreamExt};
use lapin::Acker;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::protocol::AMQPSoftError;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Consumer};
use tracing::debug;

use crate::codec;
use crate::error::{connection_error, is_soft_error};
use crate::ladder::mover;
use crate::link::Link;
use crate::settle::Acks;

/// How long closing waits for the broker to confirm a consumer's cancel.
const CANCEL_WITHIN: Duration = Duration::from_secs(5);

/// How long closing waits for the last batch of acknowledgements to be sent.
const ACKS_SENT_WITHIN: Duration = Duration::from_secs(10);

/// How often a standby (ordered) consumer asks again for the queue.
const STANDBY_INTERVAL: Duration = Duration::from_millis(500);

/// One consumer of a group's work queue and retry queue.
pub(crate) struct RabbitSubscription {
    link: Arc<Link>,
    spec: SubscriptionSpec,
    /// The retry queue's consumer, read first.
    retries: Lane,
    /// The work queue's consumer.
    work: Lane,
    paused: bool,
    generation: u64,
    /// A consumer's end (an error, or the stream closed) that `next_ready` took: `next` reports it.
    ended: Option<(Role, Option<lapin::Error>)>,
}

/// Which of a group's queues a lane consumes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Retries,
    Work,
}

/// Why a lane did not start consuming.
enum StartFailed {
    /// An ordered consumer was refused the queue: another ordered consumer holds it.
    Refused,
    /// Anything else.
    Error(Error),
}

/// The consumer of one queue, on a channel of its own: delivery tags are numbered per channel and a
/// `multiple` ack settles every delivery up to its tag, so each queue's deliveries must be handed out in
/// their channel's order — which two consumers sharing a channel would not be (a retry taken before a
/// work delivery the broker had sent earlier would let a batched ack settle that delivery unhandled).
struct Lane {
    role: Role,
    queue: String,
    channel: Option<Arc<Channel>>,
    /// The acknowledgements of the current channel's deliveries, sent in batches.
    acks: Arc<Acks>,
    consumer: Option<Consumer>,
    /// A consumer cancelled by `pause`, still handing out what it had prefetched.
    draining: Option<Consumer>,
    /// A `basic_consume` was sent and its answer not yet received (the call may have been cancelled).
    consume_pending: bool,
}

impl Lane {
    fn new(role: Role, queue: String) -> Self {
        Self {
            role,
            queue,
            channel: None,
            acks: Acks::new(None),
            consumer: None,
            draining: None,
            consume_pending: false,
        }
    }

    /// Consumes the queue: on its current channel after a pause (it still carries deliveries in hand and
    /// their acks), else on a new one (after closing a half-started one).
    async fn start(
        &mut self,
        link: &Link,
        spec: &SubscriptionSpec,
        generation: u64,
    ) -> Result<(), StartFailed> {
        // A consume cut short by a cancelled call may have left a consumer nobody reads on the channel,
        // so then (and when the channel broke) it is replaced.
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
                let channel = Arc::new(link.channel().await.map_err(StartFailed::Error)?);
                self.channel = Some(channel.clone());
                self.acks = Acks::new(Some(channel.clone()));
                let prefetch = u16::try_from(spec.max_in_flight.max(1)).unwrap_or(u16::MAX);
                channel
                    .basic_qos(prefetch, BasicQosOptions::default())
                    .await
                    .map_err(|e| StartFailed::Error(connection_error("set the prefetch")(e)))?;
                channel
            }
        };
        let tag = format!(
            "{}-{:?}-{}-{generation}",
            spec.consumer,
            self.role,
            uuid::Uuid::new_v4().simple(),
        );
        self.consume_pending = true;
        let consumed = channel
            .basic_consume(
                self.queue.as_str().into(),
                tag.into(),
                BasicConsumeOptions {
                    exclusive: spec.ordered,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        self.consume_pending = false;
        match consumed {
            Ok(consumer) => {
                self.consumer = Some(consumer);
                Ok(())
            }
            Err(e) if spec.ordered && is_soft_error(&e, AMQPSoftError::ACCESSREFUSED) => {
                Err(StartFailed::Refused)
            }
            Err(e) => Err(StartFailed::Error(crate::error::amqp_error(
                e,
                format!("consume {}", self.queue),
            ))),
        }
    }

    /// Lets the channel go (a refused consume has closed it at the broker; a standby asks again on a
    /// new one).
    fn reset(&mut self) {
        self.consumer = None;
        self.channel = None;
    }

    /// Cancels the consumer; what it already holds is handed out after the resume, in order.
    async fn pause(&mut self) -> Result<(), Error> {
        if let (Some(consumer), Some(channel)) = (self.consumer.take(), self.channel.as_ref()) {
            let tag = consumer.tag();
            self.draining = Some(consumer);
            channel
                .basic_cancel(tag, BasicCancelOptions::default())
                .await
                .map_err(connection_error("pause (cancel the consumer)"))?;
        }
        Ok(())
    }

    /// The next delivery a cancelled consumer still holds, if any.
    async fn next_draining(&mut self) -> Option<AmqpDelivery> {
        let draining = self.draining.as_mut()?;
        match draining.next().await {
            Some(Ok(d)) => Some(d),
            _ => {
                self.draining = None;
                None
            }
        }
    }
}

impl RabbitSubscription {
    pub(crate) fn new(link: Arc<Link>, spec: SubscriptionSpec) -> Self {
        let names = &link.names;
        let retries = Lane::new(Role::Retries, names.retry_queue(&spec.topic, &spec.group));
        let work = Lane::new(Role::Work, names.group_queue(&spec.topic, &spec.group));
        Self {
            link,
            spec,
            retries,
            work,
            paused: false,
            generation: 0,
            ended: None,
        }
    }

    /// Consumes both queues: the work queue first, then the retry queue (ordered consumers all take
    /// them in this order, so the one holding the work queue is the one that gets the retry queue). An
    /// ordered consumer refused either queue (another ordered consumer holds it) lets go of both and
    /// stands by.
    async fn start(&mut self) -> Result<(), Error> {
        loop {
            self.link
                .ensure_group(&self.spec.topic, &self.spec.group)
                .await?;
            self.generation += 1;
            let mut refused = false;
            let Self {
                link,
                spec,
                work,
                retries,
                generation,
                ..
            } = self;
            for lane in [work, retries] {
                if lane.consumer.is_some() {
                    continue;
                }
                match lane.start(link, spec, *generation).await {
                    Ok(()) => {}
                    Err(StartFailed::Refused) => {
                        lane.reset();
                        refused = true;
                        break;
                    }
                    Err(StartFailed::Error(e)) => return Err(e),
                }
            }
            if !refused {
                return Ok(());
            }
            debug!(topic = %self.spec.topic, "another ordered consumer holds the queues; standing by");
            // Holding one queue of the two would take the group's events out of order: let both go.
            for lane in [&mut self.work, &mut self.retries] {
                if let Some(channel) = lane.channel.take() {
                    let _ = channel.close(200, "standby".into()).await;
                }
                lane.consumer = None;
            }
            tokio::time::sleep(STANDBY_INTERVAL).await;
        }
    }

    /// The error a consumer's end (`error`, or its stream closed) is reported as; the next call
    /// consumes again on a new channel.
    fn consumer_ended(&mut self, role: Role, error: Option<lapin::Error>) -> Error {
        self.reset();
        match error {
            Some(e) => crate::error::amqp_error(e, format!("consume {}", self.spec.topic)),
            None => Error::new(
                Kind::Connection,
                format!(
                    "the broker ended the consumer of {} (queue deleted or channel closed)",
                    self.lane(role).queue
                ),
            ),
        }
    }

    fn lane(&mut self, role: Role) -> &mut Lane {
        match role {
            Role::Retries => &mut self.retries,
            Role::Work => &mut self.work,
        }
    }

    fn deliver(&mut self, role: Role, d: AmqpDelivery) -> Delivery {
        let retry_queue = self.retries.queue.clone();
        let lane = self.lane(role);
        let (channel, acks) = (lane.channel.clone(), lane.acks.clone());
        let body = Bytes::from(d.data);
        let message = codec::raw_message(body.clone(), &d.properties);
        let message_id = d
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_else(|| format!("{}/{}", self.spec.topic, d.delivery_tag));
        acks.opened(d.delivery_tag);
        let info = DeliveryInfo::new(message_id.clone(), Origin::new(self.spec.topic.clone()));
        let receipt = Box::new(RabbitReceipt {
            link: self.link.clone(),
            _channel: channel,
            acker: Unsettled::new(d.acker),
            acks,
            tag: d.delivery_tag,
            topic: self.spec.topic.clone(),
            group: self.spec.group.clone(),
            retry_queue,
            body,
            native: d.properties,
            message_id,
        });
        Delivery::new(message, info, receipt)
    }

    fn reset(&mut self) {
        self.retries.reset();
        self.work.reset();
    }
}

#[async_trait]
impl Subscription for RabbitSubscription {
    async fn next(&mut self) -> Result<Option<Delivery>, Error> {
        if let Some((role, error)) = self.ended.take() {
            return Err(self.consumer_ended(role, error));
        }
        loop {
            // After a resume: what the cancelled consumers held, the retry queue's first.
            for role in [Role::Retries, Role::Work] {
                if let Some(d) = self.lane(role).next_draining().await {
                    return Ok(Some(self.deliver(role, d)));
                }
            }
            if self.paused {
                return std::future::pending().await;
            }
            if self.retries.consumer.is_none() || self.work.consumer.is_none() {
                self.start().await?;
            }
            let (Some(retries), Some(work)) =
                (self.retries.consumer.as_mut(), self.work.consumer.as_mut())
            else {
                continue;
            };
            // A due retry first: the runtime asks only when a handler slot is free, so it waits for one
            // slot, never behind the work queue's backlog.
            let (role, next) = tokio::select! {
                biased;
                d = retries.next() => (Role::Retries, d),
                d = work.next() => (Role::Work, d),
            };
            return match next {
                Some(Ok(d)) => Ok(Some(self.deliver(role, d))),
                Some(Err(e)) => Err(self.consumer_ended(role, Some(e))),
                None => Err(self.consumer_ended(role, None)),
            };
        }
    }

    /// A delivery the consumers already hold, the retry queue's first; none while a pause holds
    /// consumption or a cancelled consumer still hands out what it had prefetched (`next` takes those
    /// in order). A consumer's end found here is kept for `next` to report.
    fn next_ready(&mut self) -> Option<Delivery> {
        if self.paused
            || self.ended.is_some()
            || self.retries.draining.is_some()
            || self.work.draining.is_some()
        {
            return None;
        }
        for role in [Role::Retries, Role::Work] {
            let consumer = self.lane(role).consumer.as_mut()?;
            match consumer.next().now_or_never() {
                None => {}
                Some(Some(Ok(d))) => return Some(self.deliver(role, d)),
                Some(Some(Err(e))) => {
                    self.ended = Some((role, Some(e)));
                    return None;
                }
                Some(None) => {
                    self.ended = Some((role, None));
                    return None;
                }
            }
        }
        None
    }

    async fn pause(&mut self) -> Result<(), Error> {
        self.paused = true;
        // An ordered (exclusive) consumer keeps its consumers: cancelling them would hand the queues to
        // a standby consumer, and later events of the held key with them. Prefetch bounds what it is sent.
        if self.spec.ordered {
            return Ok(());
        }
        self.retries.pause().await?;
        self.work.pause().await
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
        let sent = async {
            self.retries.acks.sent().await;
            self.work.acks.sent().await;
        };
        if tokio::time::timeout(ACKS_SENT_WITHIN, sent).await.is_err() {
            tracing::warn!(topic = %self.spec.topic, "acknowledgements still unsent at close; the broker redelivers those messages");
        }
        Ok(())
    }
}

impl RabbitSubscription {
    /// Cancels the consumers and gives back (nack with requeue) what they were sent but never handed
    /// out, so a consumer that stops — cleanly or not — holds nothing on a channel that stays open.
    fn give_back(&mut self) -> Option<impl Future<Output = ()> + Send + 'static> {
        let mut consumers: Vec<(Arc<Channel>, Consumer)> = Vec::new();
        for lane in [&mut self.retries, &mut self.work] {
            let Some(channel) = lane.channel.clone() else {
                continue;
            };
            for consumer in lane.consumer.take().into_iter().chain(lane.draining.take()) {
                consumers.push((channel.clone(), consumer));
            }
        }
        if consumers.is_empty() {
            return None;
        }
        Some(async move {
            for (channel, mut consumer) in consumers {
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
        let due = mover::next_due(&self.link, &key, names.ladder.levels(), mover::now_ms());
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
