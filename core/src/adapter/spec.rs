//! What a consumer subscribes to, as the runtime tells a transport.

use std::time::Duration;

/// What a consumer subscribes to.
///
/// The runtime builds it ([`SubscriptionSpec::new`] and the setters); transports read its fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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

/// The consumer group a consumer of `topic` joins when it names none (`<topic>-consumers`). A topic is
/// declared with it, so that on a broker that keeps events only for the groups that exist (RabbitMQ
/// queues, Pulsar subscriptions) events published before the first consumer starts are kept for it.
pub fn default_group(topic: &str) -> String {
    format!("{topic}-consumers")
}

impl SubscriptionSpec {
    /// A subscription of `consumer` to `topic` in `group`: unordered, one delivery in flight, no limit
    /// from a retry policy.
    pub fn new(
        topic: impl Into<String>,
        group: impl Into<String>,
        consumer: impl Into<String>,
    ) -> Self {
        Self {
            topic: topic.into(),
            group: group.into(),
            consumer: consumer.into(),
            ordered: false,
            max_in_flight: 1,
            max_deliveries: None,
            longest_delay: None,
        }
    }

    /// Asks for per-key order (or not).
    pub fn with_ordered(mut self, ordered: bool) -> Self {
        self.ordered = ordered;
        self
    }

    /// Sets how many deliveries may be in flight.
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Sets the most deliveries one event can take under the retry policy.
    pub fn with_max_deliveries(mut self, n: Option<u32>) -> Self {
        self.max_deliveries = n;
        self
    }

    /// Sets the longest delay the retry policy asks for.
    pub fn with_longest_delay(mut self, d: Option<Duration>) -> Self {
        self.longest_delay = d;
        self
    }
}
