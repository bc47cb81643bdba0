//! Event consumers that survive failure, on Kafka, RabbitMQ, Amazon SQS and Apache Pulsar, with one
//! handler API.
//!
//! You write a handler. event-retry delivers each event to it and, when it fails, decides from a retry
//! policy and an error classification whether to retry in place, retry later through the broker's own
//! delay mechanism, pause consumption until a dependency heals, or move the event to a dead letter queue
//! with full diagnostics. Nothing is acknowledged before its retry or DLQ copy is durably accepted.
//!
//! # A tour
//!
//! **Connect** to a broker by URL; the adapter is a cargo feature (`kafka`, `rabbitmq`, `sqs`, `pulsar`),
//! and `memory://` is an in-process broker that needs none. Adapter settings come from the URL's query,
//! from [`config::Options`], or from the `[broker]` section of the config file, so moving a service between
//! brokers is configuration only.
//!
//! ```
//! # async fn demo() -> Result<(), event_retry::Error> {
//! let broker = event_retry::connect("memory://shop").await?;
//! // e.g. "kafka://127.0.0.1:9092?granularity=100ms", "amqp://app@mq:5672/%2f?queue_type=quorum"
//! # let _ = broker;
//! # Ok(()) }
//! ```
//!
//! **Handle** events with an async function. Return an error to have the event retried or
//! dead-lettered; say which kind of failure it is, or let a [`Classifier`] decide from its type and
//! message.
//!
//! ```
//! use event_retry::prelude::*;
//!
//! #[derive(serde::Deserialize)]
//! struct Order {
//!     id: u64,
//!     quantity: i64,
//! }
//!
//! async fn handle_order(order: Order, ctx: Context) -> Result<(), HandlerError> {
//!     if order.quantity < 1 {
//!         // Will fail again: straight to the DLQ.
//!         return Err(HandlerError::non_retryable(format!("order {} has no quantity", order.id)));
//!     }
//!     if ctx.attempt == 1 && order.id % 5 == 0 {
//!         // Only this event must wait: retried later through the broker.
//!         return Err(HandlerError::deferred("stock not replicated yet"));
//!     }
//!     Ok(())
//! }
//! # let _ = json_handler(handle_order);
//! ```
//!
//! **Consume** with a retry policy written in one string (`"5s x3, 30s x2"`, `"exp(1s, 10m, 2, 8)"`);
//! a policy the broker cannot honour is refused when the consumer is built. **Publish** with a
//! [`Producer`]: every event gets an id to deduplicate on, and no producer can forge retry metadata.
//!
//! ```
//! use event_retry::prelude::*;
//! # #[derive(serde::Deserialize)] struct Order { id: u64 }
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = event_retry::connect("memory://tour").await?;
//! let handle = broker
//!     .consumer("orders")
//!     .policy(RetryPolicy::parse("50ms x3")?)
//!     .concurrency(16)
//!     .start(json_handler(|order: Order, _ctx: Context| async move {
//!         println!("order {}", order.id);
//!         Ok(())
//!     }))
//!     .await?;
//!
//! broker.producer().publish_json("orders", &serde_json::json!({ "id": 1 })).await?;
//!
//! // Wait for the outcome without polling, then drain and stop.
//! handle.wait_until(|stats| stats.succeeded == 1).await;
//! handle.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! **Run a service**: several consumers under one [`App`], stopped together on SIGTERM or ctrl-c with a
//! graceful drain (in-flight handlers finish within a grace period; the rest is released to the broker).
//!
//! ```no_run
//! use event_retry::prelude::*;
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = event_retry::connect("kafka://127.0.0.1:9092").await?;
//! App::new()
//!     .consumer(
//!         broker.consumer("orders").policy(RetryPolicy::parse("5s x3, 1m x5")?),
//!         handler_fn(|_event: Event, _ctx: Context| async { Ok(()) }),
//!     )
//!     .consumer(
//!         broker.consumer("payments").ordered_by_key(ParkedAfterDead::FollowToDlq),
//!         handler_fn(|_event: Event, _ctx: Context| async { Ok(()) }),
//!     )
//!     .run_until(event_retry::shutdown_signal())
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! **Triage the DLQ**: list with filters, show, replay to the origin (payload unedited, attempts
//! restarted, replay count raised, the entry removed only after the broker confirmed the copy), purge —
//! the same on every broker. `retryctl dlq` is the same as a command.
//!
//! ```
//! use event_retry::prelude::*;
//! # async fn demo(broker: Broker) -> Result<(), event_retry::Error> {
//! let dlq = broker.dead_letters();
//! for entry in dlq.list("orders", &DlqFilter::all()).await? {
//!     let meta = entry.event.metadata();
//!     println!("{}: {:?} after {} attempts", entry.id, meta.last_error, meta.attempts);
//! }
//! let report = dlq.replay("orders", &DlqFilter::all()).await?;
//! println!("replayed {}", report.replayed);
//! # Ok(()) }
//! ```
//!
//! Policies and classification rules can also come from one TOML file, globally and per topic
//! ([`config`]); handlers compose with `tower` layers behind the `tower` feature ([`tower`]).
//!
//! # Writing an adapter
//!
//! The contract a broker adapter implements is `event_retry_core::adapter`, in the core crate: nothing a
//! service needs lives there. [`register_scheme`] makes an adapter built outside this crate reachable
//! through [`connect`].
#![deny(missing_docs)]
// On docs.rs, every feature-gated item names its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::sync::Arc;

/// The attribute for `impl Handler for …` and `impl BatchHandler for …` (the traits' methods are
/// `async`): the `async_trait` crate's, re-exported so a service needs no dependency of its own.
pub use async_trait::async_trait;
pub use event_retry_core::broker::Broker;
pub use event_retry_core::classify::{Classifier, FailureKind, HandlerError};
pub use event_retry_core::dlq::{DeadLetter, DeadLetters, DlqFilter, ReplayReport};
pub use event_retry_core::error::Error;
pub use event_retry_core::event::Event;
pub use event_retry_core::headers::Headers;
pub use event_retry_core::policy::RetryPolicy;
pub use event_retry_core::producer::Producer;
pub use event_retry_core::runtime::{
    App, BatchHandler, BatchItem, ConsumerBuilder, Context, Handler, State, batch_handler_fn,
    batch_handler_fn_with_state, handler_fn, handler_fn_with_state, json_handler,
    json_handler_with_state, shutdown_signal,
};

/// A running consumer: its handle, counters and health, and what stops it.
pub mod consumer {
    pub use event_retry_core::runtime::{
        AppError, AppHealth, Consumer, ConsumerError, ConsumerHandle, Health, HealthWatch,
        ParkedAfterDead, Shutdown, Stats, decode_json,
    };
}

/// Configuration: the config file, a broker's options, and a policy per topic.
pub mod config {
    pub use event_retry_core::config::RetryConfig;
    pub use event_retry_core::options::Options;
    pub use event_retry_core::policy::Policies;
}

/// Skipping an event the handler already handled, so that at-least-once delivery does not repeat a
/// side effect.
pub mod idempotency {
    pub use event_retry_core::idempotency::{IdempotencyStore, InMemoryIdempotencyStore};
}

/// What an [`Error`] is about: the kinds a caller matches on.
pub mod error {
    pub use event_retry_core::error::{Error, Kind};
}

/// Handlers as `tower` services, and `tower` layers around a consumer's handler (feature `tower`).
#[cfg(feature = "tower")]
pub use event_retry_core::runtime::tower;

#[cfg(feature = "prometheus")]
pub mod prometheus;

#[cfg(feature = "health")]
pub mod health;

/// W3C trace context across every hop (feature `opentelemetry`): publish, each attempt, replay.
#[cfg(feature = "opentelemetry")]
pub use event_retry_core::trace_context;

/// Lets a retry policy drive `backoff::backoff::Backoff` (feature `backoff`; the crate is unmaintained).
#[cfg(feature = "backoff")]
pub use event_retry_core::backoff_compat;

/// The names a service needs, in one import.
pub mod prelude {
    pub use crate::config::{Policies, RetryConfig};
    pub use crate::consumer::{Consumer, ConsumerHandle, ParkedAfterDead, decode_json};
    pub use crate::idempotency::{IdempotencyStore, InMemoryIdempotencyStore};
    pub use crate::{
        App, BatchHandler, BatchItem, Broker, Classifier, Context, DeadLetter, DeadLetters,
        DlqFilter, Event, FailureKind, Handler, HandlerError, Headers, Producer, RetryPolicy,
        State, async_trait, batch_handler_fn, batch_handler_fn_with_state, handler_fn,
        handler_fn_with_state, json_handler, json_handler_with_state,
    };
}

use event_retry_core::adapter::Scheme;
use event_retry_core::config::RetryConfig;
use event_retry_core::error::Kind;
use event_retry_core::options::Options;
use event_retry_core::options::redact_url;

/// The schemes of the adapters compiled into this build.
fn compiled_schemes() -> Vec<Scheme> {
    vec![
        event_retry_core::memory::SCHEME,
        #[cfg(feature = "kafka")]
        event_retry_kafka::SCHEME,
        #[cfg(feature = "rabbitmq")]
        event_retry_rabbitmq::SCHEME,
        #[cfg(feature = "sqs")]
        event_retry_sqs::SCHEME,
        #[cfg(feature = "pulsar")]
        event_retry_pulsar::SCHEME,
    ]
}

/// The schemes adapters outside this crate registered with [`register_scheme`].
static REGISTERED: std::sync::RwLock<Vec<Scheme>> = std::sync::RwLock::new(Vec::new());

/// Makes an adapter built outside this crate reachable through [`connect`]: its URL schemes connect
/// with its `connect` function. A registered scheme is tried before the built-in ones, so a service can
/// also put its own build of an adapter in place of one compiled in.
///
/// ```
/// use event_retry_core::adapter::{Error, Kind, Scheme};
///
/// // An adapter crate exports its entry; the service registers it once at start-up.
/// const MY_BROKER: Scheme = Scheme::new(&["mybroker"], "My broker", |url, _options| {
///     // A real adapter connects here and returns its transport.
///     Box::pin(async move { Err(Error::new(Kind::Connection, format!("no server at {url}"))) })
/// });
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let before = event_retry::connect("mybroker://host:1234").await.unwrap_err();
/// assert_eq!(before.kind(), Kind::Config); // an unknown scheme
/// event_retry::register_scheme(MY_BROKER);
/// let after = event_retry::connect("mybroker://host:1234").await.unwrap_err();
/// assert_eq!(after.kind(), Kind::Connection); // the adapter's own connect ran
/// assert!(after.to_string().starts_with("connect to My broker at mybroker://host:1234"), "{after}");
/// # }
/// ```
pub fn register_scheme(scheme: Scheme) {
    let mut registered = REGISTERED
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    registered.retain(|r| !r.schemes.iter().any(|s| scheme.serves(s)));
    registered.push(scheme);
}

/// Every scheme `connect` can serve in this process: registered ones first, then those compiled in.
fn schemes() -> Vec<Scheme> {
    let registered = REGISTERED
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    registered
        .iter()
        .copied()
        .chain(compiled_schemes())
        .collect()
}

/// Every adapter of this crate, compiled in or not: its schemes, broker and cargo feature.
const ADAPTERS: [(&[&str], &str, &str); 4] = [
    (&["kafka"], "Apache Kafka", "kafka"),
    (&["amqp", "amqps"], "RabbitMQ", "rabbitmq"),
    (&["sqs", "https", "http"], "Amazon SQS", "sqs"),
    (&["pulsar", "pulsar+ssl"], "Apache Pulsar", "pulsar"),
];

/// The schemes known to this build, for error messages: `memory, kafka, amqp, …`.
fn known_schemes() -> String {
    let mut known: Vec<&str> = schemes()
        .iter()
        .flat_map(|s| s.schemes.iter().copied())
        .collect();
    for (names, _, _) in ADAPTERS {
        known.extend(
            names
                .iter()
                .filter(|n| !known.contains(n))
                .collect::<Vec<_>>(),
        );
    }
    known.join(", ")
}

/// Connects to the broker a URL names, with the adapter's default settings (or those in the URL's query).
///
/// * `memory://` — a new in-process broker; `memory://name` — the in-process broker called `name`, shared
///   by every `connect` of the same URL in this process (so a producer and a consumer meet).
/// * `kafka://host:port[,host:port…]` — Apache Kafka (feature `kafka`).
/// * `amqp://user:pass@host:port/vhost` or `amqps://…` — RabbitMQ (feature `rabbitmq`).
/// * `sqs://` (AWS; region and credentials from the environment), `http://127.0.0.1:9324` (an
///   SQS-compatible endpoint on this machine) or an `https://` SQS queue URL — Amazon SQS (feature `sqs`).
/// * `pulsar://host:6650` or `pulsar+ssl://…` — Apache Pulsar (feature `pulsar`).
///
/// Query parameters are the adapter's settings (`kafka://h:9092?granularity=100ms&partitions=4`); each
/// adapter's README lists them, and an unknown one is an error. Without an adapter's feature, its URLs
/// give an error of kind [`Unsupported`](error::Kind::Unsupported) naming the feature to enable.
pub async fn connect(url: &str) -> Result<Broker, Error> {
    connect_with(url, Options::new()).await
}

/// Connects like [`connect`], with adapter settings that override those in the URL's query.
///
/// ```
/// # async fn demo() -> Result<(), event_retry::Error> {
/// use event_retry::config::Options;
///
/// let err = event_retry::connect_with("memory://", Options::new().set("granularty", "1s"))
///     .await
///     .unwrap_err();
/// assert_eq!(err.kind(), event_retry::error::Kind::Config); // a typo is an error, not ignored
/// # Ok(()) }
/// ```
pub async fn connect_with(url: &str, options: Options) -> Result<Broker, Error> {
    let (scheme, _) = url.split_once("://").ok_or_else(|| {
        Error::new(
            Kind::Config,
            format!(
                "{:?} is not a broker URL: expected scheme://... with one of the schemes {}",
                redact_url(url),
                known_schemes()
            ),
        )
    })?;
    let scheme = scheme.to_ascii_lowercase();
    let (base, mut merged) = Options::split_url(url)?;
    merged.extend(options);
    if let Some(entry) = schemes().into_iter().find(|s| s.serves(&scheme)) {
        let operation = format!("connect to {} at {}", entry.broker, redact_url(&base));
        let transport: Arc<dyn event_retry_core::adapter::Transport> =
            (entry.connect)(base, merged)
                .await
                .map_err(|e| e.with_operation(operation))?;
        return Ok(Broker::from(transport));
    }
    match ADAPTERS
        .iter()
        .find(|(schemes, _, _)| schemes.contains(&scheme.as_str()))
    {
        Some((_, broker, feature)) => Err(Error::new(
            Kind::Unsupported,
            format!(
                "{scheme}:// needs the {broker} adapter, which this build does not include: enable the \
                 `{feature}` feature of event-retry"
            ),
        )),
        None => Err(Error::new(
            Kind::Config,
            format!(
                "unknown broker URL scheme {scheme:?}: expected one of {}",
                known_schemes()
            ),
        )),
    }
}

/// Connects to the broker the config file's `[broker]` section names, with its options.
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let config = event_retry::config::RetryConfig::from_toml(
///     "[default]\npolicy = \"5s x3\"\n\n[broker]\nurl = \"memory://svc\"\n",
/// )?;
/// let broker = event_retry::connect_config(&config).await?;
/// assert_eq!(broker.name(), "memory");
/// # Ok(()) }
/// ```
pub async fn connect_config(config: &RetryConfig) -> Result<Broker, Error> {
    let section = config.broker.as_ref().ok_or_else(|| {
        Error::new(
            Kind::Config,
            "the config file has no [broker] section (url = \"kafka://…\", options = { … })",
        )
    })?;
    connect_with(&section.url, section.to_options()).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_urls_share_by_name() {
        let a = connect("memory://shared").await.unwrap();
        let b = connect("memory://shared").await.unwrap();
        assert_eq!(a.name(), "memory");
        let handle = b
            .consumer("t")
            .start(handler_fn(|_e: Event, _c: Context| async { Ok(()) }))
            .await
            .unwrap();
        a.producer().publish("t", Event::new("x")).await.unwrap();
        let stats = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            handle.wait_until(|s| s.succeeded == 1),
        )
        .await
        .unwrap();
        assert_eq!(stats.succeeded, 1, "same name, same broker");
        handle.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn options_reach_the_adapter_and_typos_are_errors() {
        let err = connect("memory://?unknown=1").await.unwrap_err();
        assert_eq!(err.kind(), Kind::Config);
        assert!(err.to_string().contains("unknown"), "{err}");
        assert!(err.to_string().starts_with("connect to in-memory"), "{err}");
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
            assert_eq!(err.kind(), Kind::Unsupported, "{url}");
            assert!(err.to_string().contains(feature), "{url}: {err}");
        }
        assert_eq!(
            connect("nats://x").await.err().unwrap().kind(),
            Kind::Config
        );
        let bare = connect("localhost:9092").await.err().unwrap();
        assert_eq!(bare.kind(), Kind::Config);
        assert!(bare.to_string().contains("not a broker URL"), "{bare}");
        let secret = connect("nats://user:hunter2@x").await.err().unwrap();
        assert!(!secret.to_string().contains("hunter2"), "{secret}");
    }
}

/// The README's Rust examples, compiled (and run, where not `no_run`) by `cargo test --doc`, so that the
/// code people copy from it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
