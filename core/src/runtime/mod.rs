//! The consumer runtime: receive, handle with bounded concurrency, decide, settle.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use event_retry_core::prelude::*;
//!
//! let broker = Broker::memory();
//! let handle = broker
//!     .consumer("orders")
//!     .policy(RetryPolicy::parse("5s x3, 10s x5")?)
//!     .concurrency(8)
//!     .start(handler_fn(|event: Event, ctx: Context| async move {
//!         println!("attempt {} of {:?}", ctx.attempt, event.payload);
//!         Ok(())
//!     }))
//!     .await?;
//! let stop = handle.shutdown_trigger(); // e.g. for a signal handler
//! stop.trigger();
//! handle.await?; // in-flight work finished or released
//! # Ok(()) }
//! ```
//!
//! One delivery goes: decode the metadata, claim the idempotency key, call the handler, decide with the
//! policy and the classification ([`crate::decide`]), and settle through the broker — an acknowledgement
//! only after success, a retry or DLQ copy that the broker confirmed before the original is let go. Several
//! consumers run under one [`App`] with one shutdown.

mod app;
mod batch;
mod builder;
mod error;
mod handle;
mod handler;
mod health;
mod launch;
mod ordering;
pub mod probe;
mod process;
mod receive;
mod shared;
mod state;
mod stats;
mod stop;
#[cfg(feature = "tower")]
pub mod tower;

