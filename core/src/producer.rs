//! Publishing events: the producer side of a service.
//!
//! A producer sends new events. It gives each one an event id when it has none (the id consumers
//! deduplicate on), and it never publishes retry metadata: the SDK's bookkeeping (`x-retry-*`) starts
//! fresh with every published event, so a producer cannot forge an attempt count or a due time, and an
//! event forwarded from a handler starts a history of its own. A producer header in the SDK's namespace is
//! refused with an error rather than silently dropped.

use std::sync::Arc;

use serde::Serialize;

use crate::adapter::{Published, Transport};
use crate::error::{Error, Kind};
use crate::event::Event;
use crate::metadata::{PACKED, PREFIX, RetryMetadata};

/// Publishes events to a broker. Cheap to clone.
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use event_retry_core::broker::Broker;
/// use event_retry_core::event::Event;
///
/// let producer = Broker::memory().producer();
/// let sent = producer
///     .publish("orders", Event::new("{\"id\":7}").with_id("order-7").with_key("customer-3"))
///     .await?;
/// assert_eq!(sent.event_id, "order-7");
/// let batch = producer
///     .publish_batch("orders", [Event::new("a"), Event::new("b")])
///     .await?;
/// assert_eq!(batch.len(), 2);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Producer {
    transport: Arc<dyn Transport>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("broker", &self.transport.name())
            .finish()
    }
}

impl Producer {
    /// A producer over `transport`.
    pub fn new(transport: Arc<dyn Transport>) -> Self {
        Self { transport }
    }

    /// Publishes `event` to `topic` and returns once the broker confirmed it, with where it landed.
    ///
    /// With the `opentelemetry` feature, called inside a span of an OpenTelemetry trace, it sends the
    /// event in a `publish` span whose context the event carries (see [`crate::trace_context`]).
    pub async fn publish(&self, topic: &str, event: Event) -> Result<Published, Error> {
        #[allow(unused_mut)]
        let mut event = prepare(topic, event)?;
        let id = event.id().unwrap_or_default().to_string();
        // The publish span, its context written into the event (none outside a trace).
        #[cfg(feature = "opentelemetry")]
        let span = crate::trace_context::publish_span(
            crate::telemetry::messaging_system(self.transport.name()),
            topic,
            &id,
            &mut event.headers,
        )
        .unwrap_or_else(tracing::Span::none);
        let published = self.transport.publish(topic, &event);
        #[cfg(feature = "opentelemetry")]
        let published = tracing::Instrument::instrument(published, span);
        Ok(published.await?.with_event_id(id))
    }

    /// Publishes `events` to `topic` in order, each confirmed before the next is sent (so events of one
    /// key keep their order on every broker); stops at the first failure.
    pub async fn publish_batch(
        &self,
        topic: &str,
        events: impl IntoIterator<Item = Event>,
    ) -> Result<Vec<Published>, Error> {
        let mut out = Vec::new();
        for event in events {
            out.push(self.publish(topic, event).await?);
        }
        Ok(out)
    }

    /// Publishes `value` as a JSON payload (content type `application/json` in a `content-type` header).
    pub async fn publish_json<T: Serialize + ?Sized>(
        &self,
        topic: &str,
        value: &T,
    ) -> Result<Published, Error> {
        let event = Event::json(value).map_err(|e| {
            Error::from_source(Kind::InvalidInput, e)
                .with_operation(format!("encode JSON for {topic}"))
        })?;
        self.publish(topic, event).await
    }
}

/// Checks the producer's headers and gives the event fresh metadata with an event id.
fn prepare(topic: &str, mut event: Event) -> Result<Event, Error> {
    if topic.is_empty() {
        return Err(Error::new(Kind::Config, "the topic name is empty"));
    }
    if let Some((name, _)) = event
        .headers
        .iter()
        .find(|(n, _)| n.starts_with(PREFIX) || *n == PACKED)
    {
        return Err(Error::new(
            Kind::InvalidInput,
            format!(
                "header {name:?} is in the SDK's metadata namespace ({PREFIX}*), which producers cannot write"
            ),
        ));
    }
    let id = event
        .metadata()
        .event_id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string().into());
    *event.metadata_mut() = RetryMetadata {
        event_id: Some(id),
        ..RetryMetadata::default()
    };
    Ok(event)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn producers_cannot_write_metadata() {
        let mut forged = Event::new("x").with_id("e1");
        forged.metadata_mut().attempts = 7;
        forged.metadata_mut().replay_count = 3;
        let clean = prepare("t", forged).unwrap();
        assert_eq!(clean.id(), Some("e1"));
        assert_eq!(clean.metadata().attempts, 0);
        assert_eq!(clean.metadata().replay_count, 0);

        let e = prepare("t", Event::new("x").with_header("x-retry-attempts", "9")).unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidInput);
        assert!(e.to_string().contains("x-retry-attempts"), "{e}");
        assert!(prepare("t", Event::new("x").with_header("x-retry", "{}")).is_err());
        assert!(prepare("", Event::new("x")).is_err());
    }

    #[test]
    fn events_without_an_id_get_one() {
        let a = prepare("t", Event::new("x")).unwrap();
        let b = prepare("t", Event::new("x")).unwrap();
        assert!(a.id().is_some_and(|id| id.len() == 36));
        assert_ne!(a.id(), b.id());
    }
}
