//! Pulsar read with the `pulsar` client itself: a topic from its first message, on a subscription of its
//! own. The DLQ is made unwritable by terminating it through the admin API; a terminated topic
//! keeps its messages but can never be written again, so healing reads them, deletes the topic and lets
//! the harness declare it anew.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use pulsar::consumer::InitialPosition;
use pulsar::{ConsumerOptions, Pulsar, SubType, TokioExecutor};

use super::{BoxError, RawBroker, RawEntry, reader_name};

/// Pulsar's own client, and the broker's admin REST API.
pub struct RawPulsar {
    client: Pulsar<TokioExecutor>,
    admin: String,
}

impl RawPulsar {
    /// A client of the broker at `url`, with its admin API at `admin`.
    pub async fn connect(url: &str, admin: &str) -> Result<Self, BoxError> {
        Ok(Self {
            client: Pulsar::builder(url, TokioExecutor).build().await?,
            admin: admin.trim_end_matches('/').to_string(),
        })
    }

    /// How many messages of `topic` subscription `subscription` has not acknowledged (its backlog), from
    /// the broker's topic stats.
    pub async fn backlog(&self, topic: &str, subscription: &str) -> Result<u64, BoxError> {
        let body = self.admin_get(topic, "/stats").await?;
        let stats: serde_json::Value = serde_json::from_str(&body)?;
        stats["subscriptions"][subscription]["msgBacklog"]
            .as_u64()
            .ok_or_else(|| format!("no subscription {subscription} on {topic}: {body}").into())
    }

    /// `GET` on the admin API of `topic` with curl; the body.
    async fn admin_get(&self, topic: &str, action: &str) -> Result<String, BoxError> {
        let short = topic.rsplit('/').next().unwrap_or(topic);
        let url = format!(
            "{}/admin/v2/persistent/public/default/{short}{action}",
            self.admin
        );
        let out = tokio::process::Command::new("curl")
            .args(["-sSf", "--max-time", "30", &url])
            .output()
            .await?;
        if !out.status.success() {
            return Err(format!("GET {url}: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Calls the admin API on `topic` (`POST …/terminate`, `DELETE …?force=true`) with curl.
    async fn admin_call(&self, method: &str, topic: &str, action: &str) -> Result<(), BoxError> {
        let short = topic.rsplit('/').next().unwrap_or(topic);
        let url = format!(
            "{}/admin/v2/persistent/public/default/{short}{action}",
            self.admin
        );
        let out = tokio::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "30",
                "-w",
                "\n%{http_code}",
                "-X",
                method,
                &url,
            ])
            .output()
            .await?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
        match status.trim().parse::<u16>() {
            Ok(200..=299) => Ok(()),
            _ => Err(format!("{method} {url}: {status} {body}").into()),
        }
    }
}

#[async_trait]
impl RawBroker for RawPulsar {
    /// The subscription's backlog: every message it has not acknowledged.
    async fn waiting(&self, topic: &str, subscription: &str) -> Result<u64, BoxError> {
        self.backlog(topic, subscription).await
    }

    async fn messages(&self, topic: &str) -> Result<Vec<RawEntry>, BoxError> {
        let subscription = reader_name();
        let mut consumer: pulsar::Consumer<Vec<u8>, TokioExecutor> = self
            .client
            .consumer()
            .with_topic(topic)
            .with_subscription(&subscription)
            .with_subscription_type(SubType::Exclusive)
            .with_options(
                ConsumerOptions::default().with_initial_position(InitialPosition::Earliest),
            )
            .build()
            .await?;
        let mut payloads = Vec::new();
        while let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_secs(2), consumer.next()).await
        {
            let message = message?;
            let metadata = &message.payload.metadata;
            payloads.push(RawEntry {
                payload: message.payload.data.clone(),
                key: metadata.partition_key.clone().map(String::into_bytes),
                headers: metadata
                    .properties
                    .iter()
                    .map(|kv| (kv.key.clone(), kv.value.clone().into_bytes()))
                    .collect(),
            });
        }
        let _ = consumer.unsubscribe().await;
        let _ = consumer.close().await;
        Ok(payloads)
    }

    async fn refuse_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError> {
        self.admin_call("POST", dlq, "/terminate").await?;
        Ok(Vec::new())
    }

    async fn accept_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError> {
        // A terminated topic cannot be reopened: keep what it holds, then delete it (the harness declares
        // it again).
        let kept = self.dlq_payloads(dlq).await?;
        self.admin_call("DELETE", dlq, "?force=true").await?;
        Ok(kept)
    }
}
