//! The lanes of a subscription: the consumer of one of a group's queues (the work queue or the retry
//! queue), each on a channel of its own, with how it starts, stands by, pauses and drains. Separate from
//! the subscription, which only chooses which lane to hand out from.

use std::sync::Arc;

use event_retry_core::adapter::SubscriptionSpec;
use event_retry_core::error::Error;
use futures::StreamExt;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::protocol::AMQPSoftError;
use lapin::types::FieldTable;
use lapin::{Channel, Consumer};

use crate::error::{connection_error, is_soft_error};
use crate::link::Link;
use crate::settle::Acks;

/// Which of a group's queues a lane consumes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Role {
    Retries,
    Work,
}

/// Why a lane did not start consuming.
pub(super) enum StartFailed {
    /// An ordered consumer was refused the queue: another ordered consumer holds it.
    Refused,
    /// Anything else.
    Error(Error),
}

/// The consumer of one queue, on a channel of its own: delivery tags are numbered per channel and a
/// `multiple` ack settles every delivery up to its tag, so each queue's deliveries must be handed out in
/// their channel's order — which two consumers sharing a channel would not be (a retry taken before a
/// work delivery the broker had sent earlier would let a batched ack settle that delivery unhandled).
pub(super) struct Lane {
    pub(super) role: Role,
    pub(super) queue: String,
    pub(super) channel: Option<Arc<Channel>>,
    /// The acknowledgements of the current channel's deliveries, sent in batches.
    pub(super) acks: Arc<Acks>,
    pub(super) consumer: Option<Consumer>,
    /// A consumer cancelled by `pause`, still handing out what it had prefetched.
    pub(super) draining: Option<Consumer>,
    /// A `basic_consume` was sent and its answer not yet received (the call may have been cancelled).
    pub(super) consume_pending: bool,
}

impl Lane {
    pub(super) fn new(role: Role, queue: String) -> Self {
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
    pub(super) async fn start(
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
    pub(super) fn reset(&mut self) {
        self.consumer = None;
        self.channel = None;
    }

    /// Cancels the consumer; what it already holds is handed out after the resume, in order.
    pub(super) async fn pause(&mut self) -> Result<(), Error> {
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
    pub(super) async fn next_draining(&mut self) -> Option<AmqpDelivery> {
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
