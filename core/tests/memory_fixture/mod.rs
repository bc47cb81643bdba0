//! The in-memory broker as the conformance suite's fixture, shared by the suite's two runs (on a
//! multi-threaded and on a current-thread runtime).

use std::time::Duration;

use async_trait::async_trait;
use event_retry_core::broker::Broker;
use event_retry_core::error::Error;
use event_retry_core::memory::MemoryTransport;
use event_retry_testkit::{Faults, Fixture, Inspect};

/// The in-memory broker's DLQ switch.
struct MemoryFaults(MemoryTransport);

#[async_trait]
impl Faults for MemoryFaults {
    async fn set_dlq_writable(
        &self,
        topic: &str,
        _group: &str,
        writable: bool,
    ) -> Result<(), Error> {
        self.0.set_dlq_writable(topic, writable);
        Ok(())
    }
}

/// The in-memory broker's own counts of what it holds for a group of a topic, and of the retries it
/// put back into the group's queue with a delay (its retry route).
#[async_trait]
impl Inspect for MemoryFaults {
    async fn held_in_source(&self, topic: &str, group: &str) -> Result<u64, Error> {
        Ok(self.0.held(topic, group) as u64)
    }

    async fn sent_to_retry_route(&self, topic: &str, group: &str) -> Result<Option<u64>, Error> {
        Ok(Some(self.0.retries_scheduled(topic, group) as u64))
    }
}

/// The suite's fixture named `name` over a new in-memory broker.
pub(crate) fn fixture(name: &'static str) -> Fixture {
    let transport = MemoryTransport::new();
    let broker = Broker::new(transport.clone());
    Fixture::new(name, broker, Duration::from_millis(100))
        .with_faults(MemoryFaults(transport.clone()))
        .with_inspect(MemoryFaults(transport))
}
