//! The broker-independent core of event-retry: the event lifecycle, the retry-policy DSL, error
//! classification, the metadata codec, the consumer runtime, the producer, dead-letter operations, and the
//! in-memory transport.
//!
//! Services use it through the `event-retry` facade, which re-exports the user API and adds
//! `connect(url)` for the broker adapters compiled in. Adapter authors implement [`adapter`].
#![deny(missing_docs)]

pub mod adapter;
#[cfg(feature = "backoff")]
pub mod backoff_compat;
pub mod broker;
pub mod check;
pub mod classify;
pub mod config;
pub mod decide;
pub mod dlq;
pub mod error;
pub mod event;
pub mod headers;
pub mod idempotency;
pub mod layout;
pub mod lifecycle;
pub mod memory;
pub mod metadata;
pub mod options;
pub mod policy;
pub mod producer;
pub mod runtime;
pub mod secret;
pub mod telemetry;
pub mod time;
#[cfg(feature = "opentelemetry")]
pub mod trace_context;

/// The names a service needs, in one import.
pub mod prelude {
    pub use crate::broker::Broker;
    /// The old name of [`FailureKind`] (deprecated).
    #[allow(deprecated)]
    pub use crate::classify::ErrorKind;
    pub use crate::classify::{Classifier, FailureKind, HandlerError};
    pub use crate::config::RetryConfig;
    pub use crate::decide::Policies;
    pub use crate::dlq::{DeadLetter, DeadLetters, DlqFilter};
    pub use crate::event::Event;
    pub use crate::headers::Headers;
    pub use crate::idempotency::{IdempotencyStore, InMemoryIdempotencyStore};
    pub use crate::policy::RetryPolicy;
    pub use crate::producer::Producer;
    pub use crate::runtime::{
        App, BatchHandler, BatchItem, Consumer, ConsumerHandle, Context, Handler, ParkedAfterDead,
        batch_handler_fn, decode_json, handler_fn, json_handler,
    };
}
