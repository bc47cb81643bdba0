//! Consuming a topic and its retry topic, and the receipts.
//!
//! The client's consumer needs `&mut` for every acknowledgement, so one task owns it: it reads a message
//! only when the runtime has room for it (so a paused runtime stops receiving), and applies the acks and
//! nacks the receipts send it. It closes the consumer once the subscription and every receipt are gone;
//! the broker then redelivers what was not acknowledged (a dropped, unsettled receipt included).
//!
//! A retry is a copy sent to the retry topic with `deliver_at` (the subscription is Shared or Key_Shared,
//! where delayed delivery works); the original is acknowledged once the broker confirmed the copy.

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
use event_retry_core::time::Timestamp;
use futures::StreamExt;
use pulsar::consumer::{InitialPosition, Message};
use pulsar::proto::MessageIdData;
use pulsar::{ConsumerOptions, SubType};
use tokio::sync::mpsc;
use tracing::warn;

use crate::codec;
use crate::consumer_requests::{self, PulsarConsumer, Received};
use crate::error::error;
use crate::link::Link;

/// How long the consumer task tries to close the client's consumer before it drops it. The client
/// answers a close only between messages, and with a backlog up to a batch of 1,000 it received can be
/// ahead of the close while its queue holds `max_in_flight` (see `consumer_requests`): then the close seldom gets
/// through, and dropping the consumer ends it as surely. The broker gives back what was not
/// acknowledged; acknowledgements still queued behind those messages are lost, and their events come
/// back once more.
const CLOSE_PATIENCE: Duration = Duration::from_secs(3);

/// What a receipt asks the consumer task to do.
enum Command {
    Ack(String, MessageIdData),
    Nack(String, MessageIdData),
    /// Close the consumer once the commands before this one were applied (or drop it, when the close
    /// does not get through), then answer.
    Close(tokio::sync::oneshot::Sender<()>),
}

/// Subscribes to `spec.topic` and its retry topic.
pub(crate) async fn subscribe(
    link: Arc<Link>,
    spec: SubscriptionSpec,
) -> Result<PulsarSubscription, Error> {
    let consumer = build_consumer(&link, &spec).await?;
    // Room for a batch of messages between the consumer task and the runtime, so the task reads ahead
    // while the runtime dispatches; a paused runtime takes none and the task stops reading.
    let (out, rx) = mpsc::channel(spec.max_in_flight.clamp(1, 1000));
    let (commands, command_rx) = mpsc::unbounded_channel();
    tokio::spawn(own_consumer(
        consumer,
        Resubscribe {
            link: link.clone(),
            spec: spec.clone(),
        },
        out,
        command_rx,
    ));
    let names = Arc::new(Names {
        source: Arc::from(spec.topic.as_str()),
        retry_topic: link.config.retry_topic(&spec.topic, &spec.group),
        group: spec.group.clone(),
    });
    Ok(PulsarSubscription {
        link,
        spec,
        names,
        rx,
        commands,
        ended: None,
    })
}

/// The client's consumer of `spec`'s topic and retry topic.
async fn build_consumer(link: &Link, spec: &SubscriptionSpec) -> Result<PulsarConsumer, Error> {
    let topics = [
        link.config.full_name(&spec.topic),
        link.config.retry_topic(&spec.topic, &spec.group),
    ];
    let queue = u32::try_from(spec.max_in_flight.clamp(1, 1000)).unwrap_or(1000);
    link.client
        .consumer()
        .with_topics(topics)
        .with_subscription(&spec.group)
        .with_subscription_type(if spec.ordered {
            SubType::KeyShared
        } else {
            SubType::Shared
        })
        .with_consumer_name(&spec.consumer)
        .with_options(
            ConsumerOptions::default()
                .with_receiver_queue_size(queue)
                .with_initial_position(InitialPosition::Earliest),
        )
        .build()
        .await
        .map_err(error(&format!("subscribe to {}", spec.topic)))
}

/// What the consumer task needs to subscribe again.
struct Resubscribe {
    link: Arc<Link>,
    spec: SubscriptionSpec,
}

