//! The in-memory transport: the reference semantics, and the embedded default for tests and examples.
//!
//! One queue per topic, ordered by due time then by arrival; a retry is a copy put back in the same queue
//! with a due time (timers on a heap, never a sleeping task per message), so "delays are never early and
//! nothing waits behind a message that is not due" holds by construction. Consumers of a topic compete for
//! its messages like one consumer group. Everything lives for the life of the process: a consumer that
//! crashes (drops its deliveries without settling them) loses nothing, and its messages go to the next
//! consumer — exactly what the conformance suite expects of a real broker.
//!
//! For fault tests the transport can make a topic's DLQ unwritable ([`MemoryTransport::set_dlq_writable`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::dlq::{DeadLetter, DeadLetterQueue, DlqFilter, ReplayReport};
use crate::event::{Event, RawMessage};
use crate::metadata::Origin;
use crate::transport::{
    Capabilities, DelayCapability, Delivery, DeliveryInfo, Receipt, Subscription, SubscriptionSpec,
    Transport, TransportError,
};

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

#[derive(Default)]
struct Broker {
    state: Mutex<State>,
    arrivals: Notify,
}

#[derive(Default)]
struct State {
    topics: HashMap<String, Queue>,
    dead: HashMap<String, Vec<DeadLetter>>,
    unwritable_dlq: HashSet<String>,
    next_seq: u64,
}

#[derive(Default)]
struct Queue {
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    messages: HashMap<u64, Stored>,
    next_offset: i64,
}

#[derive(Clone)]
struct Stored {
    raw: RawMessage,
    offset: i64,
}

impl Broker {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn enqueue(&self, topic: &str, raw: RawMessage, due: Instant, offset: Option<i64>) {
        let mut state = self.lock();
        let seq = state.next_seq;
        state.next_seq += 1;
        let queue = state.topics.entry(topic.to_string()).or_default();
        let offset = offset.unwrap_or_else(|| {
            let o = queue.next_offset;
            queue.next_offset += 1;
            o
        });
        queue.due.push(Reverse((due, seq)));
        queue.messages.insert(seq, Stored { raw, offset });
        drop(state);
        self.arrivals.notify_waiters();
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

    /// Messages waiting in `topic` (due or not), not counting those handed out and unsettled.
    pub fn pending(&self, topic: &str) -> usize {
        self.broker
            .lock()
            .topics
            .get(topic)
            .map_or(0, |q| q.messages.len())
    }

    /// Capabilities of the in-memory transport: every feature, delays exact to the millisecond.
    pub const CAPABILITIES: Capabilities = Capabilities {
        delay: DelayCapability::EXACT,
        per_key_order: true,
        blocking_pause: true,
        replay: true,
        shared_subscription: true,
        crash_redelivery: true,
    };
}

#[async_trait]
impl Transport for MemoryTransport {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Self::CAPABILITIES
    }

    async fn publish(&self, topic: &str, event: &Event) -> Result<(), TransportError> {
        self.broker
            .enqueue(topic, event.to_raw(), Instant::now(), None);
        Ok(())
    }

    async fn subscribe(
        &self,
        spec: &SubscriptionSpec,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        Ok(Box::new(MemorySubscription {
            broker: self.broker.clone(),
            topic: spec.topic.clone(),
        }))
    }

    fn dead_letters(&self) -> Arc<dyn DeadLetterQueue> {
        Arc::new(self.clone())
    }
}

struct MemorySubscription {
    broker: Arc<Broker>,
    topic: String,
}

impl MemorySubscription {
    /// Takes the head of the queue if it is due; otherwise tells when it will be.
    fn take_due(&self) -> Result<Delivery, Option<Instant>> {
        let mut state = self.broker.lock();
        let Some(queue) = state.topics.get_mut(&self.topic) else {
            return Err(None);
        };
        let now = Instant::now();
        while let Some(Reverse((due, seq))) = queue.due.peek().copied() {
            if due > now {
                return Err(Some(due));
            }
            queue.due.pop();
            if let Some(stored) = queue.messages.remove(&seq) {
                return Ok(Delivery {
                    message: stored.raw.clone(),
                    info: DeliveryInfo {
                        message_id: format!("{}/{}", self.topic, stored.offset),
                        origin: Origin {
                            topic: self.topic.clone(),
                            partition: None,
                            offset: Some(stored.offset),
                        },
                        broker_attempts: None,
                        broker_retries: None,
                    },
                    receipt: Box::new(MemoryReceipt {
                        broker: self.broker.clone(),
                        topic: self.topic.clone(),
                        original: Some(stored),
                    }),
                });
            }
        }
        Err(None)
    }
}

#[async_trait]
impl Subscription for MemorySubscription {
    async fn next(&mut self) -> Result<Option<Delivery>, TransportError> {
        loop {
            // Register for arrivals before looking, so a message published in between is not missed.
            let arrival = self.broker.arrivals.notified();
            tokio::pin!(arrival);
            arrival.as_mut().enable();
            match self.take_due() {
                Ok(delivery) => return Ok(Some(delivery)),
                Err(Some(due)) => {
                    tokio::select! {
                        () = arrival => {}
                        () = tokio::time::sleep_until(due) => {}
                    }
                }
                Err(None) => arrival.await,
            }
        }
    }
}

/// Settles one in-memory delivery; dropping it unsettled puts the message back at once.
struct MemoryReceipt {
    broker: Arc<Broker>,
    topic: String,
    original: Option<Stored>,
}

impl MemoryReceipt {
    fn take(&mut self) -> Result<Stored, TransportError> {
        self.original.take().ok_or(TransportError::AlreadySettled)
    }
}

