//! The broker-independent core of event-retry: the event lifecycle, the retry-policy DSL, error
//! classification, the metadata codec, the consumer runtime, the producer, dead-letter operations, and the
//! in-memory transport.
//!
//! Services use it through the `event-retry` facade, which re-exports the user API and adds
//! `connect(url)` for the broker adapters compiled in. Adapter authors implement [`adapter`].
#![deny(missing_docs)]
// On docs.rs, every feature-gated item names its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

// What a service writes against (the `event-retry` facade re-exports the parts it needs).
pub mod broker;
pub mod classify;
pub mod config;
pub mod dlq;
pub mod error;
pub mod event;
pub mod headers;
pub mod idempotency;
pub mod options;
pub mod policy;
pub mod producer;
pub mod runtime;
pub mod time;

// Optional integrations.
#[cfg(feature = "backoff")]
pub mod backoff_compat;
#[cfg(feature = "opentelemetry")]
pub mod trace_context;

// What an adapter implements.
pub mod adapter;

// Internals the adapters, the operator tools and the test kit share with the runtime: public so that
// crates of this workspace can reach them, hidden from the docs because no service should.
#[doc(hidden)]
pub mod check;
#[doc(hidden)]
pub mod decide;
#[doc(hidden)]
pub mod layout;
#[doc(hidden)]
pub mod lifecycle;
#[doc(hidden)]
pub mod memory;
#[doc(hidden)]
pub mod metadata;
#[doc(hidden)]
pub mod secret;
#[doc(hidden)]
pub mod telemetry;

/// The names a service needs, in one import.
pub mod prelude {
    pub use crate::broker::Broker;
    pub use crate::classify::{Classifier, FailureKind, HandlerError};
    pub use crate::config::RetryConfig;
    pub use crate::dlq::{DeadLetter, DeadLetters, DlqFilter};
    pub use crate::event::Event;
    pub use crate::headers::Headers;
    pub use crate::idempotency::{IdempotencyStore, InMemoryIdempotencyStore};
    pub use crate::policy::{Policies, RetryPolicy};
    pub use crate::producer::Producer;
    pub use crate::runtime::{
        App, BatchHandler, BatchItem, Consumer, ConsumerHandle, Context, Handler, ParkedAfterDead,
        State, batch_handler_fn, batch_handler_fn_with_state, decode_json, handler_fn,
        handler_fn_with_state, json_handler, json_handler_with_state,
    };
    pub use async_trait::async_trait;
}