pub use app::{App, AppError, AppHealth, shutdown_signal};
pub use batch::{BatchFnHandler, BatchHandler, BatchItem, batch_handler_fn};
pub use builder::{Consumer, ConsumerBuilder, ParkedAfterDead};
pub use error::ConsumerError;
pub use handle::{ConsumerHandle, HealthWatch, Shutdown};
pub use handler::{
    Context, FnHandler, Handler, HandlerCall, JsonHandler, UndecodablePayload, decode_json,
    handler_fn, json_handler,
};
pub use health::{Health, UNREACHABLE_AFTER_LAST_ERROR};
pub use state::{
    State, batch_handler_fn_with_state, handler_fn_with_state, json_handler_with_state,
};
pub use stats::Stats;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::adapter::{
        Admin, Capabilities, DlqSession, Published, Subscription, SubscriptionSpec, Transport,
    };
    use crate::broker::Broker;
    use crate::error::Error;
    use crate::event::Event;
    use crate::memory::MemoryTransport;
    use crate::policy::RetryPolicy;

    /// A memory transport that records the spec it was subscribed with.
    #[derive(Default)]
    struct Recording {
        inner: MemoryTransport,
        spec: std::sync::Mutex<Option<SubscriptionSpec>>,
    }

    #[async_trait::async_trait]
    impl Transport for Recording {
        fn name(&self) -> &'static str {
            "recording"
        }
        fn capabilities(&self) -> Capabilities {
            MemoryTransport::CAPABILITIES
        }
        async fn publish(&self, topic: &str, event: &Event) -> Result<Published, Error> {
            self.inner.publish(topic, event).await
        }
        async fn subscribe(&self, spec: &SubscriptionSpec) -> Result<Box<dyn Subscription>, Error> {
            *self.spec.lock().unwrap() = Some(spec.clone());
            self.inner.subscribe(spec).await
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
    async fn the_spec_carries_the_deliveries_and_longest_delay_the_policy_needs() {
        let transport: Arc<Recording> = Arc::new(Recording::default());
        let broker = Broker::from(transport.clone() as Arc<dyn Transport>);
        let handle = broker
            .consumer("t")
            .policy(RetryPolicy::parse("1s x2, 5s x3").unwrap())
            .start(handler_fn(|_e: Event, _c: Context| async {
                Ok::<(), crate::classify::HandlerError>(())
            }))
            .await
            .unwrap();
        let spec = transport.spec.lock().unwrap().clone().unwrap();
        assert_eq!(
            spec.max_deliveries,
            Some(6),
            "the first delivery and 5 retries"
        );
        assert_eq!(spec.longest_delay, Some(Duration::from_secs(5)));
        handle.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn the_handle_is_awaited_and_wait_until_wakes_on_changes() {
        let broker = Broker::memory();
        let handle = broker
            .consumer("w")
            .start(handler_fn(|_e: Event, _c: Context| async { Ok(()) }))
            .await
            .unwrap();
        let producer = broker.producer();
        for i in 0..5 {
            producer
                .publish("w", Event::new(format!("e{i}")))
                .await
                .unwrap();
        }
        let stats = tokio::time::timeout(
            Duration::from_secs(5),
            handle.wait_until(|s| s.succeeded >= 5),
        )
        .await
        .unwrap();
        assert_eq!(stats.succeeded, 5);
        let stop = handle.shutdown_trigger();
        let waiter = tokio::spawn(async move { handle.await });
        stop.trigger();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    /// A replayed event's time budget starts at the replay: its first failure after a replay long past
    /// the budget is retried, not dead-lettered again at once (the history, first-seen, stays).
    #[tokio::test]
    async fn a_replay_starts_the_time_budget_again() {
        let broker = Broker::memory();
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let seen = calls.clone();
        let handle = broker
            .consumer("budget")
            .policy(RetryPolicy::parse("20ms x5; max-elapsed=200ms").unwrap())
            .start(handler_fn(move |e: Event, _c: Context| {
                let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move {
                    match (e.metadata().replay_count, n) {
                        (0, _) => Err(crate::classify::HandlerError::non_retryable("first life")),
                        (_, 1) => Err(crate::classify::HandlerError::deferred("once more")),
                        _ => Ok(()),
                    }
                }
            }))
            .await
            .unwrap();
        broker
            .producer()
            .publish("budget", Event::new("x").with_id("b1"))
            .await
            .unwrap();
        let wait = |n: u64| handle.wait_until(move |s| s.dead_lettered >= n);
        tokio::time::timeout(Duration::from_secs(5), wait(1))
            .await
            .unwrap();
        // Long past the budget since the event was first seen.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let dlq = broker.dead_letters();
        let report = dlq
            .replay("budget", &crate::dlq::DlqFilter::all())
            .await
            .unwrap();
        assert_eq!(report.replayed, 1);
        let stats = tokio::time::timeout(
            Duration::from_secs(5),
            handle.wait_until(|s| s.succeeded >= 1 || s.dead_lettered >= 2),
        )
        .await
        .unwrap();
        assert_eq!(
            (
                stats.succeeded,
                stats.dead_lettered,
                stats.retries_scheduled
            ),
            (1, 1, 1),
            "retried after the replay, then succeeded: {stats:?}"
        );
        handle.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn permanent_receive_errors_stop_the_consumer_with_the_last_error() {
        let transport = MemoryTransport::new();
        transport.fail_receives("p", Some(crate::error::Kind::Security));
        let broker = Broker::new(transport.clone());
        let handle = broker
            .consumer("p")
            .give_up_receiving_after(3, Duration::from_millis(250))
            .start(handler_fn(|_e: Event, _c: Context| async { Ok(()) }))
            .await
            .unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(10), handle)
            .await
            .expect("the consumer stops");
        match ended {
            Err(ConsumerError::ReceiveFailed {
                failures,
                over,
                last,
            }) => {
                assert!(failures >= 3 && over >= Duration::from_millis(250));
                assert_eq!(last.kind(), crate::error::Kind::Security);
            }
            other => panic!("want ReceiveFailed, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn temporary_receive_errors_are_retried_until_they_heal() {
        let transport = MemoryTransport::new();
        transport.fail_receives("t", Some(crate::error::Kind::Connection));
        let broker = Broker::new(transport.clone());
        let handle = broker
            .consumer("t")
            .give_up_receiving_after(2, Duration::ZERO)
            .start(handler_fn(|_e: Event, _c: Context| async { Ok(()) }))
            .await
            .unwrap();
        let stats = tokio::time::timeout(
            Duration::from_secs(10),
            handle.wait_until(|s| s.receive_errors >= 4),
        )
        .await
        .unwrap();
        assert!(!handle.is_finished(), "still running: {stats:?}");
        transport.fail_receives("t", None);
        broker
            .producer()
            .publish("t", Event::new("x"))
            .await
            .unwrap();
        tokio::time::timeout(
            Duration::from_secs(15),
            handle.wait_until(|s| s.succeeded == 1),
        )
        .await
        .unwrap();
        handle.shutdown().await.unwrap();
    }

    /// An event dead-lettered twice in one life (delivered again before its first dead letter was
    /// settled): a replay of everything runs it once, and leaves the DLQ empty.
    #[tokio::test]
    async fn a_replay_runs_a_twice_dead_lettered_event_once() {
        let broker = Broker::memory();
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let seen = calls.clone();
        let handle = broker
            .consumer("twice")
            .start(handler_fn(move |e: Event, _c: Context| {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move {
                    match e.metadata().replay_count {
                        0 => Err(crate::classify::HandlerError::non_retryable("refused")),
                        _ => Ok(()),
                    }
                }
            }))
            .await
            .unwrap();
        // The same event twice: what a redelivery looks like to the consumer.
        for _ in 0..2 {
            broker
                .producer()
                .publish("twice", Event::new("x").with_id("t1"))
                .await
                .unwrap();
        }
        tokio::time::timeout(
            Duration::from_secs(5),
            handle.wait_until(|s| s.dead_lettered >= 2),
        )
        .await
        .unwrap();
        let dlq = broker.dead_letters();
        let listed = dlq
            .list("twice", &crate::dlq::DlqFilter::all())
            .await
            .unwrap();
        assert_eq!((listed.len(), crate::dlq::copies(&listed)), (2, 1));
        let report = dlq
            .replay("twice", &crate::dlq::DlqFilter::all())
            .await
            .unwrap();
        assert_eq!((report.replayed, report.copies_removed.len()), (1, 1));
        let stats = tokio::time::timeout(
            Duration::from_secs(5),
            handle.wait_until(|s| s.succeeded >= 1),
        )
        .await
        .unwrap();
        // Let a second replayed copy, were there one, arrive.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            (
                calls.load(std::sync::atomic::Ordering::SeqCst),
                stats.succeeded
            ),
            (3, 1),
            "two refused calls, one replayed call"
        );
        let left = dlq
            .list("twice", &crate::dlq::DlqFilter::all())
            .await
            .unwrap();
        assert!(left.is_empty(), "{left:?}");
        handle.shutdown().await.unwrap();
    }

    /// An idempotency store whose database is down until `healed` is set.
    struct DownStore {
        healed: std::sync::atomic::AtomicBool,
        inner: crate::idempotency::InMemoryIdempotencyStore,
    }

    #[async_trait::async_trait]
    impl crate::idempotency::IdempotencyStore for DownStore {
        async fn begin(
            &self,
            id: &str,
        ) -> Result<crate::idempotency::Begin, crate::idempotency::StoreError> {
            if !self.healed.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(crate::idempotency::StoreError("connection refused".into()));
            }
            self.inner.begin(id).await
        }
        async fn complete(&self, id: &str) -> Result<(), crate::idempotency::StoreError> {
            self.inner.complete(id).await
        }
        async fn abandon(&self, id: &str) -> Result<(), crate::idempotency::StoreError> {
            self.inner.abandon(id).await
        }
    }

    /// A store that cannot answer holds consumption (a blocking outage): the event waits unhandled and
    /// not dead-lettered, the receive loop takes nothing more, and it runs once the store heals.
    #[tokio::test]
    async fn an_unavailable_idempotency_store_holds_consumption_until_it_heals() {
        let broker = Broker::memory();
        let store = Arc::new(DownStore {
            healed: std::sync::atomic::AtomicBool::new(false),
            inner: crate::idempotency::InMemoryIdempotencyStore::new(Duration::from_secs(60)),
        });
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let seen = calls.clone();
        let handle = broker
            .consumer("store-down")
            .concurrency(1)
            .blocking(RetryPolicy::parse("20ms x10").unwrap())
            .idempotency(store.clone())
            .start(handler_fn(move |_e: Event, _c: Context| {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Ok(()) }
            }))
            .await
            .unwrap();
        for id in ["s1", "s2"] {
            broker
                .producer()
                .publish("store-down", Event::new("x").with_id(id))
                .await
                .unwrap();
        }
        let held =
            tokio::time::timeout(Duration::from_secs(5), handle.wait_until(|s| s.holds >= 5))
                .await
                .unwrap();
        assert_eq!(
            (
                held.received,
                held.attempts,
                held.dead_lettered,
                held.released
            ),
            (1, 0, 0, 0),
            "one event held unhandled, the second not taken: {held:?}"
        );
        store
            .healed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let done = tokio::time::timeout(
            Duration::from_secs(5),
            handle.wait_until(|s| s.succeeded >= 2),
        )
        .await
        .unwrap();
        assert_eq!(
            (
                done.dead_lettered,
                calls.load(std::sync::atomic::Ordering::SeqCst)
            ),
            (0, 2)
        );
        handle.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn shutdown_during_a_dlq_outage_gives_the_event_back_unsettled() {
        let transport = MemoryTransport::new();
        transport.set_dlq_writable("d", false);
        let broker = Broker::new(transport.clone());
        let handle = broker
            .consumer("d")
            .blocking(RetryPolicy::parse("20ms").unwrap())
            .start(handler_fn(|_e: Event, _c: Context| async {
                Err(crate::classify::HandlerError::non_retryable("bad"))
            }))
            .await
            .unwrap();
        broker
            .producer()
            .publish("d", Event::new("x"))
            .await
            .unwrap();
        let stats = tokio::time::timeout(
            Duration::from_secs(5),
            handle.wait_until(|s| s.settle_errors >= 3),
        )
        .await
        .unwrap();
        assert_eq!((stats.dead_lettered, stats.attempts), (0, 1), "{stats:?}");
        tokio::time::timeout(Duration::from_secs(5), handle.shutdown())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            transport.held("d", &crate::adapter::default_group("d")),
            1,
            "the event is the broker's again, unsettled"
        );
    }

    #[tokio::test]
    async fn ordering_needs_a_broker_that_keeps_it() {
        struct NoOrder(MemoryTransport);
        #[async_trait::async_trait]
        impl Transport for NoOrder {
            fn name(&self) -> &'static str {
                "no-order"
            }
            fn capabilities(&self) -> Capabilities {
                MemoryTransport::CAPABILITIES.per_key_order(false)
            }
            async fn publish(&self, topic: &str, event: &Event) -> Result<Published, Error> {
                self.0.publish(topic, event).await
            }
            async fn subscribe(
                &self,
                spec: &SubscriptionSpec,
            ) -> Result<Box<dyn Subscription>, Error> {
                self.0.subscribe(spec).await
            }
            async fn open_dead_letters(
                &self,
                t: &str,
            ) -> Result<Option<Box<dyn DlqSession>>, Error> {
                self.0.open_dead_letters(t).await
            }
            fn admin(&self) -> &dyn Admin {
                self.0.admin()
            }
        }
        let broker = Broker::new(NoOrder(MemoryTransport::new()));
        let err = broker
            .consumer("t")
            .ordered_by_key(ParkedAfterDead::Run)
            .build()
            .unwrap_err();
        assert!(matches!(err, ConsumerError::Unsupported { .. }), "{err}");
        // Without asking for order, the same broker is fine.
        assert!(broker.consumer("t").build().is_ok());
    }
}
