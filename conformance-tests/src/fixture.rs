//! What a scenario needs from an adapter: a transport, fresh topics, and a few fault switches.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use retry_core::memory::MemoryTransport;
use retry_core::transport::{Capabilities, Transport, TransportError};

/// Faults a fixture can inject; scenarios that need one are skipped (with the reason) where it is absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixtureCapabilities {
    /// [`Fixture::set_dlq_writable`] works.
    pub dlq_fault: bool,
}

/// One adapter under test.
#[async_trait]
pub trait Fixture: Send + Sync + 'static {
    /// The adapter's name in test names and the report ("memory", "kafka", ...).
    fn name(&self) -> &'static str;

    /// The transport under test (shared by all scenarios; each uses its own topics).
    fn transport(&self) -> Arc<dyn Transport>;

    /// The transport's capabilities; scenarios adapt their expectations to these.
    fn capabilities(&self) -> Capabilities {
        self.transport().capabilities()
    }

    /// Faults this fixture can inject.
    fn fixture_capabilities(&self) -> FixtureCapabilities;

    /// A new topic (queue) with a unique name, created with whatever the adapter needs (DLQ, retry route).
    async fn fresh_topic(&self, scenario: &str) -> Result<String, TransportError>;

    /// Makes the DLQ of `topic` unwritable (`false`) or writable again (`true`).
    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), TransportError>;

    /// Removes what [`Fixture::fresh_topic`] created (best effort).
    async fn cleanup(&self, topic: &str) {
        let _ = topic;
    }

    /// The base delay scenarios use: long enough that the broker distinguishes it, short enough that the
    /// suite stays quick.
    fn delay_unit(&self) -> Duration;
}

/// A fixture as the harness keeps it (an adapter fixture's `make` ends with this), or why it could not
/// be made.
pub fn made<F: Fixture>(fixture: Result<F, TransportError>) -> Result<Arc<dyn Fixture>, String> {
    fixture
        .map(|f| Arc::new(f) as Arc<dyn Fixture>)
        .map_err(|e| e.to_string())
}

/// The in-memory transport as a fixture: always available.
#[derive(Clone, Debug, Default)]
pub struct MemoryFixture {
    transport: MemoryTransport,
}

impl MemoryFixture {
    /// A fixture over a new in-memory broker.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Fixture for MemoryFixture {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(self.transport.clone())
    }

    fn fixture_capabilities(&self) -> FixtureCapabilities {
        FixtureCapabilities { dlq_fault: true }
    }

    async fn fresh_topic(&self, scenario: &str) -> Result<String, TransportError> {
        Ok(format!("{scenario}-{}", uuid::Uuid::new_v4().simple()))
    }

    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), TransportError> {
        self.transport.set_dlq_writable(topic, writable);
        Ok(())
    }

    fn delay_unit(&self) -> Duration {
        Duration::from_millis(100)
    }
}
