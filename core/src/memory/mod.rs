//! The in-memory transport: the reference semantics, and the embedded default for tests and examples.
//!
//! One queue per consumer group of a topic, ordered by due time then by arrival; a retry is a copy put
//! back in its group's queue with a due time (timers on a heap, never a sleeping task per message), so
//! "delays are never early and nothing waits behind a message that is not due" holds by construction.
//! Groups mean what they mean on every broker: each group receives every event published after it was
//! declared (a topic is declared with its [default group](crate::adapter::default_group); another group
//! is declared by its first consumer or by [`Admin::declare`]), and the consumers of one group compete for
//! its events. Everything lives for the life of the process: a consumer that crashes (drops its
//! deliveries without settling them) loses nothing, and its messages go to the next consumer of its group
//! — exactly what the conformance suite expects of a real broker.
//!
//! For fault tests the transport can make a topic's DLQ unwritable ([`MemoryTransport::set_dlq_writable`])
//! and its receives fail ([`MemoryTransport::fail_receives`]).
//!
//! It is also the smallest example of the adapter contract ([`crate::adapter`]): a [`Transport`] with its
//! subscription and receipt, a DLQ session, an [`Admin`], and a [`Scheme`] for `memory://` URLs — in the
//! file set the adapters have, so it doubles as the template for a new one: this file (the transport and
//! its scheme), `broker.rs` (the state every part shares, as an adapter's `link.rs`), `subscription.rs`,
//! `dlq.rs` and `admin.rs`.

mod admin;
mod broker;
mod dlq;
mod subscription;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::time::Instant;

use crate::adapter::{
    Admin, Capabilities, ConnectFuture, DelayCapability, DlqSession, Published, Scheme,
    Subscription, SubscriptionSpec, Transport,
};
use crate::error::{Error, Kind};
use crate::event::Event;
use crate::options::Options;

use self::broker::{Broker, Queue};
use self::dlq::MemoryDlqSession;
use self::subscription::{GroupQueue, MemorySubscription};

/// The in-memory broker. Cheap to clone; clones share the same queues.
#[derive(Clone, Default)]
pub struct MemoryTransport {
    broker: Arc<Broker>,
}

impl std::fmt::Debug for MemoryTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTransport").finish_non_exhaustive()
    }
}

impl MemoryTransport {
    /// A new, empty broker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the DLQ of `source_topic` refuse writes (`false`) or accept them again (`true`).
    pub fn set_dlq_writable(&self, source_topic: &str, writable: bool) {
        let mut state = self.broker.lock();
        if writable {
            state.unwritable_dlq.remove(source_topic);
        } else {
            state.unwritable_dlq.insert(source_topic.to_string());
        }
    }

    /// Makes every receive from `topic` fail with an error of `kind` (`Some`), or work again (`None`):
    /// for tests of how a consumer meets a broker that refuses it.
    pub fn fail_receives(&self, topic: &str, kind: Option<Kind>) {
        self.broker.fail_receives(topic, kind);
    }

    /// Messages the broker still holds for `group` of `topic`: waiting (due or not) and handed out
    /// unsettled — what the group would get again after a crash.
    pub fn held(&self, topic: &str, group: &str) -> usize {
        self.queue_count(topic, group, |q| q.waiting.len() + q.in_flight())
    }

    /// Retries `group` of `topic` scheduled through the broker (put back with a delay), in all.
    pub fn retries_scheduled(&self, topic: &str, group: &str) -> usize {
        self.queue_count(topic, group, |q| q.retries_scheduled)
    }

    /// Messages waiting for `group` of `topic` (due or not), not counting those handed out and unsettled,
    /// nor those a lane of a split subscription took ahead (up to 16 a lane) and has not handed out.
    pub fn pending(&self, topic: &str, group: &str) -> usize {
        self.queue_count(topic, group, |q| q.waiting.len())
    }

    fn queue_count(&self, topic: &str, group: &str, count: impl Fn(&Queue) -> usize) -> usize {
        self.broker
            .lock()
            .topics
            .get(topic)
            .and_then(|t| t.groups.get(group))
            .map_or(0, |queue| count(&broker::lock_queue(queue)))
    }

