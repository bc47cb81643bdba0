//! The consumer side the runtime sees: consuming a group's work queue and retry queue (each a lane, the
//! `lanes` module; receipts are the `receipt` module): manual acks, prefetch bound to the runtime's
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

mod lanes;
mod receipt;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use event_retry_core::adapter::{
    Delivery, DeliveryInfo, Subscription, SubscriptionSpec, Unsettled,
};
use event_retry_core::error::{Error, Kind};
use event_retry_core::metadata::Origin;
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicCancelOptions, BasicNackOptions};
use lapin::{Channel, Consumer};
use tracing::debug;

use self::lanes::{Lane, Role, StartFailed};
use self::receipt::RabbitReceipt;
use crate::codec;
use crate::link::Link;

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
