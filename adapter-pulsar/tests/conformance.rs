//! The conformance suite against a Pulsar standalone (`RETRY_TEST_PULSAR`, started by `scripts/brokers`
//! with a delayed-delivery tick of 100 ms and strict `deliverAt`).
//!
//! Each scenario gets its own topics. The DLQ fault terminates the DLQ topic through the admin REST API
//! (`RETRY_TEST_PULSAR_ADMIN`, called with curl), so sends to it fail, and makes it writable again by
//! deleting it, to be created anew; without the admin URL the scenario is skipped, with the reason.

use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{Adapter, Faults, Fixture, Inspect};
use event_retry_pulsar::{PulsarConfig, PulsarTransport};
use retry_core::adapter::Admin;
use retry_core::broker::Broker;
use retry_core::error::{Error, Kind, wrap};

/// Terminates and deletes DLQ topics through the admin REST API.
struct AdminApi {
    transport: PulsarTransport,
    admin: String,
}

impl AdminApi {
    /// Calls the admin REST API on the path of `topic` (`persistent/public/default/<topic>`); returns the
    /// response body.
    async fn call(&self, method: &str, topic: &str, action: &str) -> Result<String, Error> {
        let url = format!(
            "{}/admin/v2/persistent/public/default/{topic}{action}",
            self.admin
        );
        let out = tokio::process::Command::new("curl")
            .args(["-sS", "--fail", "--max-time", "30", "-X", method, &url])
            .output()
            .await
            .map_err(|e| Error::from_source(Kind::Other, e).with_operation("run curl"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Error::new(
                Kind::Rejected,
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            )
            .with_operation(format!("{method} {url}")))
        }
    }
}

#[async_trait]
impl Faults for AdminApi {
    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), Error> {
        let dlq = format!("{topic}{}", self.transport.config().dlq_suffix);
        if writable {
            self.call("DELETE", &dlq, "?force=true").await?;
            self.transport.declare(topic, None).await
        } else {
            self.call("POST", &dlq, "/terminate").await.map(drop)
        }
    }
}

/// The group's backlog on the topic (messages it has not acknowledged), from the broker's topic stats.
#[async_trait]
impl Inspect for AdminApi {
    async fn held_in_source(&self, topic: &str, group: &str) -> Result<u64, Error> {
        let body = self.call("GET", topic, "/stats").await?;
        let stats: serde_json::Value = serde_json::from_str(&body)
            .map_err(wrap(Kind::Other, format!("read the stats of {topic}")))?;
        Ok(stats["subscriptions"][group]["msgBacklog"]
            .as_u64()
            .unwrap_or(0))
    }
}

async fn connect(url: String) -> Result<Fixture, String> {
    let config = PulsarConfig {
        tick: Duration::from_millis(100),
        strict_deliver_at: true,
        ..PulsarConfig::default()
    };
    let transport = PulsarTransport::connect_with(&url, config)
        .await
        .map_err(|e| e.to_string())?;
    let fixture = Fixture::new(
        "pulsar",
        Broker::new(transport.clone()),
        Duration::from_millis(300),
    );
    Ok(match test_support::broker::url("RETRY_TEST_PULSAR_ADMIN") {
        Some(admin) => fixture
            .with_faults(AdminApi {
                transport: transport.clone(),
                admin: admin.clone(),
            })
            .with_inspect(AdminApi { transport, admin }),
        None => fixture,
    })
}

fn main() {
    conformance_tests::run(Adapter {
        name: "pulsar",
        url_env: Some("RETRY_TEST_PULSAR"),
        connect: |url| Box::pin(connect(url)),
    })
}
