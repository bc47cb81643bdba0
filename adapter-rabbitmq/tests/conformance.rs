//! The conformance suite against a real RabbitMQ broker (`RETRY_TEST_AMQP`, started by `scripts/brokers`).
//!
//! Each scenario gets its own work queue and DLQ, with the adapter's default settings. The DLQ fault
//! deletes the DLQ queue (a dead-letter publish then comes back unroutable) and declares it again.

use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{Adapter, Faults, Fixture, Inspect};
use event_retry_rabbitmq::RabbitTransport;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use retry_core::adapter::Admin;
use retry_core::broker::Broker;
use retry_core::error::{Error, Kind, wrap};

/// Deletes and re-declares a topic's DLQ queue.
struct DlqQueue(RabbitTransport);

#[async_trait]
impl Faults for DlqQueue {
    async fn set_dlq_writable(&self, topic: &str, writable: bool) -> Result<(), Error> {
        if writable {
            self.0.declare(topic, None).await
        } else {
            self.0.delete_dlq(topic).await
        }
    }
}

/// Reads a work queue's message count with a raw lapin connection (a passive declare).
struct QueueDepth {
    url: String,
}

/// Messages ready in the topic's work queue (consumers of every group share it); with no consumer
/// running, what is not acknowledged is back there.
#[async_trait]
impl Inspect for QueueDepth {
    async fn held_in_source(&self, topic: &str, _group: &str) -> Result<u64, Error> {
        let conn = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .map_err(wrap(Kind::Connection, "connect a raw client"))?;
        let ch = conn
            .create_channel()
            .await
            .map_err(wrap(Kind::Connection, "open a channel"))?;
        let queue = ch
            .queue_declare(
                topic.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(wrap(Kind::NotFound, format!("check queue {topic}")))?;
        let _ = conn.close(200, "done".into()).await;
        Ok(u64::from(queue.message_count()))
    }
}

async fn connect(url: String) -> Result<Fixture, String> {
    let transport = RabbitTransport::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let broker = Broker::new(transport.clone());
    Ok(Fixture::new("rabbitmq", broker, Duration::from_millis(250))
        .with_faults(DlqQueue(transport))
        .with_inspect(QueueDepth { url }))
}

fn main() {
    conformance_tests::run(Adapter {
        name: "rabbitmq",
        url_env: Some("RETRY_TEST_AMQP"),
        connect: |url| Box::pin(connect(url)),
    })
}
