//! A stream of deliveries, and the receipt that settles each one exactly once.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Error;
use crate::event::{Event, RawMessage};
use crate::metadata::Origin;

/// Facts about one delivery, from the broker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryInfo {
    /// The broker's own id for the message, where it has one (SQS, Pulsar); `None` where the place the
    /// message sits names it (Kafka's partition and offset): [`DeliveryInfo::message_id`] then makes the
    /// id from the origin, and only if it is needed — for an event without an id of its own.
    pub message_id: Option<String>,
    /// Where it was consumed (topic, and partition/offset where the broker has them).
    pub origin: Origin,
    /// Failed attempts as the broker counts them, for brokers where a retry is the same message coming
    /// back rather than a copy carrying new metadata (SQS: `ApproximateReceiveCount - 1`); the runtime
    /// takes the larger of this and the metadata's count. Such a broker also counts a release or a crash
    /// as a receive, so there they count as attempts (the runtime handles a delivery it has taken even
    /// when shutdown comes, so only what the adapter prefetched and gives back at close is counted so).
    pub broker_attempts: Option<u32>,
    /// Retries scheduled through the broker, as the broker counts them, for the same brokers (SQS:
    /// `ApproximateReceiveCount - 1`); the runtime takes the larger of this and the metadata's count, so
    /// the policy advances even though the message's metadata could not be rewritten.
    pub broker_retries: Option<u32>,
}

impl DeliveryInfo {
    /// A delivery of the message `message_id`, consumed at `origin`.
    pub fn new(message_id: impl Into<String>, origin: Origin) -> Self {
        Self {
            message_id: Some(message_id.into()),
            origin,
            broker_attempts: None,
            broker_retries: None,
        }
    }

    /// A delivery of the message at `origin`, which names it (`<topic>/<partition>/<offset>`, the
    /// partition left out where there is none): nothing is allocated for the id unless it is needed.
    ///
    /// ```
    /// use event_retry_core::adapter::DeliveryInfo;
    /// use event_retry_core::metadata::Origin;
    ///
    /// assert_eq!(DeliveryInfo::at(Origin::new("orders").at(2, 17)).message_id(), "orders/2/17");
    /// assert_eq!(DeliveryInfo::new("m-1", Origin::new("orders")).message_id(), "m-1");
    /// ```
    pub fn at(origin: Origin) -> Self {
        Self {
            message_id: None,
            origin,
            broker_attempts: None,
            broker_retries: None,
        }
    }

    /// The message's id: the broker's own, or the one its place makes (see [`DeliveryInfo::at`]).
    pub fn message_id(&self) -> String {
        if let Some(id) = &self.message_id {
            return id.clone();
        }
        let origin = &self.origin;
        let mut id = origin.topic.to_string();
        for part in [origin.partition.map(i64::from), origin.offset]
            .into_iter()
            .flatten()
        {
            id.push('/');
            id.push_str(itoa::Buffer::new().format(part));
        }
        id
    }

    /// Sets the broker's own count of failed attempts and retries (see the fields).
    pub fn with_broker_counts(mut self, attempts: u32, retries: u32) -> Self {
        self.broker_attempts = Some(attempts);
        self.broker_retries = Some(retries);
        self
    }
}

/// One message handed to the runtime, with the means to settle it (built with [`Delivery::new`]).
#[non_exhaustive]
pub struct Delivery {
    /// The message as it travelled (the runtime decodes the metadata).
    pub message: RawMessage,
    /// Facts from the broker.
    pub info: DeliveryInfo,
    /// Settles the delivery.
    pub receipt: Box<dyn Receipt>,
}

