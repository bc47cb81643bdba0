#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub use retry_core::{
    check, classify, config, decide, dlq, event, idempotency, lifecycle, memory, metadata, policy,
    prelude, runtime, telemetry, time, transport,
};

/// The Apache Kafka adapter (feature `kafka`).
#[cfg(feature = "kafka")]
pub use event_retry_kafka as kafka;
/// The Apache Pulsar adapter (feature `pulsar`).
#[cfg(feature = "pulsar")]
pub use event_retry_pulsar as pulsar;
/// The RabbitMQ adapter (feature `rabbitmq`).
#[cfg(feature = "rabbitmq")]
pub use event_retry_rabbitmq as rabbitmq;
/// The Amazon SQS adapter (feature `sqs`).
#[cfg(feature = "sqs")]
pub use event_retry_sqs as sqs;

use retry_core::memory::MemoryTransport;
use retry_core::transport::Transport;

/// Why [`connect`] could not give a transport.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The text is not a URL of the form `scheme://rest`.
    #[error(
        "{url:?} is not a broker URL: expected scheme://..., e.g. memory://, kafka://host:9092, amqp://host:5672, sqs://..., pulsar://host:6650"
    )]
    InvalidUrl {
        /// The text given.
        url: String,
    },
    /// The scheme names a broker whose adapter is not compiled into this build.
    #[error(
        "{scheme}:// needs the {broker} adapter, which this build does not include: enable the `{feature}` feature of event-retry"
    )]
    AdapterMissing {
        /// The URL scheme.
        scheme: String,
        /// The broker.
        broker: &'static str,
        /// The cargo feature that provides it.
        feature: &'static str,
    },
    /// The adapter is compiled in, but could not connect (unreachable broker, bad settings).
    #[error("{broker}: {source}")]
    Broker {
        /// The broker.
        broker: &'static str,
        /// What went wrong.
        #[source]
        source: retry_core::transport::TransportError,
    },
    /// The scheme is not one this SDK knows.
    #[error(
        "unknown broker URL scheme {scheme:?}: expected memory, kafka, amqp, amqps, sqs, https (an SQS queue URL), pulsar or pulsar+ssl"
    )]
    UnknownScheme {
        /// The URL scheme.
        scheme: String,
    },
}

/// The broker a URL scheme names, and the feature that compiles its adapter in.
fn broker_of(scheme: &str) -> Option<(&'static str, &'static str)> {
    match scheme {
        "kafka" => Some(("Kafka", "kafka")),
        "amqp" | "amqps" => Some(("RabbitMQ", "rabbitmq")),
        "sqs" | "https" => Some(("Amazon SQS", "sqs")),
        "pulsar" | "pulsar+ssl" => Some(("Apache Pulsar", "pulsar")),
        _ => None,
    }
}

/// Connects to the broker a URL names, with the adapter compiled in for its scheme.
///
/// * `memory://` — a new in-process broker; `memory://name` — the in-process broker called `name`, shared
///   by every `connect` of the same URL in this process (so a producer and a consumer meet).
/// * `amqp://user:pass@host:port/vhost` (or `amqps://`) — RabbitMQ, with the `rabbitmq` feature and
///   the adapter's default settings (`event_retry::rabbitmq::RabbitTransport::connect_with` takes others).
/// * `sqs://` (AWS; region and credentials from the environment), `sqs://key:secret@host:port` or
///   `http://127.0.0.1:9324` (an SQS-compatible endpoint), or an `https://` SQS queue URL — Amazon SQS,
///   with the `sqs` feature (`event_retry::sqs::SqsTransport::from_client` takes an aws-config client).
/// * `pulsar://host:6650` (or `pulsar+ssl://`) — Apache Pulsar, with the `pulsar` feature and the
///   adapter's default settings (a broker tick of 1 s; `event_retry::pulsar::PulsarTransport::connect_with`
///   takes others).
/// * `kafka://host:port[,host:port…]` — Apache Kafka, with the `kafka` feature and the adapter's default
///   settings (a ladder of 100 ms steps up to 1 day; `event_retry::kafka::KafkaTransport::connect_with`
///   takes others).
///
/// Without an adapter's feature, its URLs give an error naming the feature to enable.
pub async fn connect(url: &str) -> Result<Arc<dyn Transport>, ConnectError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| ConnectError::InvalidUrl {
            url: url.to_string(),
        })?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme == "memory" {
        return Ok(Arc::new(named_memory(rest)));
    }
    #[cfg(feature = "kafka")]
    if scheme == "kafka" {
        return connected(
            "Apache Kafka",
            event_retry_kafka::KafkaTransport::connect(url).await,
        );
    }
    #[cfg(feature = "rabbitmq")]
    if scheme == "amqp" || scheme == "amqps" {
        return connected(
            "RabbitMQ",
            event_retry_rabbitmq::RabbitTransport::connect(url).await,
        );
    }
    #[cfg(feature = "sqs")]
    if scheme == "sqs" || scheme == "https" || (scheme == "http" && is_loopback(rest)) {
        return connected(
            "Amazon SQS",
            event_retry_sqs::SqsTransport::connect(url).await,
        );
    }
    #[cfg(feature = "pulsar")]
    if scheme == "pulsar" || scheme == "pulsar+ssl" {
        return connected(
            "Apache Pulsar",
            event_retry_pulsar::PulsarTransport::connect(url).await,
        );
    }
    match broker_of(&scheme) {
        Some((broker, feature)) => Err(ConnectError::AdapterMissing {
            scheme,
            broker,
            feature,
        }),
        None => Err(ConnectError::UnknownScheme { scheme }),
    }
}

