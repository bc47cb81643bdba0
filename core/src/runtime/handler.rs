//! The handler API: what a service writes, once, for every broker.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;

use crate::classify::{FailureKind, HandlerError};
use crate::event::Event;
use crate::time::Timestamp;

/// What the runtime tells a handler about the current call.
///
/// The topic and event id are shared strings (`Arc<str>`, read like a `&str`): the runtime makes a
/// context per call and closures given to [`handler_fn`] take it by value, so copying it costs no
/// allocation.
///
/// A handler's unit test builds the context a broker would give it:
///
/// ```
/// use event_retry_core::runtime::Context;
///
/// let ctx = Context::new("orders", "order-7").with_attempt(3).with_retries(2);
/// assert_eq!((ctx.attempt, ctx.retries, &*ctx.topic), (3, 2, "orders"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Context {
    /// The topic or queue the consumer reads.
    pub topic: Arc<str>,
    /// The event id.
    pub event_id: Arc<str>,
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

impl Context {
    /// The context of a first delivery (attempt 1, no retries, not replayed) of event `event_id` on
    /// `topic`: what a handler's unit test starts from.
    pub fn new(topic: impl Into<Arc<str>>, event_id: impl Into<Arc<str>>) -> Self {
        Self {
            topic: topic.into(),
            event_id: event_id.into(),
            attempt: 1,
            retries: 0,
            due_at: None,
            lateness: None,
            replay_count: 0,
        }
    }

    /// The same context for call number `attempt` (1 for the first).
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// The same context after `retries` retries through the broker.
    pub fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The same context for a retry due at `due_at` that started `lateness` after it.
    pub fn with_due(mut self, due_at: Timestamp, lateness: Duration) -> Self {
        self.due_at = Some(due_at);
        self.lateness = Some(lateness);
        self
    }

    /// The same context for an event an operator replayed `replay_count` times.
    pub fn with_replay_count(mut self, replay_count: u32) -> Self {
        self.replay_count = replay_count;
        self
    }
}

/// A handler call that owns what it was given: what the runtime polls.
pub type HandlerCall = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'static>>;

/// Handles events. Return `Ok(())` on success; any error is classified (see [`crate::classify`]).
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles one event.
    async fn handle(&self, event: &Event, ctx: &Context) -> Result<(), HandlerError>;

    /// Starts a call that owns its event and context — what the runtime polls. A call owning its
    /// inputs can be polled first in the receive loop and, if it has to wait, go on in a task of its
    /// own: the runtime makes no future of its own per event for a call that is done at its first poll.
    /// The default calls [`Handler::handle`]; handlers made with [`handler_fn`] and [`json_handler`]
    /// call their closure directly (one allocation per call, the closure's future).
    fn call(self: Arc<Self>, event: Event, ctx: Context) -> HandlerCall {
        Box::pin(async move { self.handle(&event, &ctx).await })
    }
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

    fn call(self: Arc<Self>, event: Event, ctx: Context) -> HandlerCall {
        Box::pin((self.0)(event, ctx))
    }
}

/// A handler for JSON events: decodes the payload into `T` and calls an async closure with it; a payload
/// that does not decode is poison and goes to the DLQ at once, without calling the closure.
pub struct JsonHandler<T, F> {
    f: F,
    _payload: std::marker::PhantomData<fn() -> T>,
}

impl<T, F: Clone> Clone for JsonHandler<T, F> {
    fn clone(&self) -> Self {
        Self {
            f: self.f.clone(),
            _payload: std::marker::PhantomData,
        }
    }
}

impl<T, F> std::fmt::Debug for JsonHandler<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonHandler")
            .field("payload", &std::any::type_name::<T>())
            .finish()
    }
}

/// Wraps an async closure taking a decoded JSON payload and the context as a [`Handler`].
///
/// ```
/// use event_retry_core::runtime::{Context, json_handler};
///
/// #[derive(serde::Deserialize)]
/// struct Order { id: u64, quantity: i64 }
///
/// let handler = json_handler(|order: Order, _ctx: Context| async move {
///     if order.quantity < 1 {
///         return Err(event_retry_core::classify::HandlerError::non_retryable("quantity must be positive"));
///     }
///     Ok(())
/// });
/// # let _ = handler;
/// ```
pub fn json_handler<T, F, Fut>(f: F) -> JsonHandler<T, F>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(T, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    JsonHandler {
        f,
        _payload: std::marker::PhantomData,
    }
}

#[async_trait]
impl<T, F, Fut> Handler for JsonHandler<T, F>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(T, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, event: &Event, ctx: &Context) -> Result<(), HandlerError> {
        let value: T = decode_json(event)?;
        (self.f)(value, ctx.clone()).await
    }

    fn call(self: Arc<Self>, event: Event, ctx: Context) -> HandlerCall {
        match decode_json::<T>(&event) {
            Ok(value) => Box::pin((self.f)(value, ctx)),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
}

/// A context for unit tests of handlers and middleware: first attempt of event `e` on topic `t`.
#[cfg(test)]
pub(crate) fn test_context() -> Context {
    Context::new("t", "e")
}

/// The payload could not be decoded: the event is poison and goes to the DLQ at once, with this reason.
#[derive(Debug, thiserror::Error)]
#[error("undecodable payload: {0}")]
pub struct UndecodablePayload(pub String);

/// Decodes a JSON payload; failure is an [`UndecodablePayload`] error, dead-lettered as poison.
pub fn decode_json<T: DeserializeOwned>(event: &Event) -> Result<T, HandlerError> {
    serde_json::from_slice(&event.payload).map_err(|e| {
        HandlerError::new(FailureKind::NonRetryable, UndecodablePayload(e.to_string()))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn undecodable_json_is_non_retryable_poison() {
        let e = Event::new("{not json");
        let err = decode_json::<serde_json::Value>(&e).unwrap_err();
        assert_eq!(err.stated_kind(), Some(FailureKind::NonRetryable));
        assert!(crate::classify::chain(err.as_error()).any(|e| e.is::<UndecodablePayload>()));
        let ok: serde_json::Value = decode_json(&Event::new("{\"a\":1}")).unwrap();
        assert_eq!(ok["a"], 1);
    }

    #[tokio::test]
    async fn json_handlers_decode_or_refuse_as_poison() {
        #[derive(serde::Deserialize)]
        struct Order {
            id: u64,
        }
        let handler = json_handler(|order: Order, _ctx: Context| async move {
            if order.id == 7 {
                Ok(())
            } else {
                Err(HandlerError::deferred("not 7"))
            }
        });
        let ctx = test_context();
        assert!(
            handler
                .handle(&Event::new("{\"id\":7}"), &ctx)
                .await
                .is_ok()
        );
        let other = handler
            .handle(&Event::new("{\"id\":8}"), &ctx)
            .await
            .unwrap_err();
        assert_eq!(other.stated_kind(), Some(FailureKind::Deferred));
        let poison = handler
            .handle(&Event::new("[1,2]"), &ctx)
            .await
            .unwrap_err();
        assert!(crate::classify::chain(poison.as_error()).any(|e| e.is::<UndecodablePayload>()));
    }
}
