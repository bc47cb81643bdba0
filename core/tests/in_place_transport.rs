//! The contract fits a broker where a retry is *not* a copy: the received message itself is hidden and
//! comes back (SQS's visibility timeout). Such a transport cannot rewrite the message's metadata, so it
//! reports the counts it keeps (`ApproximateReceiveCount`) in `DeliveryInfo`, and the policy still
//! advances and ends in the DLQ.
//!
//! The transport here wraps the in-memory one: `retry` releases the original for `delay` (no copy, old
//! metadata), and every delivery reports how often its message was received before.
//!
//! On such a broker a delivery given back unhandled costs the event an attempt, so the runtime handles a
//! delivery it already holds when shutdown is asked for instead of giving it back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use event_retry_core::adapter::{
    Admin, Capabilities, Delivery, DlqSession, Published, Receipt, Subscription, SubscriptionSpec,
    Transport,
};
use event_retry_core::error::Error;
use event_retry_core::memory::MemoryTransport;
use event_retry_core::metadata::DeadReason;
use event_retry_core::prelude::*;
use event_retry_core::runtime::Shutdown;

#[derive(Clone, Default)]
struct VisibilityTransport {
    inner: MemoryTransport,
    receives: Arc<Mutex<HashMap<String, u32>>>,
    /// Once set, every delivery asks its consumer to shut down just before it is handed over.
    shutdown_on_delivery: Arc<OnceLock<Shutdown>>,
}

struct VisibilitySubscription {
    inner: Box<dyn Subscription>,
    receives: Arc<Mutex<HashMap<String, u32>>>,
    shutdown_on_delivery: Arc<OnceLock<Shutdown>>,
}

/// Retrying hides the same message for `delay`: the metadata it carries stays as it was.
struct VisibilityReceipt(Box<dyn Receipt>);

#[async_trait]
impl Receipt for VisibilityReceipt {
    async fn ack(&mut self) -> Result<(), Error> {
        self.0.ack().await
    }
    async fn retry(&mut self, _event: &Event, delay: Duration) -> Result<(), Error> {
        self.0.release(delay).await
    }
    async fn dead_letter(&mut self, event: &Event) -> Result<(), Error> {
        self.0.dead_letter(event).await
    }
    async fn release(&mut self, after: Duration) -> Result<(), Error> {
        self.0.release(after).await
    }
}

#[async_trait]
impl Subscription for VisibilitySubscription {
    async fn next(&mut self) -> Result<Option<Delivery>, Error> {
        let Some(mut d) = self.inner.next().await? else {
            return Ok(None);
        };
        let earlier = {
            let mut receives = self.receives.lock().unwrap_or_else(|p| p.into_inner());
            let n = receives.entry(d.info.message_id()).or_insert(0);
            *n += 1;
            *n - 1
        };
        d.info = d.info.with_broker_counts(earlier, earlier);
        d.receipt = Box::new(VisibilityReceipt(d.receipt));
        if let Some(shutdown) = self.shutdown_on_delivery.get() {
            shutdown.trigger();
        }
        Ok(Some(d))
    }
}

#[async_trait]
impl Transport for VisibilityTransport {
    fn name(&self) -> &'static str {
        "visibility"
    }
    fn capabilities(&self) -> Capabilities {
        MemoryTransport::CAPABILITIES
    }
    async fn publish(&self, topic: &str, event: &Event) -> Result<Published, Error> {
        self.inner.publish(topic, event).await
    }
    async fn subscribe(&self, spec: &SubscriptionSpec) -> Result<Box<dyn Subscription>, Error> {
        Ok(Box::new(VisibilitySubscription {
            inner: self.inner.subscribe(spec).await?,
            receives: self.receives.clone(),
            shutdown_on_delivery: self.shutdown_on_delivery.clone(),
        }))
    }
    async fn open_dead_letters(
        &self,
        source_topic: &str,
    ) -> Result<Option<Box<dyn DlqSession>>, Error> {
        self.inner.open_dead_letters(source_topic).await
    }
    fn admin(&self) -> &dyn Admin {
        self.inner.admin()
    }
}

#[tokio::test]
async fn the_policy_advances_without_rewritten_metadata() -> Result<(), Box<dyn std::error::Error>>
{
    let broker = Broker::new(VisibilityTransport::default());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let handle = broker
        .consumer("in-place")
        .policy(RetryPolicy::parse("30ms x2")?)
        .start(handler_fn(move |_event: Event, ctx: Context| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((ctx.attempt, ctx.retries));
                Err(HandlerError::deferred("still failing"))
            }
        }))
        .await?;
    broker
        .producer()
        .publish("in-place", Event::new("x").with_id("x"))
        .await?;
    let dlq = broker.dead_letters();
    let mut entries = Vec::new();
    for _ in 0..200 {
        entries = dlq.list("in-place", &DlqFilter::all()).await?;
        if !entries.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.shutdown().await?;
    let calls = calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        calls,
        [(1, 0), (2, 1), (3, 2)],
        "attempt and policy position from the broker's counts"
    );
    assert_eq!(entries.len(), 1, "the spent event reached the DLQ");
    let meta = entries[0].event.metadata();
    assert_eq!(
        meta.dead.as_ref().map(|d| d.reason),
        Some(DeadReason::Exhausted)
    );
    assert_eq!((meta.attempts, meta.retries), (3, 2));
    Ok(())
}

#[tokio::test]
async fn a_delivery_in_hand_when_shutdown_is_asked_for_is_handled_not_given_back()
-> Result<(), Box<dyn std::error::Error>> {
    let transport = VisibilityTransport::default();
    let broker = Broker::new(transport.clone());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let handle = broker
        .consumer("in-hand")
        .start(handler_fn(move |_event: Event, ctx: Context| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(ctx.attempt);
                Ok::<(), HandlerError>(())
            }
        }))
        .await?;
    let _ = transport
        .shutdown_on_delivery
        .set(handle.shutdown_trigger());
    broker
        .producer()
        .publish("in-hand", Event::new("x").with_id("x"))
        .await?;
    // The delivery itself asks for the shutdown; `wait_until` returns once the consumer has stopped.
    let stats = tokio::time::timeout(Duration::from_secs(10), handle.wait_until(|_| false)).await?;
    handle.shutdown().await?;
    let calls = calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        calls,
        [1],
        "the delivery in hand was handled, at its first attempt"
    );
    assert_eq!(stats.succeeded, 1, "and acknowledged: {stats:?}");
    let receives = transport.receives.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(
        receives.values().collect::<Vec<_>>(),
        [&1],
        "received once, not given back"
    );
    Ok(())
}