/// How the consumer task's wait for a message ended.
enum Next {
    /// A message (or an error) went to the runtime.
    Delivered,
    /// The client gave its consumer up (it could not reconnect in time): subscribe again.
    ConsumerEnded,
    /// The consumer was closed.
    Closed,
    /// The commands ended without a close: the subscription and every receipt were dropped.
    Abandoned,
}

/// The task owning the consumer: it ends when the commands end (the subscription and every receipt
/// are gone). When the client gives its consumer up — it stops reconnecting after about 40 s without the
/// broker, and its stream then ends — the task subscribes again, with a backoff, until the broker is
/// back: a consumer outlives any outage instead of going quiet.
async fn own_consumer(
    mut consumer: PulsarConsumer,
    again: Resubscribe,
    out: mpsc::Sender<Received>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut reading = true;
    let end = loop {
        tokio::select! {
            biased;
            command = commands.recv() => match command {
                Some(command) => {
                    if !apply(&mut consumer, command).await {
                        break Next::Closed;
                    }
                }
                None => break Next::Abandoned,
            },
            permit = out.reserve(), if reading => match permit {
                Ok(permit) => match deliver_one(&mut consumer, &mut commands, permit).await {
                    Next::Delivered => {}
                    Next::ConsumerEnded => match subscribe_again(&again, &mut commands).await {
                        Some(fresh) => consumer = fresh,
                        None => break Next::Closed,
                    },
                    end => break end,
                },
                Err(_) => reading = false,
            },
        }
    };
    if matches!(end, Next::Abandoned) {
        // Closed all the same, behind the acknowledgements the client still queues: dropped, the
        // client would discard those queued behind a message it can no longer hand over.
        close_or_drop(&mut consumer).await;
    }
}

/// Subscribes again after the client gave its consumer up, backing off from 100 ms to 10 s; `None` when
/// the commands end meanwhile. Acknowledgements that arrive meanwhile cannot reach the broker (their
/// messages come back, as after any broken connection) and are dropped with a warning.
async fn subscribe_again(
    again: &Resubscribe,
    commands: &mut mpsc::UnboundedReceiver<Command>,
) -> Option<PulsarConsumer> {
    warn!(topic = %again.spec.topic, "the Pulsar client gave its consumer up; subscribing again");
    let mut backoff = Duration::from_millis(100);
    loop {
        match build_consumer(&again.link, &again.spec).await {
            Ok(consumer) => return Some(consumer),
            Err(e) => warn!(topic = %again.spec.topic, error = %e, "subscribing again failed"),
        }
        let wait = tokio::time::sleep(backoff);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                () = &mut wait => break,
                command = commands.recv() => match command {
                    Some(Command::Close(done)) => {
                        let _ = done.send(());
                        return None;
                    }
                    Some(_) => warn!("an acknowledgement while subscribing again: the broker redelivers the message"),
                    None => return None,
                },
            }
        }
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

/// Waits for one message for the runtime (which has room for it), applying commands meanwhile.
async fn deliver_one(
    consumer: &mut PulsarConsumer,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    permit: mpsc::Permit<'_, Received>,
) -> Next {
    loop {
        tokio::select! {
            biased;
            command = commands.recv() => match command {
                Some(command) => {
                    if !apply(consumer, command).await {
                        return Next::Closed;
                    }
                }
                None => return Next::Abandoned,
            },
            next = consumer.next() => {
                return match next {
                    Some(received) => {
                        permit.send(received);
                        Next::Delivered
                    }
                    None => Next::ConsumerEnded,
                };
            }
        }
    }
}

/// Closes the client's consumer within [`CLOSE_PATIENCE`]; when the close does not get through, the
/// task's end drops it.
async fn close_or_drop(consumer: &mut PulsarConsumer) {
    if let Err(e) = consumer_requests::close(consumer, "close the consumer", CLOSE_PATIENCE).await {
        warn!(error = %e, "closing the consumer did not get through: dropping it; the broker redelivers what was not acknowledged, acknowledgements the client still queued included");
    }
}