impl Delivery {
    /// `message`, with the broker's facts about it and the receipt that settles it.
    pub fn new(message: RawMessage, info: DeliveryInfo, receipt: Box<dyn Receipt>) -> Self {
        Self {
            message,
            info,
            receipt,
        }
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("message", &self.message)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// Settles one delivery. Every method returns after the broker durably accepted the result; a second
/// settle is an [`Error`] of kind [`AlreadySettled`](crate::error::Kind::AlreadySettled) (keep what
/// settles in an [`Unsettled`]). Dropping an unsettled receipt releases it.
#[async_trait]
pub trait Receipt: Send {
    /// The handler succeeded (or the event was a duplicate): let go of the message for good.
    async fn ack(&mut self) -> Result<(), Error>;

    /// Acknowledges now, without waiting, where that needs no round trip to the broker (an offset to
    /// commit later, an in-memory queue): `Some` with what [`Receipt::ack`] would return; `None` where
    /// the acknowledgement must wait (the runtime then awaits `ack`). The default has none. What it
    /// spares the runtime is a future per event for the common, successful case.
    fn try_ack(&mut self) -> Option<Result<(), Error>> {
        None
    }

    /// Make `event` (the same payload, key and headers, with updated metadata) come back after `delay` at
    /// the earliest, durably, then let go of the original.
    async fn retry(&mut self, event: &Event, delay: Duration) -> Result<(), Error>;

    /// Put `event` (with its dead-letter metadata) in the DLQ, durably, then let go of the original. An
    /// unwritable DLQ is an error and the original stays unsettled.
    async fn dead_letter(&mut self, event: &Event) -> Result<(), Error>;

    /// Give the message back unchanged, to be delivered again after `after` at the earliest; not a failed
    /// attempt (shutdown, or a settle that failed).
    async fn release(&mut self, after: Duration) -> Result<(), Error>;

    /// Keep the message leased for at least `for_at_least` more (a long handler or a blocking hold);
    /// brokers without leases do nothing.
    async fn keep_alive(&mut self, for_at_least: Duration) -> Result<(), Error> {
        let _ = for_at_least;
        Ok(())
    }
}

/// A stream of deliveries for one consumer.
#[async_trait]
pub trait Subscription: Send {
    /// The next delivery, waiting until one is due; `None` once the subscription is closed. Must be
    /// cancel-safe: dropping the future before it completes loses no message.
    async fn next(&mut self) -> Result<Option<Delivery>, Error>;

    /// A delivery already received and due, handed out without waiting; `None` when there is none at
    /// hand (then the runtime awaits [`Subscription::next`]). A subscription that receives in batches
    /// implements it to spare the runtime a boxed `next` future and a poll per delivery; the default
    /// has none.
    fn next_ready(&mut self) -> Option<Delivery> {
        None
    }

    /// Stop fetching new deliveries (a blocking error holds consumption) while keeping membership alive.
    async fn pause(&mut self) -> Result<(), Error> {
        Ok(())
    }

    /// Fetch again after [`Subscription::pause`].
    async fn resume(&mut self) -> Result<(), Error> {
        Ok(())
    }

    /// Leave cleanly (commit what is settled, leave the group).
    async fn close(self: Box<Self>) -> Result<(), Error> {
        Ok(())
    }

    /// Splits the subscription into receive lanes: returns up to `more` further subscriptions, each a
    /// lane that one receive loop drains on its own core beside this one. Together the lanes deliver
    /// what the subscription would, each delivery to one lane. The runtime asks for one lane per worker
    /// thread, never more than the consumer's concurrency, and for no further lane where per-key
    /// ordering is asked for (lanes need not keep a key's messages together) or the runtime has one
    /// thread; pausing, resuming and closing go to every lane. The default gives none: the
    /// subscription stays whole.
    fn split_lanes(&mut self, more: usize) -> Vec<Box<dyn Subscription>> {
        let _ = more;
        Vec::new()
    }

    /// Gives back what this lane took from the broker and has not handed out, for the other lanes to
    /// take: the runtime calls it when the lane has no free work slot, so that messages a lane took
    /// ahead do not wait behind its busy handlers while another lane is idle. The default has nothing
    /// to give back.
    fn give_back_taken(&mut self) {}
}

/// What a receipt holds until it settles — the broker's handle on the original (an acker, a receipt
/// handle, an offset) — so that it settles exactly once.
///
/// ```
/// use event_retry_core::adapter::Unsettled;
/// use event_retry_core::error::Kind;
///
/// let mut handle = Unsettled::new("receipt-handle-1");
/// assert_eq!(*handle.get().unwrap(), "receipt-handle-1");
/// assert_eq!(handle.take().unwrap(), "receipt-handle-1");
/// assert_eq!(handle.take().unwrap_err().kind(), Kind::AlreadySettled);
/// assert!(handle.is_settled());
/// ```
#[derive(Debug)]
pub struct Unsettled<T>(Option<T>);

impl<T> Unsettled<T> {
    /// Holds `handle` until the delivery settles.
    pub fn new(handle: T) -> Self {
        Self(Some(handle))
    }

    /// The handle, or [`Error::already_settled`].
    pub fn get(&self) -> Result<&T, Error> {
        self.0.as_ref().ok_or_else(Error::already_settled)
    }

    /// The handle, writable, or [`Error::already_settled`].
    pub fn get_mut(&mut self) -> Result<&mut T, Error> {
        self.0.as_mut().ok_or_else(Error::already_settled)
    }

    /// Takes the handle to settle with it, or [`Error::already_settled`] when a settle already took it.
    pub fn take(&mut self) -> Result<T, Error> {
        self.0.take().ok_or_else(Error::already_settled)
    }

    /// Takes the handle if it is still there — for `Drop`, which releases an unsettled delivery.
    pub fn take_unsettled(&mut self) -> Option<T> {
        self.0.take()
    }

    /// Whether a settle took the handle.
    pub fn is_settled(&self) -> bool {
        self.0.is_none()
    }
}
