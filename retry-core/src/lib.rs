#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

#[cfg(feature = "backoff")]
pub mod backoff_compat;
pub mod check;
pub mod classify;
pub mod config;
pub mod decide;
pub mod dlq;
pub mod event;
pub mod idempotency;
pub mod lifecycle;
pub mod memory;
pub mod metadata;
pub mod policy;
pub mod runtime;
pub mod telemetry;
pub mod time;
pub mod transport;

/// The names a service needs, in one import.
pub mod prelude {
    pub use crate::classify::{Classifier, ErrorKind, HandlerError};
    pub use crate::config::RetryConfig;
    pub use crate::decide::Policies;
    pub use crate::dlq::{DeadLetter, DeadLetterQueue, DlqFilter};
    pub use crate::event::{Event, Headers};
    pub use crate::idempotency::{IdempotencyStore, InMemoryIdempotencyStore};
    pub use crate::memory::MemoryTransport;
    pub use crate::policy::RetryPolicy;
    pub use crate::runtime::{Consumer, ConsumerHandle, Context, Handler, decode_json, handler_fn};
    pub use crate::transport::{Capabilities, Transport};
}