    /// Capabilities of the in-memory transport: every feature, delays exact to the millisecond.
    pub const CAPABILITIES: Capabilities = Capabilities::new(DelayCapability::EXACT)
        .per_key_order(true)
        .blocking_pause(true)
        .replay(true)
        .shared_subscription(true)
        .crash_redelivery(true)
        .fan_out(true);

    /// The in-process broker a `memory://` URL names: `memory://` alone is a new one, `memory://name` the
    /// broker called `name`, shared by every connect of the same URL in this process (so a producer and a
    /// consumer meet).
    pub fn named(name: &str) -> Self {
        let name = name.trim_end_matches('/');
        if name.is_empty() {
            return Self::new();
        }
        static BROKERS: std::sync::OnceLock<Mutex<HashMap<String, MemoryTransport>>> =
            std::sync::OnceLock::new();
        let mut brokers = BROKERS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        brokers.entry(name.to_string()).or_default().clone()
    }
}

/// `memory://[name]`: the in-process broker (see [`MemoryTransport::named`]); it takes no options.
pub const SCHEME: Scheme = Scheme::new(&["memory"], "in-memory", connect_url);

fn connect_url(url: String, options: Options) -> ConnectFuture {
    Box::pin(async move {
        options.reader("in-memory").finish()?;
        let name = url.split_once("://").map_or("", |(_, rest)| rest);
        Ok(Arc::new(MemoryTransport::named(name)) as Arc<dyn Transport>)
    })
}

