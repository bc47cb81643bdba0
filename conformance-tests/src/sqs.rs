//! The SQS adapter as a fixture: each scenario gets its own queue, DLQ and redrive policy; the DLQ fault
//! deletes the DLQ queue (a dead-letter send then fails) and creates it again.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use event_retry_sqs::SqsTransport;
use retry_core::transport::{Transport, TransportError};

use crate::fixture::{Fixture, FixtureCapabilities, made};
use crate::probe::BoxFuture;

/// A fixture over an SQS endpoint (ElasticMQ here).
#[derive(Clone, Debug)]
pub struct SqsFixture {
    transport: SqsTransport,
}

impl SqsFixture {
    /// Connects to the endpoint at `url` with the adapter's default settings.
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        Ok(Self {
            transport: SqsTransport::connect(url).await?,
        })
    }

    /// The harness's constructor.
    pub fn make(url: String) -> BoxFuture<Result<Arc<dyn Fixture>, String>> {
        Box::pin(async move { made(Self::connect(&url).await) })
    }
}

#[async_trait]
impl Fixture for SqsFixture {
    fn name(&self) -> &'static str {
        "sqs"
    }

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(self.transport.clone())
    }

    fn fixture_capabilities(&self) -> FixtureCapabilities {
        FixtureCapabilities { dlq_fault: true }
    }

    async fn fresh_topic(&self, scenario: &str) -> Result<String, TransportError> {
        let topic = format!("conformance-{scenario}-{}", uuid::Uuid::new_v4().simple());
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
        Duration::from_secs(1)
    }
}
