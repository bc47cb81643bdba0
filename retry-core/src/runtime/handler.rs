//! The handler API: what a service writes, once, for every broker.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;

use crate::classify::{ErrorKind, HandlerError};
use crate::event::Event;
use crate::time::Timestamp;

/// What the runtime tells a handler about the current call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    /// The topic or queue the consumer reads.
    pub topic: String,
    /// The event id.
    pub event_id: String,
    /// This call's number, 1 for the first call.
    pub attempt: u32,
    /// Retries scheduled through the broker so far.
    pub retries: u32,
    /// When this delivery was due, for retries.
    pub due_at: Option<Timestamp>,
    /// How long after its due time this retry started.
    pub lateness: Option<Duration>,
    /// How many times an operator replayed the event.
    pub replay_count: u32,
}

/// Handles events. Return `Ok(())` on success; any error is classified (see [`crate::classify`]).
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles one event.
    async fn handle(&self, event: &Event, ctx: &Context) -> Result<(), HandlerError>;
}

/// A handler made from an async closure taking the event and context by value.
#[derive(Clone, Debug)]
pub struct FnHandler<F>(F);

/// Wraps an async closure as a [`Handler`].
pub fn handler_fn<F, Fut>(f: F) -> FnHandler<F>
where
    F: Fn(Event, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    FnHandler(f)
}

#[async_trait]
impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(Event, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, event: &Event, ctx: &Context) -> Result<(), HandlerError> {
        (self.0)(event.clone(), ctx.clone()).await
    }
}

/// The payload could not be decoded: the event is poison and goes to the DLQ at once, with this reason.
#[derive(Debug, thiserror::Error)]
#[error("undecodable payload: {0}")]
pub struct UndecodablePayload(pub String);

/// Decodes a JSON payload; failure is an [`UndecodablePayload`] error, dead-lettered as poison.
pub fn decode_json<T: DeserializeOwned>(event: &Event) -> Result<T, HandlerError> {
    serde_json::from_slice(&event.payload)
        .map_err(|e| HandlerError::new(ErrorKind::NonRetryable, UndecodablePayload(e.to_string())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn undecodable_json_is_non_retryable_poison() {
        let e = Event::new("{not json");
        let err = decode_json::<serde_json::Value>(&e).unwrap_err();
        assert_eq!(err.stated_kind(), Some(ErrorKind::NonRetryable));
        assert!(crate::classify::chain(err.as_error()).any(|e| e.is::<UndecodablePayload>()));
        let ok: serde_json::Value = decode_json(&Event::new("{\"a\":1}")).unwrap();
        assert_eq!(ok["a"], 1);
    }
}