/// Applies a command; `false` once the consumer was closed.
async fn apply(consumer: &mut PulsarConsumer, command: Command) -> bool {
    let result = match command {
        Command::Ack(topic, id) => consumer.ack_with_id(&topic, id).await,
        Command::Nack(topic, id) => consumer.nack_with_id(&topic, id).await,
        Command::Close(done) => {
            // `close` goes through the client's queue behind the acknowledgements and waits for the
            // broker's answer, so every acknowledgement before it has reached the broker. The messages
            // the client queued meanwhile were never handed out: the broker gives them back.
            close_or_drop(consumer).await;
            let _ = done.send(());
            return false;
        }
    };
    if let Err(e) = result {
        warn!(error = %e, "an acknowledgement failed; the broker redelivers the message");
    }
    true
}

/// One consumer of a topic and its retry topic.
pub(crate) struct PulsarSubscription {
    link: Arc<Link>,
    spec: SubscriptionSpec,
    /// The names its receipts need, made once rather than per message.
    names: Arc<Names>,
    rx: mpsc::Receiver<Received>,
    commands: mpsc::UnboundedSender<Command>,
    /// A receive error `next_ready` took: `next` reports it.
    ended: Option<pulsar::Error>,
}

/// The names every receipt of one subscription uses.
struct Names {
    /// The source topic (the deliveries' origin shares it).
    source: Arc<str>,
    /// The group's retry topic.
    retry_topic: String,
    /// The consumer group, recorded on dead letters so a replay goes back to this group only.
    group: String,
}

fn id_text(id: &MessageIdData) -> String {
    format!(
        "{}:{}:{}:{}",
        id.ledger_id,
        id.entry_id,
        id.partition.unwrap_or(-1),
        id.batch_index.unwrap_or(-1)
    )
}

impl PulsarSubscription {
    /// The delivery of what the consumer's task received (`None`: the task ended).
    fn delivery(&self, received: Option<Received>) -> Result<Option<Delivery>, Error> {
        match received {
            Some(Ok(message)) => Ok(Some(self.deliver(message))),
            Some(Err(e)) => Err(Error::from_source(
                crate::error::passing(crate::error::kind_of(&e)),
                e,
            )
            .with_operation(format!("receive from {}", self.spec.topic))),
            None => Err(Error::closed()),
        }
    }

    /// A received message as a delivery, with the receipt that settles it.
    fn deliver(&self, message: Message<Vec<u8>>) -> Delivery {
        let id = message.message_id().clone();
        let native = codec::Envelope::of(&message.payload.metadata);
        let payload = Bytes::from(message.payload.data);
        let raw = codec::decode(payload.clone(), &message.payload.metadata);
        let info = DeliveryInfo::new(id_text(&id), Origin::new(self.names.source.clone()));
        let receipt = Box::new(PulsarReceipt {
            link: self.link.clone(),
            commands: self.commands.clone(),
            names: self.names.clone(),
            message_topic: message.topic,
            id: Unsettled::new(id),
            payload,
            native,
        });
        Delivery::new(raw, info, receipt)
    }
}

#[async_trait]
impl Subscription for PulsarSubscription {
    async fn next(&mut self) -> Result<Option<Delivery>, Error> {
        let received = match self.ended.take() {
            Some(error) => Some(Err(error)),
            None => self.rx.recv().await,
        };
        self.delivery(received)
    }

    /// A message the consumer's task has already received; an error found here is kept for `next`.
    fn next_ready(&mut self) -> Option<Delivery> {
        if self.ended.is_some() {
            return None;
        }
        match self.rx.try_recv() {
            Ok(Ok(message)) => Some(self.deliver(message)),
            Ok(Err(error)) => {
                self.ended = Some(error);
                None
            }
            // Empty, or the task ended: `next` waits, or says the subscription closed.
            Err(_) => None,
        }
    }

