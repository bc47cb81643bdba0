//! The conformance suite against a real RabbitMQ broker (`RETRY_TEST_AMQP`, started by `scripts/brokers`).
//!
//! Each scenario gets its own work queue and DLQ, with the adapter's default settings. The DLQ fault
//! deletes the DLQ queue (a dead-letter publish then comes back unroutable) and declares it again.

use std::time::Duration;

use async_trait::async_trait;
use conformance_tests::{Adapter, Faults, Fixture};
use event_retry_rabbitmq::RabbitTransport;
use retry_core::adapter::Admin;
use retry_core::broker::Broker;
use retry_core::error::Error;

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

async fn connect(url: String) -> Result<Fixture, String> {
    let transport = RabbitTransport::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let broker = Broker::new(transport.clone());
    Ok(Fixture::new("rabbitmq", broker, Duration::from_millis(250))
        .with_faults(DlqQueue(transport)))
}

fn main() {
    conformance_tests::run(Adapter {
        name: "rabbitmq",
        url_env: Some("RETRY_TEST_AMQP"),
        connect: |url| Box::pin(connect(url)),
    })
}
