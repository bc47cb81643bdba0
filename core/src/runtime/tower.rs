//! Handlers as `tower` services, and `tower` layers around a consumer's handler (feature `tower`).
//!
//! A handler timeout, a concurrency limit, a rate limit or a tracing layer is middleware a service
//! already has for its HTTP stack; here it wraps the event handler the same way. The SDK's own parts stay
//! outside the layers: decoding, classification, idempotency and poison handling run around the layered
//! handler, so a layer's error (a timeout's `Elapsed`, a load shed) is classified like any other — by
//! type, with [`Classifier::on_type`](crate::classify::Classifier::on_type), or by message.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use event_retry_core::prelude::*;
//! use tower::timeout::TimeoutLayer;
//! use tower::limit::ConcurrencyLimitLayer;
//!
//! let broker = Broker::memory();
//! let handle = broker
//!     .consumer("orders")
//!     // A handler call that takes longer than 2 s fails as transient (retried in place, then later).
//!     .classifier(Classifier::new().on_type::<tower::timeout::error::Elapsed>(FailureKind::Transient))
//!     .layer(TimeoutLayer::new(Duration::from_secs(2)))
//!     .layer(ConcurrencyLimitLayer::new(4))
//!     .start(handler_fn(|_event: Event, _ctx: Context| async { Ok(()) }))
//!     .await?;
//! handle.shutdown().await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use async_trait::async_trait;
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};

use super::handler::{Context, Handler};
use crate::classify::{BoxError, HandlerError};
use crate::event::Event;

/// What a handler service is called with: the event and its context.
#[derive(Clone, Debug)]
pub struct Request {
    /// The event.
    pub event: Event,
    /// What the runtime knows about this call.
    pub context: Context,
}

/// A handler as a `tower` service, and the innermost service under a consumer's layers. Its error is a
/// boxed error that keeps the handler's stated kind.
#[derive(Clone)]
pub struct HandlerService(Arc<dyn Handler>);

impl std::fmt::Debug for HandlerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerService").finish_non_exhaustive()
    }
}

impl HandlerService {
    /// Wraps `handler`.
    pub fn new(handler: impl Handler) -> Self {
        Self(Arc::new(handler))
    }
}

impl Service<Request> for HandlerService {
    type Response = ();
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let handler = self.0.clone();
        Box::pin(async move {
            handler
                .handle(&request.event, &request.context)
                .await
                .map_err(HandlerError::into_boxed)
        })
    }
}

pub(crate) type Boxed = BoxCloneSyncService<Request, (), BoxError>;

/// A `tower` service as a [`Handler`]: each event is a call (on a clone of the service, so calls run
/// concurrently); the service's error is classified like a handler's.
#[derive(Clone)]
pub struct ServiceHandler(Boxed);

impl std::fmt::Debug for ServiceHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceHandler").finish_non_exhaustive()
    }
}

/// Uses `service` as a handler.
pub fn service_handler<S>(service: S) -> ServiceHandler
where
    S: Service<Request, Response = ()> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    ServiceHandler(BoxCloneSyncService::new(service.map_err(Into::into)))
}

#[async_trait]
impl Handler for ServiceHandler {
    async fn handle(&self, event: &Event, ctx: &Context) -> Result<(), HandlerError> {
        let request = Request {
            event: event.clone(),
            context: ctx.clone(),
        };
        self.0
            .clone()
            .oneshot(request)
            .await
            .map_err(HandlerError::unclassified)
    }
}

type ApplyLayer = Box<dyn FnOnce(Boxed) -> Boxed + Send>;

/// The layers a consumer builder collected, applied when it starts.
#[derive(Default)]
pub(crate) struct Layers(Vec<ApplyLayer>);

impl Layers {
    /// Adds `layer`, inside the layers added before it.
    pub(crate) fn push<L>(&mut self, layer: L)
    where
        L: Layer<Boxed> + Send + 'static,
        L::Service: Service<Request, Response = ()> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request>>::Error: Into<BoxError>,
        <L::Service as Service<Request>>::Future: Send + 'static,
    {
        self.0.push(Box::new(move |inner: Boxed| {
            BoxCloneSyncService::new(layer.layer(inner).map_err(Into::into))
        }));
    }

    /// Whether no layer was added.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Wraps `handler` in the layers, the first added outermost (as `tower::ServiceBuilder` does).
    pub(crate) fn apply(self, handler: Arc<dyn Handler>) -> Arc<dyn Handler> {
        if self.0.is_empty() {
            return handler;
        }
        let mut service: Boxed = BoxCloneSyncService::new(HandlerService(handler));
        for apply in self.0.into_iter().rev() {
            service = apply(service);
        }
        Arc::new(ServiceHandler(service))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::classify::{Classifier, FailureKind};
    use crate::runtime::handler_fn;

    fn ctx() -> Context {
        crate::runtime::handler::test_context()
    }

    #[tokio::test]
    async fn a_timeout_layer_fails_a_slow_handler_and_the_classifier_sees_its_type() {
        let slow = handler_fn(|_e: Event, _c: Context| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(())
        });
        let mut layers = Layers::default();
        let layer = tower::timeout::TimeoutLayer::new(Duration::from_millis(20));
        layers.0.push(Box::new(move |inner: Boxed| {
            BoxCloneSyncService::new(layer.layer(inner).map_err(Into::<BoxError>::into))
        }));
        let handler = layers.apply(Arc::new(slow));
        let err = handler.handle(&Event::new("x"), &ctx()).await.unwrap_err();
        let kind = Classifier::new()
            .on_type::<tower::timeout::error::Elapsed>(FailureKind::Transient)
            .classify(&err);
        assert_eq!(kind, FailureKind::Transient);
    }

    #[tokio::test]
    async fn a_stated_kind_survives_the_layers() {
        let failing = handler_fn(|_e: Event, _c: Context| async {
            Err(HandlerError::non_retryable("bad order"))
        });
        let mut layers = Layers::default();
        layers.0.push(Box::new(|inner: Boxed| {
            BoxCloneSyncService::new(tower::limit::ConcurrencyLimitLayer::new(2).layer(inner))
        }));
        let handler = layers.apply(Arc::new(failing));
        let err = handler.handle(&Event::new("x"), &ctx()).await.unwrap_err();
        assert_eq!(err.stated_kind(), Some(FailureKind::NonRetryable));
        assert_eq!(err.message(), "bad order");
    }

    #[tokio::test]
    async fn a_service_is_a_handler() {
        let service = tower::service_fn(|r: Request| async move {
            if r.event.payload.as_ref() == b"ok" {
                Ok(())
            } else {
                Err(BoxError::from("not ok"))
            }
        });
        let handler = service_handler(service);
        assert!(handler.handle(&Event::new("ok"), &ctx()).await.is_ok());
        let err = handler.handle(&Event::new("no"), &ctx()).await.unwrap_err();
        assert_eq!(err.message(), "not ok");
    }

    #[tokio::test]
    async fn a_batch_handler_with_layers_is_refused_at_start() {
        let refused = crate::broker::Broker::memory()
            .consumer("layered")
            .layer(tower::limit::ConcurrencyLimitLayer::new(2))
            .start_batch(crate::runtime::batch_handler_fn(
                |batch: Vec<(Event, Context)>| async move { batch.iter().map(|_| Ok(())).collect() },
            ))
            .await;
        match refused {
            Err(crate::runtime::ConsumerError::Invalid(why)) => {
                assert!(why.contains("tower layers"), "{why}");
            }
            Err(other) => panic!("refused for another reason: {other}"),
            Ok(_) => panic!("a batch handler started under tower layers"),
        }
    }
}
