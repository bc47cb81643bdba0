//! The brokers' own clients, for what a fault run claims about a broker's state: what its DLQ holds, and
//! a DLQ that refuses writes. Nothing here goes through the SDK.

mod kafka;
mod pulsar;
mod rabbitmq;
mod sqs;

use async_trait::async_trait;

pub(crate) use self::kafka::RawKafka;
pub(crate) use self::pulsar::RawPulsar;
pub(crate) use self::rabbitmq::RawRabbit;
pub(crate) use self::sqs::RawSqs;

/// Any error of a raw client.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One broker through its own client.
#[async_trait]
pub(crate) trait RawBroker: Send + Sync {
    /// The payload of every entry in the DLQ `dlq`, read with the broker's client; the entries stay.
    async fn dlq_payloads(&self, dlq: &str) -> Result<Vec<String>, BoxError>;

    /// Makes `dlq` refuse writes. Where that cannot keep its entries in the broker, they are taken out and
    /// returned, and the harness counts them as DLQ entries.
    async fn refuse_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError>;

    /// Makes `dlq` accept writes again (the harness then declares the topic again), returning any entries
    /// that had to be taken out.
    async fn accept_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError>;
}
