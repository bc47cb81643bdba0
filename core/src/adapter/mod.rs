//! The adapter contract: what a broker adapter implements, and nothing a service author needs.
//!
//! A service talks to a [`Broker`](crate::broker::Broker) (consumers, a producer, dead-letter
//! operations). Under it sits one [`Transport`] per broker, and this module is everything a transport
//! implements. The runtime decides ([`crate::decide`]); a transport carries the decision out with its
//! broker's own mechanism. The contract is shaped so that very different brokers fit it:
//!
//! * Kafka (a log: a retry is a *copy* on a delay-topic ladder, then the source offset is committed),
//! * RabbitMQ (a queue: a copy into a TTL level that dead-letters back, then the original is acked),
//! * SQS (no copy: the received message's visibility timeout *is* the delay),
//! * Pulsar (a copy with `deliver_at`, then the original is acked).
//!
//! That is why settling is a method on the delivery's [`Receipt`] — `retry(event, delay)` means "make this
//! event come back after `delay`, durably, then let go of the original" — rather than a generic "publish to
//! topic X". Every settle method returns only once the broker durably accepted the result: a receipt never
//! acknowledges before its retry or DLQ copy is safe. A receipt dropped without being settled is released:
//! the broker delivers the message again (to this or another consumer), and that is not a failed attempt.
//!
//! # Writing an adapter, in three steps
//!
//! 1. **Implement the contract**: [`Transport`] (publish, subscribe, open the DLQ, capabilities) with its
//!    [`Subscription`] and [`Receipt`], a [`DlqSession`] (read a DLQ's entries, replay one, remove some,
//!    give back the rest — the SDK's [`DeadLetters`](crate::dlq::DeadLetters) does the filtering and the
//!    bookkeeping once for every broker), and [`Admin`] (declare, delete, names).
//! 2. **Register the scheme**: export a [`Scheme`] naming the URL schemes the adapter serves and how it
//!    connects; `event_retry::connect` keeps a table of them, one per compiled-in adapter.
//! 3. **Call the conformance suite** from the adapter's own tests, with a fixture over a real broker; the
//!    suite is a library, so an adapter outside this repository runs it unchanged.
//!
//! The in-memory transport ([`crate::memory`]) follows exactly these steps and is the smallest example.

mod admin;
mod capabilities;
mod dlq;
mod registry;
mod spec;
mod subscription;
mod transport;

pub use admin::{Admin, TopicNames};
pub use capabilities::{BeyondMax, Capabilities, DelayCapability, Honour};
pub use dlq::{DlqSession, Native, StoredDeadLetter};
pub use registry::{ConnectFuture, Scheme};
pub use spec::{SubscriptionSpec, default_group};
pub use subscription::{Delivery, DeliveryInfo, Receipt, Subscription, Unsettled};
pub use transport::{Published, Transport};

pub use crate::error::{Error, Kind};
pub use crate::event::RawMessage;
pub use crate::options::Options;

/// Rebuilds an event from its parts, metadata included — for adapters that carry the metadata apart from
/// the headers (or restore it after a broker-side hop). Producers cannot set metadata: [`crate::producer`]
/// publishes fresh metadata whatever the event carries.
pub fn event_from_parts(
    payload: bytes::Bytes,
    key: Option<bytes::Bytes>,
    headers: crate::headers::Headers,
    meta: crate::metadata::RetryMetadata,
) -> crate::event::Event {
    crate::event::Event::from_parts(payload, key, headers, meta)
}

/// The event's metadata, writable — for adapters and tests that must set a delivery's history (a broker
/// that counts attempts itself, a test that injects one). Not for producers.
pub fn metadata_mut(event: &mut crate::event::Event) -> &mut crate::metadata::RetryMetadata {
    event.metadata_mut()
}
