//! The batch handler API: a handler called once for the events a subscription has at hand, for
//! consumers whose cost is per call rather than per event (a bulk insert, one request for many rows).
//!
//! What a batch changes is the call, not an event's fate: every event still has its own lifecycle,
//! classification and route. The runtime decodes each delivery, claims its idempotency key, calls the
//! handler once with the batch, then settles each event by its own result — an acknowledgement, an
//! in-place retry, a retry through the broker, a hold or a dead letter, exactly as a per-event handler's
//! result would. An in-place retry or a held event calls the handler again with a batch of that one
//! event. A handler that returns fewer results than events fails the events it left out (they take the
//! retry route, unclassified); one that panics fails them all.
//!
//! A batch is what the subscription has at hand when the runtime takes a delivery
//! (`Subscription::next_ready`: records fetched together on Kafka, what RabbitMQ's and Pulsar's
//! consumers and the in-memory transport already hold; SQS hands deliveries over one at a time) — up to
//! the consumer's batch size and never waiting for more: a batch handler adds no latency to a quiet topic.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use super::handler::{Context, Handler};
use crate::classify::HandlerError;
use crate::event::Event;

/// One event of a batch, with its call's context.
#[derive(Clone, Debug)]
pub struct BatchItem<'a> {
    /// The event.
    pub event: &'a Event,
    /// What the runtime tells the handler about this event's call.
    pub ctx: Context,
}

/// Handles events a batch at a time: one result per event, in the batch's order.
///
/// ```
/// use event_retry_core::classify::HandlerError;
/// use event_retry_core::runtime::{BatchHandler, BatchItem};
///
/// struct BulkInsert;
///
/// #[async_trait::async_trait]
/// impl BatchHandler for BulkInsert {
///     async fn handle_batch(&self, batch: &[BatchItem<'_>]) -> Vec<Result<(), HandlerError>> {
///         // One statement for the batch; here, every payload that is not empty succeeds.
///         batch
///             .iter()
///             .map(|item| match item.event.payload.is_empty() {
///                 false => Ok(()),
///                 true => Err(HandlerError::non_retryable("empty payload")),
///             })
///             .collect()
///     }
/// }
/// ```
#[async_trait]
pub trait BatchHandler: Send + Sync + 'static {
    /// Handles `batch` (never empty); the result at index `i` is the outcome of `batch[i]`.
    async fn handle_batch(&self, batch: &[BatchItem<'_>]) -> Vec<Result<(), HandlerError>>;
}

/// A batch handler made from an async closure taking the batch's events and contexts by value.
#[derive(Clone, Debug)]
pub struct BatchFnHandler<F>(F);

/// Wraps an async closure as a [`BatchHandler`]: it receives the batch as `(event, context)` pairs
/// (each event cloned: its payload is shared, not copied) and returns one result per pair.
///
/// ```
/// use event_retry_core::event::Event;
/// use event_retry_core::runtime::{Context, batch_handler_fn};
///
/// let handler = batch_handler_fn(|batch: Vec<(Event, Context)>| async move {
///     batch.iter().map(|_| Ok(())).collect()
/// });
/// # let _ = handler;
/// ```
pub fn batch_handler_fn<F, Fut>(f: F) -> BatchFnHandler<F>
where
    F: Fn(Vec<(Event, Context)>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<Result<(), HandlerError>>> + Send + 'static,
{
    BatchFnHandler(f)
}

#[async_trait]
impl<F, Fut> BatchHandler for BatchFnHandler<F>
where
    F: Fn(Vec<(Event, Context)>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<Result<(), HandlerError>>> + Send + 'static,
{
    async fn handle_batch(&self, batch: &[BatchItem<'_>]) -> Vec<Result<(), HandlerError>> {
        let owned = batch
            .iter()
            .map(|item| (item.event.clone(), item.ctx.clone()))
            .collect();
        (self.0)(owned).await
    }
}

/// A batch handler called with one event: how the runtime calls it again for an in-place retry or a
/// held event.
pub(super) struct OneAtATime(pub(super) Arc<dyn BatchHandler>);

#[async_trait]
impl Handler for OneAtATime {
    async fn handle(&self, event: &Event, ctx: &Context) -> Result<(), HandlerError> {
        let item = BatchItem {
            event,
            ctx: ctx.clone(),
        };
        let mut results = self.0.handle_batch(std::slice::from_ref(&item)).await;
        one_per_event(&mut results, 1);
        results.into_iter().next().unwrap_or_else(|| {
            Err(HandlerError::unclassified(
                "the batch handler returned nothing",
            ))
        })
    }
}

/// Makes `results` exactly `events` long: a result the handler left out is an unclassified failure of
/// its event (it takes the retry route); results beyond the batch are dropped, with a warning.
pub(super) fn one_per_event(results: &mut Vec<Result<(), HandlerError>>, events: usize) {
    let returned = results.len();
    if returned == events {
        return;
    }
    tracing::warn!(
        returned,
        events,
        "the batch handler did not return one result per event"
    );
    results.truncate(events);
    results.resize_with(events, || {
        Err(HandlerError::unclassified(format!(
            "the batch handler returned {returned} results for {events} events"
        )))
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::runtime::handler::test_context;

    #[test]
    fn missing_results_fail_their_events_and_extra_ones_are_dropped() {
        let mut short = vec![Ok(())];
        one_per_event(&mut short, 3);
        assert_eq!(short.len(), 3);
        assert!(short[0].is_ok());
        for missing in &short[1..] {
            let e = missing.as_ref().unwrap_err();
            assert_eq!(e.stated_kind(), None, "the classifier decides its kind");
            assert!(e.message().contains("returned 1 results for 3 events"));
        }
        let mut long = vec![Ok(()), Err(HandlerError::deferred("x")), Ok(())];
        one_per_event(&mut long, 2);
        assert_eq!(long.len(), 2);
        assert!(long[1].is_err());
    }

    #[tokio::test]
    async fn one_at_a_time_calls_the_batch_handler_with_that_event() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handler = batch_handler_fn({
            let seen = seen.clone();
            move |batch: Vec<(Event, Context)>| {
                seen.lock().unwrap().push(batch.len());
                async move {
                    batch
                        .iter()
                        .map(|(e, _)| match &e.payload[..] {
                            b"ok" => Ok(()),
                            _ => Err(HandlerError::deferred("not ok")),
                        })
                        .collect()
                }
            }
        });
        let one = OneAtATime(Arc::new(handler));
        let ctx = test_context();
        assert!(one.handle(&Event::new("ok"), &ctx).await.is_ok());
        assert!(one.handle(&Event::new("no"), &ctx).await.is_err());
        assert_eq!(*seen.lock().unwrap(), vec![1, 1]);
    }

    #[tokio::test]
    async fn one_at_a_time_fails_an_event_the_handler_returned_nothing_for() {
        let handler = batch_handler_fn(|_batch: Vec<(Event, Context)>| async { Vec::new() });
        let err = OneAtATime(Arc::new(handler))
            .handle(&Event::new("x"), &test_context())
            .await
            .unwrap_err();
        assert!(err.message().contains("returned 0 results for 1 events"));
    }
}
