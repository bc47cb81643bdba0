//! The four brokers through their own clients (rdkafka, lapin, aws-sdk-sqs, pulsar), for tests and
//! harnesses that claim something about a broker's state: what a queue or topic holds — payload, key and
//! headers as the broker stores them — and a DLQ made unwritable. Nothing here reads through the SDK, so a
//! claim read here cannot be an echo of the SDK's own view. [`fixture`] puts the same clients behind the
//! testkit's fixture traits (taking only names from the adapter).

pub mod fixture;
mod kafka;
mod pulsar;
mod rabbitmq;
mod rabbitmqctl;
mod sqs;

use async_trait::async_trait;

pub use self::kafka::{
    RawKafka, leader_moving as kafka_leader_moving, watermarks as kafka_watermarks,
};
pub use self::pulsar::RawPulsar;
pub use self::rabbitmq::RawRabbit;
pub use self::rabbitmqctl::Rabbitmqctl;
pub use self::sqs::RawSqs;

/// Any error of a raw client.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One message as the broker stores it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawEntry {
    /// The payload (the body; on SQS the message body as sent, base64 where the SDK wrote it so).
    pub payload: Vec<u8>,
    /// The broker's own key, where it has one (Kafka's record key, Pulsar's partition key).
    pub key: Option<Vec<u8>>,
    /// Headers, properties or message attributes, by name, with their value's bytes (an AMQP header in
    /// its text form; a Kafka null header empty).
    pub headers: Vec<(String, Vec<u8>)>,
}

impl RawEntry {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// The payloads of `entries`, as text.
pub(crate) fn payloads(entries: Vec<RawEntry>) -> Vec<String> {
    entries
        .into_iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect()
}

/// A unique name for a reader's own subscription or group.
pub(crate) fn reader_name() -> String {
    format!("raw-reader-{}", uuid::Uuid::new_v4().simple())
}

/// One broker through its own client.
#[async_trait]
pub trait RawBroker: Send + Sync {
    /// Every message in the queue or topic `name`, read with the broker's client; the messages stay.
    async fn messages(&self, name: &str) -> Result<Vec<RawEntry>, BoxError>;

    /// The payload of every entry in the DLQ `dlq`, as text; the entries stay.
    async fn dlq_payloads(&self, dlq: &str) -> Result<Vec<String>, BoxError> {
        Ok(payloads(self.messages(dlq).await?))
    }

    /// How many of the queue or topic `source`'s messages the broker still holds for consumer group
    /// `group`, as the broker itself counts them (each broker says what it counts). A group whose
    /// consumer settles nothing never sees it fall.
    async fn waiting(&self, source: &str, group: &str) -> Result<u64, BoxError>;

    /// Makes `dlq` refuse writes. Where that cannot keep its entries in the broker, they are taken out and
    /// returned (their payloads), and the harness counts them as DLQ entries.
    async fn refuse_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError>;

    /// Makes `dlq` accept writes again (the harness then declares the topic again), returning any entries
    /// that had to be taken out.
    async fn accept_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError>;
}

/// The raw client of the broker at `url`, chosen by its scheme (`kafka://`, `amqp://`, `amqps://`, an
/// SQS endpoint's `http(s)://`, `pulsar://`); a Pulsar broker's admin API is `RETRY_TEST_PULSAR_ADMIN`,
/// else port 8080 of the broker's host. The URL's query (adapter options) is left out.
pub async fn for_url(url: &str) -> Result<Box<dyn RawBroker>, BoxError> {
    let bare = url.split('?').next().unwrap_or(url);
    let scheme = bare.split("://").next().unwrap_or_default();
    Ok(match scheme {
        "kafka" => Box::new(RawKafka::new(bare)),
        "amqp" | "amqps" => Box::new(RawRabbit::new(bare)),
        "http" | "https" => Box::new(RawSqs::new(bare)),
        "pulsar" => {
            let admin = match std::env::var("RETRY_TEST_PULSAR_ADMIN") {
                Ok(admin) if !admin.is_empty() => admin,
                _ => {
                    let host = bare.trim_start_matches("pulsar://");
                    let host = host.split([':', '/']).next().unwrap_or(host);
                    format!("http://{host}:8080")
                }
            };
            Box::new(RawPulsar::connect(bare, &admin).await?)
        }
        other => return Err(format!("no raw client for the scheme {other:?} of {url}").into()),
    })
}
