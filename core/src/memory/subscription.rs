//! A subscription to one group's queue, and the receipt that settles each of its deliveries.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::broker::{Broker, InFlight, QueueCell, Stored, lock_queue};
use crate::adapter::{Delivery, DeliveryInfo, Receipt, Subscription, Unsettled};
use crate::error::{Error, Kind};
use crate::event::Event;
use crate::metadata::Origin;

pub(super) struct MemorySubscription {
    /// The group's queue and this lane's count of what it handed out, shared with every receipt (one
    /// reference count per delivery, on the lane's own cache line).
    lane: Arc<Lane>,
    /// The topic's name, this lane's own copy: each delivery's origin takes a reference to it, which
    /// would be a write to a line every lane writes if the lanes shared one.
    topic: Arc<str>,
    /// How many lanes the subscription was split into.
    lanes: usize,
    /// With several lanes, messages taken from the queue together and not handed out yet (counted in
    /// flight): a lane locks the queue it shares once per batch of takes, not once per delivery.
    taken: VecDeque<Stored>,
}

/// One lane of a subscription: the group's queue, which every lane takes from, and the lane's own count
/// of deliveries in flight. Aligned so that two lanes' reference counts never share a cache line.
#[repr(align(128))]
pub(super) struct Lane {
    queue: Arc<GroupQueue>,
    in_flight: Arc<InFlight>,
}

impl Lane {
    /// A new lane of `queue`, its count registered with the queue.
    fn of(queue: Arc<GroupQueue>) -> Self {
        let in_flight = lock_queue(&queue.cell).new_lane();
        Self { queue, in_flight }
    }

    /// Puts `stored`, which this lane had in flight, back in the group's queue, due after `after`,
    /// then counts it out of flight: it is counted in one place or the other throughout.
    fn give_back(&self, stored: Stored, after: Duration) {
        self.queue.broker.enqueue(
            &self.queue.topic,
            Some(&self.queue.group),
            stored.raw,
            Instant::now() + after,
            Some(stored.offset),
        );
        self.in_flight.landed();
    }
}

/// A group's queue of a topic, with its names and broker.
pub(super) struct GroupQueue {
    pub(super) broker: Arc<Broker>,
    pub(super) topic: Arc<str>,
    pub(super) group: Arc<str>,
    pub(super) cell: Arc<QueueCell>,
}

impl GroupQueue {
    /// The queue of `group` of `topic` in `broker`, declared now if it was not.
    pub(super) fn of(broker: Arc<Broker>, topic: Arc<str>, group: Arc<str>) -> Self {
        let cell = broker.queue(&topic, &group);
        Self {
            broker,
            topic,
            group,
            cell,
        }
    }
}

impl std::ops::Deref for MemorySubscription {
    type Target = GroupQueue;

    fn deref(&self) -> &GroupQueue {
        &self.lane.queue
    }
}

impl MemorySubscription {
    /// The most messages a lane takes from the queue at once.
    const TAKE_AT_ONCE: usize = 16;

    /// A subscription to `queue`, one lane of `lanes`.
    pub(super) fn new(queue: Arc<GroupQueue>, lanes: usize) -> Self {
        Self {
            topic: Arc::from(&*queue.topic),
            lane: Arc::new(Lane::of(queue)),
            lanes: lanes.max(1),
            taken: VecDeque::new(),
        }
    }

    /// How many messages to take at once from a queue where `waiting` wait: one where the
    /// subscription is whole; with lanes, this lane's fair share of them (so that a few messages are
    /// spread over the lanes, whose work slots are shared out), up to [`Self::TAKE_AT_ONCE`].
    fn take_at_once(&self, waiting: usize) -> usize {
        if self.lanes == 1 {
            return 1;
        }
        waiting.div_ceil(self.lanes).clamp(1, Self::TAKE_AT_ONCE)
    }

    /// The delivery of `stored`, taken by this lane.
    fn delivery(&self, stored: Stored) -> Delivery {
        Delivery {
            message: stored.raw.clone(),
            info: DeliveryInfo::at(Origin {
                offset: Some(stored.offset),
                ..Origin::new(self.topic.clone())
            }),
            receipt: Box::new(MemoryReceipt {
                lane: self.lane.clone(),
                original: Unsettled::new(stored),
            }),
        }
    }

    /// The kind of error receives fail with, if they are made to fail.
    pub(super) fn refusal(&self) -> Option<Kind> {
        self.broker.refusal(&self.topic)
    }

