//! Handler state: what a handler needs from the service (a database pool, an HTTP client, a
//! configuration), given once when the handler is made and received as its first argument, [`State`].
//!
//! The same idea as axum's `State` extractor, for the three closure forms a handler takes: an event
//! ([`handler_fn_with_state`]), a decoded JSON payload ([`json_handler_with_state`]) and a batch
//! ([`batch_handler_fn_with_state`]). The state is cloned for each call, as axum does, so it is
//! something cheap to clone — a pool, an `Arc` — and each is the stateless form ([`handler_fn`],
//! [`json_handler`], [`batch_handler_fn`]) over a closure that hands the clone on: an ordinary
//! [`Handler`](super::Handler) or [`BatchHandler`](super::BatchHandler) that `tower` layers, the batch runtime and every broker take
//! unchanged. A handler written as a struct keeps its state in its fields and needs none of this.

use std::future::Future;
use std::ops::{Deref, DerefMut};

use serde::de::DeserializeOwned;

use super::batch::{BatchFnHandler, batch_handler_fn};
use super::handler::{Context, FnHandler, JsonHandler, handler_fn, json_handler};
use crate::classify::HandlerError;
use crate::event::Event;

/// The state a handler was made with, received as its first argument; derefs to the state.
///
/// ```
/// use event_retry_core::runtime::{Context, State, json_handler_with_state};
///
/// #[derive(Clone)]
/// struct Db { url: String }
///
/// #[derive(serde::Deserialize)]
/// struct Order { id: u64 }
///
/// async fn handle(State(db): State<Db>, order: Order, _ctx: Context)
///     -> Result<(), event_retry_core::classify::HandlerError> {
///     let _ = (db.url, order.id);
///     Ok(())
/// }
///
/// let handler = json_handler_with_state(Db { url: "postgres://…".into() }, handle);
/// # let _ = handler;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State<S>(pub S);

impl<S> Deref for State<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.0
    }
}

impl<S> DerefMut for State<S> {
    fn deref_mut(&mut self) -> &mut S {
        &mut self.0
    }
}

/// Wraps an async closure taking `State<S>`, the event and the context as a
/// [`Handler`](super::Handler) ([`handler_fn`] with state); each call receives a clone of `state`.
pub fn handler_fn_with_state<S, F, Fut>(
    state: S,
    f: F,
) -> FnHandler<impl Fn(Event, Context) -> Fut + Send + Sync + 'static>
where
    S: Clone + Send + Sync + 'static,
    F: Fn(State<S>, Event, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    handler_fn(move |event, ctx| f(State(state.clone()), event, ctx))
}

/// Wraps an async closure taking `State<S>`, a decoded JSON payload and the context as a
/// [`Handler`](super::Handler) ([`json_handler`] with state). A payload that does not decode is poison and goes to the
/// DLQ at once, without calling the closure.
pub fn json_handler_with_state<S, T, F, Fut>(
    state: S,
    f: F,
) -> JsonHandler<T, impl Fn(T, Context) -> Fut + Send + Sync + 'static>
where
    S: Clone + Send + Sync + 'static,
    T: DeserializeOwned + Send + 'static,
    F: Fn(State<S>, T, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    json_handler(move |value, ctx| f(State(state.clone()), value, ctx))
}

/// Wraps an async closure taking `State<S>` and the batch as `(event, context)` pairs as a
/// [`BatchHandler`](super::BatchHandler) ([`batch_handler_fn`] with state).
pub fn batch_handler_fn_with_state<S, F, Fut>(
    state: S,
    f: F,
) -> BatchFnHandler<impl Fn(Vec<(Event, Context)>) -> Fut + Send + Sync + 'static>
where
    S: Clone + Send + Sync + 'static,
    F: Fn(State<S>, Vec<(Event, Context)>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<Result<(), HandlerError>>> + Send + 'static,
{
    batch_handler_fn(move |batch| f(State(state.clone()), batch))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::classify::FailureKind;
    use crate::runtime::{BatchHandler, BatchItem, Handler};

    /// A stand-in for a pool: clones share one counter, as clones of a pool share its connections.
    #[derive(Clone, Default)]
    struct Pool(Arc<AtomicU32>);

    #[tokio::test]
    async fn every_form_receives_the_one_state_it_was_given() {
        let pool = Pool::default();
        let ctx = Context::new("orders", "e-1");
        let by_event = handler_fn_with_state(
            pool.clone(),
            |State(p): State<Pool>, e: Event, _| async move {
                p.0.fetch_add(1, Ordering::SeqCst);
                if e.payload.is_empty() {
                    return Err(HandlerError::non_retryable("empty"));
                }
                Ok(())
            },
        );
        by_event.handle(&Event::new("x"), &ctx).await.unwrap();
        let err = by_event.handle(&Event::new(""), &ctx).await.unwrap_err();
        assert_eq!(err.stated_kind(), Some(FailureKind::NonRetryable));
        Arc::new(by_event)
            .call(Event::new("y"), ctx.clone())
            .await
            .unwrap();

        #[derive(serde::Deserialize)]
        struct Order {
            n: u32,
        }
        let by_json = json_handler_with_state(
            pool.clone(),
            |State(p): State<Pool>, o: Order, _| async move {
                p.0.fetch_add(o.n, Ordering::SeqCst);
                Ok(())
            },
        );
        by_json
            .handle(&Event::new("{\"n\":10}"), &ctx)
            .await
            .unwrap();
        Arc::new(by_json)
            .call(Event::new("{\"n\":100}"), ctx.clone())
            .await
            .unwrap();

        let by_batch = batch_handler_fn_with_state(
            pool.clone(),
            |State(p): State<Pool>, batch: Vec<(Event, Context)>| async move {
                p.0.fetch_add(1000, Ordering::SeqCst);
                batch.iter().map(|_| Ok(())).collect()
            },
        );
        let (a, b) = (Event::new("a"), Event::new("b"));
        let items = [
            BatchItem {
                event: &a,
                ctx: ctx.clone(),
            },
            BatchItem {
                event: &b,
                ctx: ctx.clone(),
            },
        ];
        assert_eq!(by_batch.handle_batch(&items).await.len(), 2);
        // 3 event calls, 110 from the payloads, 1000 from the batch: all on the one pool.
        assert_eq!(pool.0.load(Ordering::SeqCst), 3 + 110 + 1000);
    }

    #[tokio::test]
    async fn an_undecodable_payload_never_reaches_a_stateful_json_handler() {
        let calls = Pool::default();
        let handler = json_handler_with_state(
            calls.clone(),
            |State(p): State<Pool>, _: u32, _| async move {
                p.0.fetch_add(1, Ordering::SeqCst);
                Ok(())
            },
        );
        let err = handler
            .handle(&Event::new("not json"), &Context::new("t", "e"))
            .await
            .unwrap_err();
        assert_eq!(err.stated_kind(), Some(FailureKind::NonRetryable));
        assert_eq!(calls.0.load(Ordering::SeqCst), 0);
    }
}