#[async_trait]
impl Receipt for MemoryReceipt {
    async fn ack(&mut self) -> Result<(), TransportError> {
        self.take().map(drop)
    }

    async fn retry(&mut self, event: &Event, delay: Duration) -> Result<(), TransportError> {
        if self.original.is_none() {
            return Err(TransportError::AlreadySettled);
        }
        self.broker
            .enqueue(&self.topic, event.to_raw(), Instant::now() + delay, None);
        self.take().map(drop)
    }

    async fn dead_letter(&mut self, event: &Event) -> Result<(), TransportError> {
        if self.original.is_none() {
            return Err(TransportError::AlreadySettled);
        }
        let mut state = self.broker.lock();
        if state.unwritable_dlq.contains(&self.topic) {
            return Err(TransportError::Rejected {
                operation: format!("dead-letter to the DLQ of {}", self.topic),
                reason: "the DLQ is not writable".to_string(),
            });
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        state
            .dead
            .entry(self.topic.clone())
            .or_default()
            .push(DeadLetter {
                id: seq.to_string(),
                event: event.clone(),
            });
        drop(state);
        self.take().map(drop)
    }

    async fn release(&mut self, after: Duration) -> Result<(), TransportError> {
        let stored = self.take()?;
        self.broker.enqueue(
            &self.topic,
            stored.raw,
            Instant::now() + after,
            Some(stored.offset),
        );
        Ok(())
    }
}

impl Drop for MemoryReceipt {
    fn drop(&mut self) {
        if let Some(stored) = self.original.take() {
            self.broker
                .enqueue(&self.topic, stored.raw, Instant::now(), Some(stored.offset));
        }
    }
}

#[async_trait]
impl DeadLetterQueue for MemoryTransport {
    async fn list(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<Vec<DeadLetter>, TransportError> {
        let state = self.broker.lock();
        let entries = state
            .dead
            .get(source_topic)
            .map(Vec::as_slice)
            .unwrap_or_default();
        Ok(entries
            .iter()
            .filter(|e| filter.matches(e))
            .take(filter.limit.unwrap_or(usize::MAX))
            .cloned()
            .collect())
    }

    async fn replay(
        &self,
        source_topic: &str,
        filter: &DlqFilter,
    ) -> Result<ReplayReport, TransportError> {
        let mut report = ReplayReport::default();
        for entry in self.list(source_topic, filter).await? {
            let (event, origin) = entry.for_replay(source_topic);
            self.publish(&origin, &event).await?;
            if let Some(list) = self.broker.lock().dead.get_mut(source_topic) {
                list.retain(|e| e.id != entry.id);
            }
            report.replayed += 1;
            report.ids.push(entry.id);
        }
        Ok(report)
    }

    async fn purge(&self, source_topic: &str, filter: &DlqFilter) -> Result<usize, TransportError> {
        let doomed: HashSet<String> = self
            .list(source_topic, filter)
            .await?
            .into_iter()
            .map(|e| e.id)
            .collect();
        if let Some(list) = self.broker.lock().dead.get_mut(source_topic) {
            list.retain(|e| !doomed.contains(&e.id));
        }
        Ok(doomed.len())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(topic: &str) -> SubscriptionSpec {
        SubscriptionSpec {
            topic: topic.into(),
            group: "g".into(),
            consumer: "c".into(),
            ordered: false,
            max_in_flight: 1,
            max_deliveries: None,
            longest_delay: None,
        }
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
            d.receipt.ack().await.unwrap_err().to_string(),
            "the delivery was already settled"
        );
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

    #[tokio::test]
    async fn unwritable_dlq_keeps_the_original() {
        let t = MemoryTransport::new();
        t.set_dlq_writable("c", false);
        let mut sub = t.subscribe(&spec("c")).await.unwrap();
        t.publish("c", &Event::new("x")).await.unwrap();
        let mut d = sub.next().await.unwrap().unwrap();
        assert!(d.receipt.dead_letter(&Event::new("x")).await.is_err());
        d.receipt.release(Duration::ZERO).await.unwrap();
        assert_eq!(t.pending("c"), 1);
        t.set_dlq_writable("c", true);
        let mut d = sub.next().await.unwrap().unwrap();
        d.receipt.dead_letter(&Event::new("x")).await.unwrap();
        assert_eq!(t.list("c", &DlqFilter::all()).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn replay_restarts_attempts_and_purge_removes() {
        let t = MemoryTransport::new();
        let mut sub = t.subscribe(&spec("d")).await.unwrap();
        for i in 0..3 {
            t.publish("d", &Event::new(format!("e{i}"))).await.unwrap();
            let mut d = sub.next().await.unwrap().unwrap();
            let mut e = Event::from_raw(d.message.clone()).unwrap();
            e.meta.attempts = 4;
            e.meta.origin = Some(d.info.origin.clone());
            d.receipt.dead_letter(&e).await.unwrap();
        }
        let all = t.list("d", &DlqFilter::all()).await.unwrap();
        assert_eq!(all.len(), 3);
        let report = t
            .replay("d", &DlqFilter::id(all[0].id.clone()))
            .await
            .unwrap();
        assert_eq!(report.replayed, 1);
        let back = Event::from_raw(sub.next().await.unwrap().unwrap().message).unwrap();
        assert_eq!((back.meta.attempts, back.meta.replay_count), (0, 1));
        assert_eq!(t.purge("d", &DlqFilter::all()).await.unwrap(), 2);
        assert!(t.list("d", &DlqFilter::all()).await.unwrap().is_empty());
    }
}