    /// Takes the head of the group's queue if it is due; otherwise tells when it will be. Only the
    /// group's queue is locked; a queue whose topic was deleted is looked up again (the topic declared
    /// anew, as a subscription to it would).
    pub(super) fn take_due(&mut self) -> Result<Delivery, Option<Instant>> {
        if self.refusal().is_some() {
            // Receives fail: `next` reports it (what the lane took waits until they work again).
            return Err(None);
        }
        if let Some(stored) = self.taken.pop_front() {
            return Ok(self.delivery(stored));
        }
        let mut queue = lock_queue(&self.lane.queue.cell);
        if queue.deleted {
            drop(queue);
            let GroupQueue {
                broker,
                topic,
                group,
                ..
            } = &*self.lane.queue;
            let queue = GroupQueue::of(broker.clone(), topic.clone(), group.clone());
            self.lane = Arc::new(Lane::of(Arc::new(queue)));
            return self.take_due();
        }
        let stored = queue.waiting.pop_due(Instant::now)?;
        self.lane.in_flight.taken();
        for _ in 1..self.take_at_once(queue.waiting.len() + 1) {
            let Ok(more) = queue.waiting.pop_due(Instant::now) else {
                break;
            };
            self.lane.in_flight.taken();
            self.taken.push_back(more);
        }
        drop(queue);
        Ok(self.delivery(stored))
    }
}

impl MemorySubscription {
    /// Messages taken and never handed out go back to the queue, due at once — behind those waiting —
    /// unless its topic was deleted meanwhile: they go with it, as the messages waiting there did.
    fn return_taken(&mut self) {
        if self.taken.is_empty() {
            return;
        }
        if lock_queue(&self.lane.queue.cell).deleted {
            for _ in self.taken.drain(..) {
                self.lane.in_flight.landed();
            }
            return;
        }
        for stored in self.taken.drain(..) {
            self.lane.give_back(stored, Duration::ZERO);
        }
    }
}

impl Drop for MemorySubscription {
    fn drop(&mut self) {
        self.return_taken();
    }
}

#[async_trait]
impl Subscription for MemorySubscription {
    fn next_ready(&mut self) -> Option<Delivery> {
        self.take_due().ok()
    }

    async fn next(&mut self) -> Result<Option<Delivery>, Error> {
        if let Some(kind) = self.refusal() {
            return Err(Error::new(kind, "the broker refuses receives")
                .with_operation(format!("receive from {}", self.topic)));
        }
        // The broker outlives a lookup of the queue again (`take_due` may replace the lane).
        let broker = self.broker.clone();
        loop {
            // Register for arrivals before looking, so a message published in between is not missed.
            let arrival = broker.arrivals.notified();
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

    /// Lanes on the group's one queue: each takes the message due first when it asks, so together
    /// they hand out every message once, in the queue's order of taking; each counts what it has in
    /// flight on its own, so a settle takes no lock.
    fn give_back_taken(&mut self) {
        self.return_taken();
    }

    fn split_lanes(&mut self, more: usize) -> Vec<Box<dyn Subscription>> {
        self.lanes = more + 1;
        (0..more)
            .map(|_| {
                Box::new(MemorySubscription::new(self.lane.queue.clone(), more + 1))
                    as Box<dyn Subscription>
            })
            .collect()
    }
}

/// Settles one in-memory delivery; dropping it unsettled puts the message back at once.
pub(super) struct MemoryReceipt {
    lane: Arc<Lane>,
    original: Unsettled<Stored>,
}

impl std::ops::Deref for MemoryReceipt {
    type Target = GroupQueue;

    fn deref(&self) -> &GroupQueue {
        &self.lane.queue
    }
}

impl MemoryReceipt {
    /// Takes the original to settle it; it is no longer in flight.
    fn settle(&mut self) -> Result<Stored, Error> {
        let stored = self.original.take()?;
        self.lane.in_flight.landed();
        Ok(stored)
    }
}

#[async_trait]
impl Receipt for MemoryReceipt {
    async fn ack(&mut self) -> Result<(), Error> {
        self.settle().map(drop)
    }

    fn try_ack(&mut self) -> Option<Result<(), Error>> {
        Some(self.settle().map(drop))
    }

    async fn retry(&mut self, event: &Event, delay: Duration) -> Result<(), Error> {
        self.original.get()?;
        self.broker.enqueue(
            &self.topic,
            Some(&self.group),
            event.to_raw(),
            Instant::now() + delay,
            None,
        );
        self.broker.count_retry(&self.topic, &self.group);
        self.settle().map(drop)
    }

    async fn dead_letter(&mut self, event: &Event) -> Result<(), Error> {
        self.original.get()?;
        let mut state = self.broker.lock();
        if state.unwritable_dlq.contains(&*self.topic) {
            return Err(Error::new(Kind::Rejected, "the DLQ is not writable")
                .with_operation(format!("dead-letter to the DLQ of {}", self.topic)));
        }
        state.add_dead_letter(&self.topic, Some(self.group.to_string()), event);
        drop(state);
        self.settle().map(drop)
    }

    async fn release(&mut self, after: Duration) -> Result<(), Error> {
        let stored = self.original.take()?;
        self.lane.give_back(stored, after);
        Ok(())
    }
}

impl Drop for MemoryReceipt {
    fn drop(&mut self) {
        if let Some(stored) = self.original.take_unsettled() {
            self.lane.give_back(stored, Duration::ZERO);
        }
    }
}
