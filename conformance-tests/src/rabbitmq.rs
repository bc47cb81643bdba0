//! The RabbitMQ adapter as a fixture: each scenario gets its own work queue and DLQ; the DLQ fault
//! deletes the DLQ queue (a dead-letter publish then comes back unroutable) and declares it again.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use event_retry_rabbitmq::RabbitTransport;
use retry_core::transport::{Transport, TransportError};

use crate::fixture::{Fixture, FixtureCapabilities, made};
use crate::probe::BoxFuture;

/// A fixture over a RabbitMQ broker.
#[derive(Clone, Debug)]
pub struct RabbitFixture {
    transport: RabbitTransport,
}

impl RabbitFixture {
    /// Connects to the broker at `url` with the adapter's default settings.
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        Ok(Self {
            transport: RabbitTransport::connect(url).await?,
        })
    }

    /// The harness's constructor.
    pub fn make(url: String) -> BoxFuture<Result<Arc<dyn Fixture>, String>> {
        Box::pin(async move { made(Self::connect(&url).await) })
    }
}

#[async_trait]
impl Fixture for RabbitFixture {
    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(self.transport.clone())
    }

    fn fixture_capabilities(&self) -> FixtureCapabilities {
        FixtureCapabilities { dlq_fault: true }
    }

    async fn fresh_topic(&self, scenario: &str) -> Result<String, TransportError> {
        let topic = format!("conformance.{scenario}-{}", uuid::Uuid::new_v4().simple());
        self.transport.declare(&topic).await?;
        Ok(topic)
    }

    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), TransportError> {
        if writable {
            self.transport.declare(topic).await
        } else {
            self.transport.delete_dlq(topic).await
        }
    }

    async fn cleanup(&self, topic: &str) {
        let _ = self.transport.delete_topic(topic).await;
    }

    fn delay_unit(&self) -> Duration {
        Duration::from_millis(250)
    }
}
