//! A subscription to one group's queue, and the receipt that settles each of its deliveries.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::broker::{Broker, QueueCell, Stored, landed, lock_queue};
use crate::adapter::{Delivery, DeliveryInfo, Receipt, Subscription, Unsettled};
use crate::error::{Error, Kind};
use crate::event::Event;
use crate::metadata::Origin;

pub(super) struct MemorySubscription {
    /// The broker and the group's queue, shared with every receipt (one reference count per delivery).
    pub(super) queue: Arc<GroupQueue>,
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
        &self.queue
    }
}

impl MemorySubscription {
    /// The kind of error receives fail with, if they are made to fail.
    pub(super) fn refusal(&self) -> Option<Kind> {
        self.broker.refusal(&self.topic)
    }

    /// Takes the head of the group's queue if it is due; otherwise tells when it will be. Only the
    /// group's queue is locked; a queue whose topic was deleted is looked up again (the topic declared
    /// anew, as a subscription to it would).
    pub(super) fn take_due(&mut self) -> Result<Delivery, Option<Instant>> {
        if self.refusal().is_some() {
            // Receives fail: `next` reports it.
            return Err(None);
        }
        let mut queue = lock_queue(&self.queue.cell);
        if queue.deleted {
            drop(queue);
            let GroupQueue {
                broker,
                topic,
                group,
                ..
            } = &*self.queue;
            self.queue = Arc::new(GroupQueue::of(broker.clone(), topic.clone(), group.clone()));
            queue = lock_queue(&self.queue.cell);
        }
        let stored = queue.waiting.pop_due(Instant::now)?;
        queue.in_flight += 1;
        drop(queue);
        Ok(Delivery {
            message: stored.raw.clone(),
            info: DeliveryInfo::at(Origin {
                offset: Some(stored.offset),
                ..Origin::new(self.topic.clone())
            }),
            receipt: Box::new(MemoryReceipt {
                queue: self.queue.clone(),
                original: Unsettled::new(stored),
            }),
        })
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
        // The broker outlives a lookup of the queue again (`take_due` may replace `self.queue`).
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
}

/// Settles one in-memory delivery; dropping it unsettled puts the message back at once.
pub(super) struct MemoryReceipt {
    pub(super) queue: Arc<GroupQueue>,
    pub(super) original: Unsettled<Stored>,
}

impl std::ops::Deref for MemoryReceipt {
    type Target = GroupQueue;

    fn deref(&self) -> &GroupQueue {
        &self.queue
    }
}

impl MemoryReceipt {
    /// Takes the original to settle it; it is no longer in flight.
    pub(super) fn settle(&mut self) -> Result<Stored, Error> {
        let stored = self.original.take()?;
        landed(&self.cell);
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
        let stored = self.settle()?;
        self.broker.enqueue(
            &self.topic,
            Some(&self.group),
            stored.raw,
            Instant::now() + after,
            Some(stored.offset),
        );
        Ok(())
    }
}

impl Drop for MemoryReceipt {
    fn drop(&mut self) {
        if let Some(stored) = self.original.take_unsettled() {
            landed(&self.cell);
            self.broker.enqueue(
                &self.topic,
                Some(&self.group),
                stored.raw,
                Instant::now(),
                Some(stored.offset),
            );
        }
    }
}
