//! The Pulsar adapter as a fixture: each scenario gets its own topics; the DLQ fault terminates the DLQ
//! topic through the admin REST API (`RETRY_TEST_PULSAR_ADMIN`, called with curl), so sends to it fail,
//! and makes it writable again by deleting it, to be created anew.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use event_retry_pulsar::{PulsarConfig, PulsarTransport};
use retry_core::transport::{Transport, TransportError};

use crate::fixture::{Fixture, FixtureCapabilities, made};
use crate::probe::BoxFuture;

/// A fixture over a Pulsar standalone started by `scripts/brokers` (delayed-delivery tick 100 ms, strict
/// `deliverAt`).
#[derive(Clone, Debug)]
pub struct PulsarFixture {
    transport: PulsarTransport,
    admin: Option<String>,
}

impl PulsarFixture {
    /// Connects to `url`; the admin API is found through `RETRY_TEST_PULSAR_ADMIN`.
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        let config = PulsarConfig {
            tick: Duration::from_millis(100),
            strict_deliver_at: true,
            ..PulsarConfig::default()
        };
        Ok(Self {
            transport: PulsarTransport::connect_with(url, config).await?,
            admin: std::env::var("RETRY_TEST_PULSAR_ADMIN")
                .ok()
                .filter(|a| !a.is_empty()),
        })
    }

    /// The harness's constructor.
    pub fn make(url: String) -> BoxFuture<Result<Arc<dyn Fixture>, String>> {
        Box::pin(async move { made(Self::connect(&url).await) })
    }

    /// Calls the admin REST API on the path of `topic` (`persistent/public/default/<topic>`).
    async fn admin(&self, method: &str, topic: &str, action: &str) -> Result<(), TransportError> {
        let admin = self.admin.as_deref().ok_or_else(|| {
            TransportError::Config("RETRY_TEST_PULSAR_ADMIN is not set".to_string())
        })?;
        let url = format!("{admin}/admin/v2/persistent/public/default/{topic}{action}");
        let out = tokio::process::Command::new("curl")
            .args(["-sS", "--fail", "--max-time", "30", "-X", method, &url])
            .output()
            .await
            .map_err(|e| TransportError::Config(format!("run curl: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(TransportError::Rejected {
                operation: format!("{method} {url}"),
                reason: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }
}

#[async_trait]
impl Fixture for PulsarFixture {
    fn name(&self) -> &'static str {
        "pulsar"
    }

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(self.transport.clone())
    }

    fn fixture_capabilities(&self) -> FixtureCapabilities {
        FixtureCapabilities {
            dlq_fault: self.admin.is_some(),
        }
    }

    async fn fresh_topic(&self, scenario: &str) -> Result<String, TransportError> {
        let topic = format!("conformance-{scenario}-{}", uuid::Uuid::new_v4().simple());
        self.transport.declare(&topic).await?;
        Ok(topic)
    }

    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), TransportError> {
        let dlq = format!("{topic}{}", self.transport.config().dlq_suffix);
        if writable {
            self.admin("DELETE", &dlq, "?force=true").await?;
            self.transport.declare(topic).await
        } else {
            self.admin("POST", &dlq, "/terminate").await
        }
    }

    /// Deletes the topic and its DLQ (best effort); the groups' retry topics stay (their names depend on
    /// the group) until the standalone is started afresh.
    async fn cleanup(&self, topic: &str) {
        if self.admin.is_some() {
            let dlq = format!("{topic}{}", self.transport.config().dlq_suffix);
            for t in [topic, dlq.as_str()] {
                let _ = self.admin("DELETE", t, "?force=true").await;
            }
        }
    }

    fn delay_unit(&self) -> Duration {
        Duration::from_millis(300)
    }
}