/// A transport an adapter connected, or its error named after the broker.
#[cfg(any(
    feature = "kafka",
    feature = "rabbitmq",
    feature = "sqs",
    feature = "pulsar"
))]
fn connected<T: Transport>(
    broker: &'static str,
    result: Result<T, retry_core::transport::TransportError>,
) -> Result<Arc<dyn Transport>, ConnectError> {
    result
        .map(|t| Arc::new(t) as Arc<dyn Transport>)
        .map_err(|source| ConnectError::Broker { broker, source })
}

/// Whether the authority of `rest` (after `scheme://`) is a loopback host (a local SQS endpoint).
#[cfg(feature = "sqs")]
fn is_loopback(rest: &str) -> bool {
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

fn named_memory(name: &str) -> MemoryTransport {
    let name = name.trim_end_matches('/');
    if name.is_empty() {
        return MemoryTransport::new();
    }
    static BROKERS: OnceLock<Mutex<HashMap<String, MemoryTransport>>> = OnceLock::new();
    let mut brokers = BROKERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    brokers.entry(name.to_string()).or_default().clone()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use retry_core::event::Event;

    #[tokio::test]
    async fn memory_urls_share_by_name() {
        let a = connect("memory://shared").await.unwrap();
        let b = connect("memory://shared").await.unwrap();
        let lonely = connect("memory://").await.unwrap();
        assert_eq!(a.name(), "memory");
        a.publish("t", &Event::new("x")).await.unwrap();
        let spec = retry_core::transport::SubscriptionSpec {
            topic: "t".into(),
            group: "g".into(),
            consumer: "c".into(),
            ordered: false,
            max_in_flight: 1,
            max_deliveries: None,
            longest_delay: None,
        };
        let mut sub = b.subscribe(&spec).await.unwrap();
        assert!(
            sub.next().await.unwrap().is_some(),
            "same name, same broker"
        );
        let mut other = lonely.subscribe(&spec).await.unwrap();
        let nothing =
            tokio::time::timeout(std::time::Duration::from_millis(50), other.next()).await;
        assert!(nothing.is_err(), "memory:// alone is a fresh broker");
    }

    #[tokio::test]
    async fn missing_adapters_name_their_feature() {
        // With every adapter compiled in (the workspace build), only the checks below remain.
        let cases: Vec<(&str, &str)> = vec![
            #[cfg(not(feature = "kafka"))]
            ("kafka://127.0.0.1:9092", "`kafka` feature"),
            #[cfg(not(feature = "rabbitmq"))]
            ("amqp://127.0.0.1:5672", "`rabbitmq` feature"),
            #[cfg(not(feature = "sqs"))]
            ("sqs://local/orders", "`sqs` feature"),
            #[cfg(not(feature = "sqs"))]
            ("https://sqs.us-east-1.amazonaws.com/1/q", "`sqs` feature"),
            #[cfg(not(feature = "pulsar"))]
            ("pulsar://127.0.0.1:6650", "`pulsar` feature"),
        ];
        for (url, feature) in cases {
            let err = connect(url).await.err().unwrap();
            assert!(err.to_string().contains(feature), "{url}: {err}");
        }
        assert!(matches!(
            connect("nats://x").await.err().unwrap(),
            ConnectError::UnknownScheme { .. }
        ));
        assert!(matches!(
            connect("localhost:9092").await.err().unwrap(),
            ConnectError::InvalidUrl { .. }
        ));
    }
}
