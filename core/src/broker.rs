//! The broker a service talks to: consumers, a producer and dead-letter operations from one handle.
//!
//! `event_retry::connect(url)` gives a [`Broker`] for any compiled-in adapter; [`Broker::memory`] gives an
//! in-process one. It is cheap to clone (clones share the connection), so one value serves a whole
//! service.

use std::sync::Arc;

use crate::adapter::{Admin, Capabilities, Transport};
use crate::dlq::DeadLetters;
use crate::memory::MemoryTransport;
use crate::producer::Producer;
use crate::runtime::ConsumerBuilder;

/// A connected broker. Cheap to clone.
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use event_retry_core::broker::Broker;
/// use event_retry_core::event::Event;
///
/// let broker = Broker::memory();
/// let published = broker.producer().publish("orders", Event::new("{\"id\":1}")).await?;
/// assert!(!published.event_id.is_empty());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Broker {
    transport: Arc<dyn Transport>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("transport", &self.transport.name())
            .finish()
    }
}

impl Broker {
    /// A broker over an adapter's transport.
    pub fn new(transport: impl Transport) -> Self {
        Self {
            transport: Arc::new(transport),
        }
    }

    /// A new in-process broker (no server; for tests, examples and embedded use).
    pub fn memory() -> Self {
        Self::new(MemoryTransport::new())
    }

    /// The adapter's short name ("memory", "kafka", "rabbitmq", "sqs", "pulsar").
    pub fn name(&self) -> &'static str {
        self.transport.name()
    }

    /// What the broker can do (delay granularity and limits, per-key order, pause, replay).
    pub fn capabilities(&self) -> Capabilities {
        self.transport.capabilities()
    }

    /// What the broker can do with `topic`, where that depends on the topic (an SQS FIFO queue keeps
    /// per-key order, a standard queue does not).
    pub fn capabilities_for(&self, topic: &str) -> Capabilities {
        self.transport.capabilities_for(topic)
    }

    /// Starts building a consumer of `topic`.
    pub fn consumer(&self, topic: impl Into<String>) -> ConsumerBuilder {
        ConsumerBuilder::new(self.transport.clone(), topic.into())
    }

    /// A producer that publishes to this broker.
    pub fn producer(&self) -> Producer {
        Producer::new(self.transport.clone())
    }

    /// The operator view of this broker's dead letter queues.
    pub fn dead_letters(&self) -> DeadLetters {
        DeadLetters::new(self.transport.clone())
    }

    /// Declaring, deleting and naming the broker objects behind a topic.
    pub fn admin(&self) -> &dyn Admin {
        self.transport.admin()
    }

    /// The transport under this broker (the adapter contract; for adapter authors and test suites).
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }
}

impl From<Arc<dyn Transport>> for Broker {
    fn from(transport: Arc<dyn Transport>) -> Self {
        Self { transport }
    }
}

impl From<&Broker> for Broker {
    fn from(broker: &Broker) -> Self {
        broker.clone()
    }
}