#[async_trait]
impl Transport for MemoryTransport {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Self::CAPABILITIES
    }

    async fn publish(&self, topic: &str, event: &Event) -> Result<Published, Error> {
        let offset = self
            .broker
            .enqueue(topic, None, event.to_raw(), Instant::now(), None);
        Ok(Published::accepted()
            .with_message_id(format!("{topic}/{offset}"))
            .at(0, offset))
    }

    async fn subscribe(&self, spec: &SubscriptionSpec) -> Result<Box<dyn Subscription>, Error> {
        Ok(Box::new(MemorySubscription::new(
            Arc::new(GroupQueue::of(
                self.broker.clone(),
                Arc::from(spec.topic.as_str()),
                Arc::from(spec.group.as_str()),
            )),
            1,
        )))
    }

    async fn open_dead_letters(
        &self,
        source_topic: &str,
    ) -> Result<Option<Box<dyn DlqSession>>, Error> {
        let entries = self
            .broker
            .lock()
            .dead
            .get(source_topic)
            .cloned()
            .unwrap_or_default();
        Ok(Some(Box::new(MemoryDlqSession {
            transport: self.clone(),
            topic: source_topic.to_string(),
            entries,
            read: 0,
        })))
    }

    async fn write_dead_letter(
        &self,
        source_topic: &str,
        group: Option<&str>,
        event: &Event,
    ) -> Result<(), Error> {
        let mut state = self.broker.lock();
        if state.unwritable_dlq.contains(source_topic) {
            return Err(Error::new(Kind::Rejected, "the DLQ is not writable")
                .with_operation(format!("dead-letter to the DLQ of {source_topic}")));
        }
        state.add_dead_letter(source_topic, group.map(str::to_string), event);
        Ok(())
    }

    fn admin(&self) -> &dyn Admin {
        self
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::broker::{Stored, Waiting};
    use super::*;
    use crate::adapter::{Delivery, default_group};
    use crate::dlq::DlqFilter;
    use std::time::Duration;

    fn spec(topic: &str) -> SubscriptionSpec {
        SubscriptionSpec::new(topic, "g", "c")
    }

    fn stored(offset: i64) -> Stored {
        Stored {
            raw: Event::new(offset.to_string()).to_raw(),
            offset,
        }
    }

    fn offsets_due(w: &mut Waiting, now: Instant) -> Vec<i64> {
        std::iter::from_fn(|| w.pop_due(|| now).ok().map(|m| m.offset)).collect()
    }

    #[test]
    fn waiting_messages_come_by_due_time_then_arrival_and_never_early() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut w = Waiting::default();
        // Arrivals at t0 + 10 ms: two due at once, one due later, one whose due time already passed.
        w.push(ms(10), 1, stored(1), ms(10));
        w.push(ms(50), 2, stored(2), ms(10));
        w.push(ms(10), 3, stored(3), ms(10));
        w.push(ms(5), 4, stored(4), ms(10));
        assert_eq!(w.len(), 4);
        // At t0 + 10 ms: the ready ones, the earliest due first (4 was due at 5 ms), never message 2.
        assert_eq!(offsets_due(&mut w, ms(10)), vec![4, 1, 3]);
        assert_eq!(w.pop_due(|| ms(49)).err(), Some(Some(ms(50))));
        // A timer due before a message that arrives later goes first.
        w.push(ms(60), 5, stored(5), ms(60));
        assert_eq!(offsets_due(&mut w, ms(60)), vec![2, 5]);
        assert_eq!(w.pop_due(|| ms(60)).err(), Some(None));
        assert_eq!(w.len(), 0);
    }

    #[tokio::test]
    async fn a_due_message_is_at_hand_without_waiting_and_a_waiting_one_is_not() {
        let t = MemoryTransport::new();
        let mut sub = t.subscribe(&spec("r")).await.unwrap();
        assert!(
            sub.next_ready().is_none(),
            "an empty topic has nothing at hand"
        );
        t.publish("r", &Event::new("now")).await.unwrap();
        let mut d = sub.next_ready().expect("a published message is at hand");
        assert_eq!(d.message.payload.as_ref(), b"now");
        assert!(sub.next_ready().is_none(), "it was handed out once");
        d.receipt
            .retry(&Event::new("later"), Duration::from_millis(50))
            .await
            .unwrap();
        assert!(
            sub.next_ready().is_none(),
            "a retry is not at hand before it is due"
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
        let later = sub.next_ready().expect("a due retry is at hand");
        assert_eq!(later.message.payload.as_ref(), b"later");
    }

    #[tokio::test]
    async fn delivers_in_due_order_and_never_early() {
        let t = MemoryTransport::new();
        let mut sub = t.subscribe(&spec("a")).await.unwrap();
        t.publish("a", &Event::new("first")).await.unwrap();
        let mut d = sub.next().await.unwrap().unwrap();
        let start = Instant::now();
        d.receipt
            .retry(&Event::new("later"), Duration::from_millis(80))
            .await
            .unwrap();
        t.publish("a", &Event::new("second")).await.unwrap();
        let second = sub.next().await.unwrap().unwrap();
        assert_eq!(
            second.message.payload.as_ref(),
            b"second",
            "nothing waits behind a retry"
        );
        let later = sub.next().await.unwrap().unwrap();
        assert_eq!(later.message.payload.as_ref(), b"later");
        assert!(start.elapsed() >= Duration::from_millis(80));
        assert_eq!(
            d.receipt.ack().await.unwrap_err().kind(),
            Kind::AlreadySettled
        );
    }

    #[tokio::test]
    async fn held_counts_waiting_and_unsettled_messages() {
        let t = MemoryTransport::new();
        let mut sub = t.subscribe(&spec("h")).await.unwrap();
        t.publish("h", &Event::new("a")).await.unwrap();
        t.publish("h", &Event::new("b")).await.unwrap();
        let mut d = sub.next().await.unwrap().unwrap();
        assert_eq!((t.pending("h", "g"), t.held("h", "g")), (1, 2));
        d.receipt.ack().await.unwrap();
        assert_eq!(t.held("h", "g"), 1);
        let d = sub.next().await.unwrap().unwrap();
        drop(d);
        assert_eq!(
            (t.pending("h", "g"), t.held("h", "g")),
            (1, 1),
            "a dropped one is back"
        );
    }

    /// A subscription holds its group's queue: once its topic is deleted and published to again, it
    /// takes the new topic's messages, and none of the deleted one's.
    #[tokio::test]
    async fn a_subscription_outlives_its_topic_being_deleted() {
        let t = MemoryTransport::new();
        let mut sub = t.subscribe(&spec("d")).await.unwrap();
        t.publish("d", &Event::new("old")).await.unwrap();
        t.delete("d").await.unwrap();
        assert!(sub.next_ready().is_none(), "the deleted topic's message");
        t.publish("d", &Event::new("new")).await.unwrap();
        let d = sub.next_ready().expect("the new topic's message");
        assert_eq!(d.message.payload.as_ref(), b"new");
        assert_eq!(t.held("d", "g"), 1, "in flight in the new topic's queue");
    }

    #[tokio::test]
    async fn receives_fail_while_made_to_and_work_again_after() {
        let t = MemoryTransport::new();
        let mut sub = t.subscribe(&spec("f")).await.unwrap();
        t.publish("f", &Event::new("x")).await.unwrap();
        t.fail_receives("f", Some(Kind::Connection));
        t.fail_receives("other", Some(Kind::Security));
        assert!(sub.next_ready().is_none());
        assert_eq!(sub.next().await.unwrap_err().kind(), Kind::Connection);
        t.fail_receives("f", None);
        assert!(
            sub.next_ready().is_some(),
            "another topic's failing does not matter"
        );
        t.fail_receives("other", None);
    }

    #[tokio::test]
    async fn dropped_receipts_are_redelivered() {
        let t = MemoryTransport::new();
        let mut sub = t.subscribe(&spec("b")).await.unwrap();
        t.publish("b", &Event::new("x")).await.unwrap();
        let d = sub.next().await.unwrap().unwrap();
        let offset = d.info.origin.offset;
        drop(d);
        let again = sub.next().await.unwrap().unwrap();
        assert_eq!(
            again.info.origin.offset, offset,
            "same message, same offset"
        );
    }

    /// Two lanes of one subscription share a few messages out rather than one taking them all, hand
    /// each out once, and a lane dropped with messages it took and never handed out gives them back:
    /// the broker holds every message until it is settled.
    #[tokio::test]
    async fn lanes_share_the_queue_out_and_give_back_what_they_took() {
        let t = MemoryTransport::new();
        let mut a = t.subscribe(&spec("lanes")).await.unwrap();
        let mut b = a.split_lanes(1).pop().unwrap();
        for i in 0..4 {
            t.publish("lanes", &Event::new(i.to_string()))
                .await
                .unwrap();
        }
        // Lane a takes its half: 2 of the 4, one handed out and one kept at hand.
        let first = a.next_ready().unwrap();
        assert_eq!((t.pending("lanes", "g"), t.held("lanes", "g")), (2, 4));
        let from_b: Vec<_> = std::iter::from_fn(|| b.next_ready()).collect();
        assert_eq!(from_b.len(), 2, "lane b gets the other half");
        drop(a);
        assert_eq!(
            (t.pending("lanes", "g"), t.held("lanes", "g")),
            (1, 4),
            "the message lane a took and never handed out is waiting again"
        );
        let again = b.next_ready().unwrap();
        let mut offsets: Vec<_> = [&first, &again]
            .into_iter()
            .chain(&from_b)
            .map(|d| d.info.origin.offset)
            .collect();
        offsets.sort_unstable();
        assert_eq!(offsets, [Some(0), Some(1), Some(2), Some(3)], "each once");
        for mut d in [first, again].into_iter().chain(from_b) {
            d.receipt.ack().await.unwrap();
        }
        assert_eq!(t.held("lanes", "g"), 0);
    }

    #[tokio::test]
    async fn unwritable_dlq_keeps_the_original() {
        let t = MemoryTransport::new();
        let dlq = crate::dlq::DeadLetters::new(Arc::new(t.clone()));
        t.set_dlq_writable("c", false);
        let mut sub = t.subscribe(&spec("c")).await.unwrap();
        t.publish("c", &Event::new("x")).await.unwrap();
        let mut d = sub.next().await.unwrap().unwrap();
        let refused = d.receipt.dead_letter(&Event::new("x")).await.unwrap_err();
        assert_eq!(refused.kind(), Kind::Rejected);
        d.receipt.release(Duration::ZERO).await.unwrap();
        assert_eq!(t.pending("c", "g"), 1);
        t.set_dlq_writable("c", true);
        let mut d = sub.next().await.unwrap().unwrap();
        d.receipt.dead_letter(&Event::new("x")).await.unwrap();
        assert_eq!(dlq.list("c", &DlqFilter::all()).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn replay_restarts_attempts_and_purge_removes() {
        let t = MemoryTransport::new();
        let dlq = crate::dlq::DeadLetters::new(Arc::new(t.clone()));
        let mut sub = t.subscribe(&spec("d")).await.unwrap();
        for i in 0..3 {
            t.publish("d", &Event::new(format!("e{i}"))).await.unwrap();
            let mut d = sub.next().await.unwrap().unwrap();
            let mut e = Event::from_raw(d.message.clone()).unwrap();
            e.metadata_mut().attempts = 4;
            e.metadata_mut().origin = Some(d.info.origin.clone());
            d.receipt.dead_letter(&e).await.unwrap();
        }
        let all = dlq.list("d", &DlqFilter::all()).await.unwrap();
        assert_eq!(all.len(), 3);
        let report = dlq
            .replay("d", &DlqFilter::id(all[0].id.clone()))
            .await
            .unwrap();
        assert_eq!(report.replayed, 1);
        let back = Event::from_raw(sub.next().await.unwrap().unwrap().message).unwrap();
        assert_eq!(
            (back.metadata().attempts, back.metadata().replay_count),
            (0, 1)
        );
        assert_eq!(dlq.purge("d", &DlqFilter::all()).await.unwrap(), 2);
        assert!(dlq.list("d", &DlqFilter::all()).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn every_group_gets_every_event_published_after_it_was_declared() {
        let t = MemoryTransport::new();
        t.publish("g", &Event::new("before")).await.unwrap();
        let mut billing = t
            .subscribe(&SubscriptionSpec::new("g", "billing", "c1"))
            .await
            .unwrap();
        t.declare("g", Some("audit")).await.unwrap();
        let mut audit = t
            .subscribe(&SubscriptionSpec::new("g", "audit", "c2"))
            .await
            .unwrap();
        t.publish("g", &Event::new("after")).await.unwrap();
        let mut in_hand = Vec::new();
        for sub in [&mut billing, &mut audit] {
            let d = sub.next().await.unwrap().unwrap();
            assert_eq!(d.message.payload.as_ref(), b"after");
            in_hand.push(d);
        }
        // A retry goes back to its own group only.
        let mut d = billing.next_now().await;
        assert!(d.is_none(), "billing got nothing more");
        let mut first = t
            .subscribe(&SubscriptionSpec::new("g", default_group("g"), "c0"))
            .await
            .unwrap();
        let mut kept = first.next().await.unwrap().unwrap();
        assert_eq!(
            kept.message.payload.as_ref(),
            b"before",
            "the default group kept it"
        );
        kept.receipt
            .retry(&Event::new("again"), Duration::ZERO)
            .await
            .unwrap();
        for want in [&b"after"[..], b"again"] {
            let mut d = first.next().await.unwrap().unwrap();
            assert_eq!(d.message.payload.as_ref(), want);
            d.receipt.ack().await.unwrap();
        }
        d = audit.next_now().await;
        assert!(d.is_none(), "another group's retry is not audit's");
        assert_eq!((t.held("g", "audit"), t.held("g", "billing")), (1, 1));
        for mut d in in_hand {
            d.receipt.ack().await.unwrap();
        }
        assert_eq!((t.held("g", "audit"), t.held("g", "billing")), (0, 0));
    }

    /// A delivery ready now, if any.
    trait NextNow {
        async fn next_now(&mut self) -> Option<Delivery>;
    }

    impl NextNow for Box<dyn Subscription> {
        async fn next_now(&mut self) -> Option<Delivery> {
            tokio::time::timeout(Duration::from_millis(50), self.next())
                .await
                .ok()
                .and_then(Result::ok)
                .flatten()
        }
    }

    #[tokio::test]
    async fn memory_urls_share_by_name() {
        let a = (SCHEME.connect)("memory://shared".into(), Options::new())
            .await
            .unwrap();
        let b = (SCHEME.connect)("memory://shared".into(), Options::new())
            .await
            .unwrap();
        let lonely = (SCHEME.connect)("memory://".into(), Options::new())
            .await
            .unwrap();
        a.publish("t", &Event::new("x")).await.unwrap();
        // Published before any consumer: kept for the topic's default group.
        let default = SubscriptionSpec::new("t", default_group("t"), "c");
        let mut sub = b.subscribe(&default).await.unwrap();
        assert!(
            sub.next().await.unwrap().is_some(),
            "same name, same broker"
        );
        let mut other = lonely.subscribe(&default).await.unwrap();
        let nothing =
            tokio::time::timeout(std::time::Duration::from_millis(50), other.next()).await;
        assert!(nothing.is_err(), "memory:// alone is a fresh broker");
        let refused = (SCHEME.connect)("memory://".into(), Options::new().set("x", "1")).await;
        assert_eq!(refused.err().map(|e| e.kind()), Some(Kind::Config));
    }
}