    async fn close(self: Box<Self>) -> Result<(), Error> {
        let (done, closed) = tokio::sync::oneshot::channel();
        if self.commands.send(Command::Close(done)).is_err() {
            return Ok(());
        }
        tokio::time::timeout(Duration::from_secs(30), closed)
            .await
            .map(drop)
            .map_err(|_| {
                Error::new(
                    Kind::Timeout,
                    format!("closing the consumer of {} timed out", self.spec.topic),
                )
            })
    }
}

/// Settles one message. Dropped unsettled, it is redelivered once the consumer closes.
struct PulsarReceipt {
    link: Arc<Link>,
    commands: mpsc::UnboundedSender<Command>,
    /// The subscription's source, retry topic and group.
    names: Arc<Names>,
    /// The topic the message came from (the source or the retry topic): its acknowledgement names it.
    message_topic: String,
    id: Unsettled<MessageIdData>,
    /// The original's payload and envelope: a release sends them back unchanged, and every other copy
    /// keeps the envelope the producer set.
    payload: Bytes,
    native: codec::Envelope,
}

impl PulsarReceipt {
    fn unsettled(&self) -> Result<(), Error> {
        self.id.get().map(drop)
    }

    fn finish(&mut self, ack: bool) -> Result<(), Error> {
        let id = self.id.take()?;
        // Settled once (`take` above failed otherwise): the name is not needed again.
        let topic = std::mem::take(&mut self.message_topic);
        let command = if ack {
            Command::Ack(topic, id)
        } else {
            Command::Nack(topic, id)
        };
        self.commands.send(command).map_err(|_| {
            Error::new(
                Kind::Closed,
                "the consumer is gone; the broker redelivers the message",
            )
        })
    }

    /// The `deliverAt` time for a delay: never before it, on a broker that may dispatch a tick early.
    fn deliver_at(&self, delay: Duration) -> i64 {
        let slack = if self.link.config.strict_deliver_at {
            Duration::ZERO
        } else {
            self.link.config.tick
        };
        // The clock and the delay are both counted in whole milliseconds, rounded down: two more keep
        // the copy from being due before `delay` has passed.
        let at = Timestamp::now().plus(delay + slack + Duration::from_millis(2));
        i64::try_from(at.as_millis()).unwrap_or(i64::MAX)
    }

    async fn send_retry_copy(
        &self,
        message: pulsar::producer::Message,
        operation: &str,
    ) -> Result<(), Error> {
        self.link
            .send(&self.names.retry_topic, message, operation)
            .await
            .map(drop)
    }
}

#[async_trait]
impl Receipt for PulsarReceipt {
    async fn ack(&mut self) -> Result<(), Error> {
        self.finish(true)
    }

    fn try_ack(&mut self) -> Option<Result<(), Error>> {
        Some(self.finish(true))
    }

    async fn retry(&mut self, event: &Event, delay: Duration) -> Result<(), Error> {
        self.unsettled()?;
        let operation = format!("retry through {}", self.names.retry_topic);
        let message = codec::encode(event, Some(&self.native), Some(self.deliver_at(delay)), &[])?;
        self.send_retry_copy(message, &operation).await?;
        self.finish(true)
    }

    async fn dead_letter(&mut self, event: &Event) -> Result<(), Error> {
        self.unsettled()?;
        let dlq = self.link.config.dlq_topic(&self.names.source);
        let message = codec::encode(
            event,
            Some(&self.native),
            None,
            &[(event_retry_core::metadata::names::GROUP, &self.names.group)],
        )?;
        self.link
            .send(&dlq, message, &format!("dead-letter to {dlq}"))
            .await?;
        self.finish(true)
    }

    async fn release(&mut self, after: Duration) -> Result<(), Error> {
        self.unsettled()?;
        if !after.is_zero() {
            let message =
                codec::unchanged(&self.payload, &self.native, Some(self.deliver_at(after)));
            if self.send_retry_copy(message, "release").await.is_ok() {
                return self.finish(true);
            }
        }
        self.finish(false)
    }
}

// Dropping an unsettled receipt (a crash) sends nothing: when the consumer closes, the broker redelivers
// every message it did not acknowledge. A negative acknowledgement as well would be a second redelivery
// path, and a message could come back twice.
