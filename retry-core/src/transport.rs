//! The contract between the runtime and a broker adapter.
//!
//! The runtime decides ([`crate::decide`]); a transport carries the decision out with its broker's own
//! mechanism. The contract is shaped so that very different brokers fit it:
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

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::dlq::DeadLetterQueue;
use crate::event::{Event, RawMessage};
use crate::metadata::Origin;

/// An error from a broker or its client.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The broker could not be reached or the connection broke.
    #[error("connection: {0}")]
    Connection(String),
    /// The broker refused or did not confirm the operation (e.g. an unwritable DLQ).
    #[error("{operation} failed: {reason}")]
    Rejected {
        /// What was attempted (e.g. "dead-letter to orders.dlq").
        operation: String,
        /// Why it failed.
        reason: String,
    },
    /// The configuration or topology is wrong (missing topic, bad URL).
    #[error("configuration: {0}")]
    Config(String),
    /// The receipt was already settled.
    #[error("the delivery was already settled")]
    AlreadySettled,
    /// The transport was closed.
    #[error("the transport is closed")]
    Closed,
}

/// How a broker honours a delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DelayCapability {
    /// The smallest step of delay the broker distinguishes; delays are rounded *up* to it (never early).
    pub granularity: Duration,
    /// The longest delay one native hop carries, if limited.
    pub max_native: Option<Duration>,
    /// What happens to a delay longer than `max_native`.
    pub beyond_max: BeyondMax,
}

/// What a transport does with a delay longer than its native maximum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BeyondMax {
    /// It refuses the policy at start-up.
    Refuse,
    /// It carries the delay in several hops of at most the native maximum.
    Split,
}

/// What a transport can do; the conformance suite adapts its expectations to these, never the reverse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// How delays are honoured.
    pub delay: DelayCapability,
    /// Per-key ordering of retries (parking) can be kept.
    pub per_key_order: bool,
    /// Consumption can be paused while a blocking error holds an event.
    pub blocking_pause: bool,
    /// DLQ entries can be replayed.
    pub replay: bool,
    /// Several consumers can share a subscription (a consumer group) and take over each other's work.
    pub shared_subscription: bool,
    /// Work of a consumer that dies without settling is delivered again.
    pub crash_redelivery: bool,
}

/// How one delay will be honoured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Honour {
    /// Exactly as asked.
    Exact,
    /// Rounded up to the broker's granularity.
    Rounded {
        /// The delay that will apply.
        to: Duration,
    },
    /// Carried in several hops.
    Split {
        /// How many hops.
        hops: u32,
    },
    /// Cannot be honoured.
    Refused {
        /// Why.
        reason: String,
    },
}

impl std::fmt::Display for Honour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Honour::Exact => f.write_str("exact"),
            Honour::Rounded { to } => {
                write!(f, "rounded up to {}", crate::time::format_duration(*to))
            }
            Honour::Split { hops } => write!(f, "split into {hops} hops"),
            Honour::Refused { reason } => write!(f, "refused: {reason}"),
        }
    }
}

impl DelayCapability {
    /// Delays of any length, to the millisecond (the in-memory transport).
    pub const EXACT: DelayCapability = DelayCapability {
        granularity: Duration::from_millis(1),
        max_native: None,
        beyond_max: BeyondMax::Refuse,
    };

    /// How `delay` will be honoured.
    pub fn honour(&self, delay: Duration) -> Honour {
        if let Some(max) = self.max_native
            && delay > max
        {
            return match self.beyond_max {
                BeyondMax::Refuse => Honour::Refused {
                    reason: format!(
                        "longer than the broker's maximum of {}",
                        crate::time::format_duration(max)
                    ),
                },
                BeyondMax::Split => {
                    let hops = delay.as_millis().div_ceil(max.as_millis().max(1));
                    Honour::Split {
                        hops: u32::try_from(hops).unwrap_or(u32::MAX),
                    }
                }
            };
        }
        let g = self.granularity.as_millis().max(1);
        let ms = delay.as_millis();
        if ms.is_multiple_of(g) {
            Honour::Exact
        } else {
            let up = ms.div_ceil(g) * g;
            Honour::Rounded {
                to: Duration::from_millis(u64::try_from(up).unwrap_or(u64::MAX)),
            }
        }
    }
}

/// What a consumer subscribes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionSpec {
    /// The source topic or queue.
    pub topic: String,
    /// The consumer group (subscription name); consumers of one group share the work.
    pub group: String,
    /// This consumer's name, recorded on DLQ entries.
    pub consumer: String,
    /// Per-key ordering is asked for (the transport may need a particular subscription type).
    pub ordered: bool,
    /// The runtime's concurrency: deliveries handed out but not yet settled should not exceed it much
    /// (prefetch, batch size).
    pub max_in_flight: usize,
    /// The most broker deliveries one event can take under the retry policy (the first, plus one per
    /// deferred retry); `None` when the policy sets no limit. A broker that moves messages to a DLQ by
    /// receive count (SQS's redrive policy) checks its limit against it.
    pub max_deliveries: Option<u32>,
    /// The longest delay the retry policy asks for, for brokers whose limits depend on the queue.
    pub longest_delay: Option<Duration>,
}

