//! The conformance suite against the in-memory transport — called exactly as every broker adapter calls
//! it: a fixture over the broker, then `conformance_tests::run`.

use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{Adapter, Faults, Fixture, Inspect};
use retry_core::broker::Broker;
use retry_core::error::Error;
use retry_core::memory::MemoryTransport;

/// The in-memory broker's DLQ switch.
struct MemoryFaults(MemoryTransport);

#[async_trait]
impl Faults for MemoryFaults {
    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), Error> {
        self.0.set_dlq_writable(topic, writable);
        Ok(())
    }
}

/// The in-memory broker's own count of what it holds for a group of a topic. A retry goes back into the
/// group's own queue, so it has no separate retry route to read.
#[async_trait]
impl Inspect for MemoryFaults {
    async fn held_in_source(&self, topic: &str, group: &str) -> Result<u64, Error> {
        Ok(self.0.held(topic, group) as u64)
    }
}

fn main() {
    conformance_tests::run(Adapter {
        name: "memory",
        url_env: None,
        connect: |_url| {
            Box::pin(async {
                let transport = MemoryTransport::new();
                let broker = Broker::new(transport.clone());
                Ok(Fixture::new("memory", broker, Duration::from_millis(100))
                    .with_faults(MemoryFaults(transport.clone()))
                    .with_inspect(MemoryFaults(transport)))
            })
        },
    })
}