/// Facts about one delivery, from the broker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeliveryInfo {
    /// The broker's id for the message; the event id when the producer set none.
    pub message_id: String,
    /// Where it was consumed (topic, and partition/offset where the broker has them).
    pub origin: Origin,
    /// Failed attempts as the broker counts them, for brokers where a retry is the same message coming
    /// back rather than a copy carrying new metadata (SQS: `ApproximateReceiveCount - 1`); the runtime
    /// takes the larger of this and the metadata's count. Such a broker also counts a release (shutdown)
    /// or a crash as a receive, so there they count as attempts.
    pub broker_attempts: Option<u32>,
    /// Retries scheduled through the broker, as the broker counts them, for the same brokers (SQS:
    /// `ApproximateReceiveCount - 1`); the runtime takes the larger of this and the metadata's count, so
    /// the policy advances even though the message's metadata could not be rewritten.
    pub broker_retries: Option<u32>,
}

/// One message handed to the runtime, with the means to settle it.
pub struct Delivery {
    /// The message as it travelled (the runtime decodes the metadata).
    pub message: RawMessage,
    /// Facts from the broker.
    pub info: DeliveryInfo,
    /// Settles the delivery.
    pub receipt: Box<dyn Receipt>,
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
/// settle is [`TransportError::AlreadySettled`]. Dropping an unsettled receipt releases it.
#[async_trait]
pub trait Receipt: Send {
    /// The handler succeeded (or the event was a duplicate): let go of the message for good.
    async fn ack(&mut self) -> Result<(), TransportError>;

    /// Make `event` (the same payload, key and headers, with updated metadata) come back after `delay` at
    /// the earliest, durably, then let go of the original.
    async fn retry(&mut self, event: &Event, delay: Duration) -> Result<(), TransportError>;

    /// Put `event` (with its dead-letter metadata) in the DLQ, durably, then let go of the original. An
    /// unwritable DLQ is an error and the original stays unsettled.
    async fn dead_letter(&mut self, event: &Event) -> Result<(), TransportError>;

    /// Give the message back unchanged, to be delivered again after `after` at the earliest; not a failed
    /// attempt (shutdown, or a settle that failed).
    async fn release(&mut self, after: Duration) -> Result<(), TransportError>;

    /// Keep the message leased for at least `for_at_least` more (a long handler or a blocking hold);
    /// brokers without leases do nothing.
    async fn keep_alive(&mut self, for_at_least: Duration) -> Result<(), TransportError> {
        let _ = for_at_least;
        Ok(())
    }
}

/// A stream of deliveries for one consumer.
#[async_trait]
pub trait Subscription: Send {
    /// The next delivery, waiting until one is due; `None` once the subscription is closed. Must be
    /// cancel-safe: dropping the future before it completes loses no message.
    async fn next(&mut self) -> Result<Option<Delivery>, TransportError>;

    /// Stop fetching new deliveries (a blocking error holds consumption) while keeping membership alive.
    async fn pause(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    /// Fetch again after [`Subscription::pause`].
    async fn resume(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    /// Leave cleanly (commit what is settled, leave the group).
    async fn close(self: Box<Self>) -> Result<(), TransportError> {
        Ok(())
    }
}

/// A broker, as the runtime and the operator tools see it.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// A short name for reports ("memory", "kafka", ...).
    fn name(&self) -> &'static str;

    /// What this transport can do.
    fn capabilities(&self) -> Capabilities;

    /// Publishes a new event to `topic` (the producer side; also used by replay and tests).
    async fn publish(&self, topic: &str, event: &Event) -> Result<(), TransportError>;

    /// Subscribes a consumer.
    async fn subscribe(
        &self,
        spec: &SubscriptionSpec,
    ) -> Result<Box<dyn Subscription>, TransportError>;

    /// The operator view of the dead letter queues.
    fn dead_letters(&self) -> Arc<dyn DeadLetterQueue>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn honour_rounds_up_splits_and_refuses() {
        let second = DelayCapability {
            granularity: Duration::from_secs(1),
            max_native: Some(Duration::from_secs(900)),
            beyond_max: BeyondMax::Split,
        };
        assert_eq!(second.honour(Duration::from_secs(5)), Honour::Exact);
        assert_eq!(
            second.honour(Duration::from_millis(1_500)),
            Honour::Rounded {
                to: Duration::from_secs(2)
            }
        );
        assert_eq!(
            second.honour(Duration::from_secs(3_600)),
            Honour::Split { hops: 4 }
        );
        let refuse = DelayCapability {
            beyond_max: BeyondMax::Refuse,
            ..second
        };
        assert!(matches!(
            refuse.honour(Duration::from_secs(901)),
            Honour::Refused { .. }
        ));
        assert_eq!(
            DelayCapability::EXACT.honour(Duration::from_millis(1_234)),
            Honour::Exact
        );
    }

    #[test]
    fn traits_are_object_safe() {
        fn _t(_: &dyn Transport, _: &dyn Subscription, _: &dyn Receipt) {}
    }
}
