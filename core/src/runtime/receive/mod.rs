//! The receive loop: take deliveries while there is room, hand each to a task, hold consumption while a
//! blocking error is active, and drain on shutdown.
//!
//! The loop never sleeps on a message: retries wait in the broker, in-place retries and blocking holds
//! wait inside the task that handles the event. A blocking error pauses the subscription (the loop stops
//! taking deliveries) until the held event gets past it. Shutdown stops receiving, lets in-flight handlers
//! finish within a grace period and releases whatever is left to the broker — nothing is lost.
//!
//! A delivery is first handled in the loop itself, as far as it goes without waiting (`process::start`):
//! decoded, claimed, its handler's call polled once and — when the call is done with success and the
//! receipt acknowledges without a round trip (`Receipt::try_ack`: Kafka's offsets, RabbitMQ's batched
//! acks, Pulsar's, the in-memory broker) — acknowledged, with no future of the runtime's own and no
//! task; only one that has to wait (a slow handler, a failure to carry out, a settle in flight) becomes
//! a task. For the common handler that is done at its first poll, a task per event bought nothing but
//! its allocation, its scheduling and — on a multi-threaded runtime — a wake-up of another worker thread
//! per event. On a multi-threaded runtime a handler that computes for long before it first waits would
//! be held to the loop's one thread, so there the loop times one first poll in every
//! [`Inlining::SAMPLE_EVERY`] and, while those take longer than [`Inlining::SPREAD_ABOVE`], makes every
//! delivery a task at once so that handlers spread over the cores. On a current-thread runtime every
//! task runs on that one thread anyway: always inline.
//!
//! On a multi-threaded runtime a consumer receives in lanes: its subscription split by the transport
//! (`Subscription::split_lanes`) into one receive loop per worker thread, each with its share of the
//! work slots and counters of its own, so that the loops run on every core without writing to what the
//! others write. A lane with no free slot gives back what its subscription took ahead
//! (`Subscription::give_back_taken`), so that it does not wait behind that lane's busy handlers while
//! another lane is idle. The lanes share the blocking-hold gate (one blocking error pauses every lane),
//! the shutdown and the health (a lane's receive failure reads as the consumer's until that lane
//! receives again) and the seeded jitter source (so which event draws which jitter depends on the lanes'
//! timing). A consumer asks for a single lane where lanes would break what it promises: per-key ordering
//! (a key's messages may reach either lane), concurrency 1, a batch handler whose batch needs every
//! slot; and a transport that cannot split keeps one.
//!
//! With a batch handler a delivery starts a batch instead: it and the deliveries the subscription
//! already holds (`next_ready`), up to the batch size, processed together (`process::process_batch`)
//! and polled first in the loop like a single delivery. A batch takes as many as there are free slots
//! for while half a batch of slots or more is free, and otherwise waits for its slots rather than start
//! small (see `ReceiveLoop::batch_from`).
//!
//! Whether a delivery is polled in the loop ([`inlining`]) and when receive errors stop the consumer
//! ([`permanent`]) are rules of their own, in files of their own.

mod inlining;
mod permanent;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::batch::BatchHandler;
use super::builder::GiveUp;
use super::error::ConsumerError;
use super::ordering::{self, KeyQueues};
use super::process::{self, Processing};
use super::shared::Shared;
use crate::adapter::{Delivery, Subscription};
use crate::error::Kind;
use inlining::{Inlining, Start};
use permanent::PermanentErrors;

/// A batch handler and the most events it is given at once.
pub(super) struct Batching {
    pub(super) handler: Arc<dyn BatchHandler>,
    pub(super) size: usize,
}

/// One receive lane's loop: its subscription, its work slots and the tasks handling its deliveries.
pub(super) struct ReceiveLoop {
    /// Before `shared`: dropped first when the loop is aborted, so that whatever its drop gives back to
    /// the broker is done once the lane's state is gone (`ConsumerHandle::abort` waits for that).
    subscription: Box<dyn Subscription>,
    shared: Arc<Shared>,
    pause: watch::Receiver<usize>,
    tasks: JoinSet<()>,
    slots: Arc<Semaphore>,
    /// Deliveries waiting behind their key (per-key ordering) hold one of these instead of a work permit,
    /// so one busy key cannot take every slot from the others; 4 × concurrency of them.
    queue_slots: Arc<Semaphore>,
    keys: Arc<KeyQueues>,
    grace: Duration,
    /// Whether a delivery is polled once in the loop before it becomes a task.
    inlining: Inlining,
    /// Permanent receive errors in a row, and when they make the consumer stop.
    permanent: PermanentErrors,
    /// The batch handler, when the consumer has one: each delivery then starts a batch of those at hand.
    batch: Option<Batching>,
    /// Deliveries handled in the loop so far, for the cooperative budget.
    inlined: u32,
    /// The clock as the last delivery settled in the loop ended, for the next one taken without
    /// waiting (see [`process::Reading`]).
    reading: process::Reading,
}

/// A work slot for the next delivery: taken already (it had to be waited for), or free — taken only once
/// the delivery needs it beyond the loop's own poll of it. Only the receive loop takes slots, so a slot
/// free when looked at stays free until the loop takes it.
enum Slot {
    Held(tokio::sync::OwnedSemaphorePermit),
    Free,
}

impl Slot {
    /// The slot itself, taken from `slots` now if it was free (`None` only if they were closed).
    fn take(self, slots: &Arc<Semaphore>) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match self {
            Slot::Held(permit) => Some(permit),
            Slot::Free => slots.clone().try_acquire_owned().ok(),
        }
    }
}

impl ReceiveLoop {
    /// Lane loop over `subscription`, with `slots` work slots of its own and the state it shares with
    /// its tasks; `batch` is the consumer's batch handler, if it has one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        shared: Arc<Shared>,
        subscription: Box<dyn Subscription>,
        pause: watch::Receiver<usize>,
        slots: usize,
        grace: Duration,
        single_thread: bool,
        give_up: GiveUp,
        batch: Option<&Batching>,
    ) -> Self {
        Self {
            shared,
            subscription,
            pause,
            tasks: JoinSet::new(),
            slots: Arc::new(Semaphore::new(slots)),
            queue_slots: Arc::new(Semaphore::new(slots.saturating_mul(4))),
            keys: Arc::new(KeyQueues::default()),
            grace,
            inlining: Inlining::new(single_thread),
            permanent: PermanentErrors::new(give_up),
            // A batch never needs more slots than its lane has (`lane_count` gives each lane a whole
            // batch of them; a batch waiting for more would wait for ever).
            batch: batch.map(|batching| Batching {
                handler: batching.handler.clone(),
                size: batching.size.min(slots),
            }),
            inlined: 0,
            reading: process::Reading::default(),
        }
    }

    /// `slot`, taken.
    fn take(&self, slot: Slot) -> Option<tokio::sync::OwnedSemaphorePermit> {
        slot.take(&self.slots)
    }

    /// On a multi-threaded runtime, deliveries handled in the loop per unit of the cooperative budget.
    /// The loop yields once its budget (128 units) is spent, and a task that yields there is taken up
    /// by an idle worker thread, which another thread must wake (a system call) and which then reads
    /// the loop's state from the other core's caches: with a unit per delivery that happened every 128
    /// deliveries, and the runtime bench ran slower than with a unit per 8 (alternating runs of each).
    /// Every 1,024 deliveries the other tasks of the thread
    /// still get their turn; on a current-thread runtime, where nothing else can run meanwhile, every
    /// delivery takes a unit.
    const BUDGET_EVERY: u32 = 8;

    pub(super) async fn run(mut self) -> Result<(), ConsumerError> {
        let shutdown = self.shared.shutdown.clone();
        let mut receive_backoff = Duration::from_millis(100);
        // Whether the last receive failed (the health says so until one succeeds).
        let mut failing = false;
        loop {
            self.reap_finished_tasks();
            if shutdown.is_triggered() {
                break;
            }
            // The last delivery's end reading serves the next one only if the loop takes it without
            // waiting and polls it in place; every other way drops it. Taken before the pause check: a
            // hold waits, and a reading kept through it would date the next delivery before the hold.
            let mut reading = std::mem::take(&mut self.reading);
            if *self.pause.borrow_and_update() > 0 {
                self.hold_consumption().await;
                continue;
            }
            // Shutdown and pause were checked just above. While work flows, a free slot and a delivery
            // that is already there are taken without waiting on anything else (registering for
            // shutdown and pause changes twice per event cost more than the rest of the loop); only
            // when one of them must be waited for does the loop wait on shutdown and pause too.
            // A free slot is taken only once a delivery needs it for longer than the loop's own poll
            // (`Slot::Free`): only this loop takes slots, so one free now stays free until then.
            let permit = if self.slots.available_permits() > 0 {
                Slot::Free
            } else {
                // What this lane took ahead goes to the other lanes while its slots are busy.
                self.subscription.give_back_taken();
                reading.forget();
                // `biased`: once shutdown is asked for, no new delivery is taken.
                tokio::select! {
                    biased;
                    () = shutdown.triggered() => break,
                    _ = self.pause.changed() => continue,
                    permit = self.slots.clone().acquire_owned() => match permit {
                        Ok(p) => Slot::Held(p),
                        Err(_) => break,
                    },
                }
            };
            // The delivery first: one already at hand is taken without a future; when one is there,
            // shutdown and pause are not polled (nor registered with).
            let next = match self.subscription.next_ready() {
                Some(delivery) => Ok(Some(delivery)),
                None => {
                    reading.forget();
                    tokio::select! {
                    biased;
                    next = self.subscription.next() => next,
                    () = shutdown.triggered() => break,
                    _ = self.pause.changed() => continue,
                    }
                }
            };
            if shutdown.is_triggered() {
                // A delivery taken together with shutdown is handled as in-flight work (the drain waits
                // for it within the grace period): given back, it would be received again, which on a
                // broker that counts receives as attempts (SQS) costs the event an attempt.
                if let (Ok(Some(delivery)), Some(permit)) = (next, self.take(permit)) {
                    let spawned = self.dispatch(delivery, permit, Start::Task);
                    debug_assert!(spawned.is_none(), "a Start::Task dispatch runs as a task");
                }
                break;
            }
            match next {
                Ok(Some(delivery)) => {
                    if failing {
                        failing = false;
                        self.shared.health.received();
                    }
                    receive_backoff = Duration::from_millis(100);
                    self.permanent.reset();
                    let start = self.inlining.next();
                    let per_event = self.batch.is_none() && self.shared.parking.is_none();
                    if per_event && start != Start::Task {
                        let started = (start == Start::InlineTimed).then(Instant::now);
                        self.start_inline(delivery, permit, reading).await;
                        if let Some(started) = started {
                            self.inlining.timed(started.elapsed());
                        }
                    } else if let Some(permit) = self.take(permit)
                        && let Some((processing, events)) = self.dispatch(delivery, permit, start)
                    {
                        let started = (start == Start::InlineTimed).then(Instant::now);
                        self.run_inline_first(processing).await;
                        if let Some(started) = started {
                            // A batch's first poll handles each of its events: the time per event
                            // is what tells a handler that computes before it waits.
                            self.inlining.timed(started.elapsed() / events.max(1));
                        }
                    } else {
                        // A delivery taken at hand and spawned waited on nothing: the loop counts it
                        // against the cooperative budget, as the inline path does.
                        tokio::task::coop::consume_budget().await;
                    }
                }
                Ok(None) => break,
                Err(e) if e.kind() == Kind::Closed => break,
                Err(e) => {
                    failing = true;
                    self.shared.health.receive_failed(&e.to_string());
                    self.shared
                        .counters
                        .error(&self.shared.counters.receive_errors, e.to_string());
                    if e.is_temporary() {
                        warn!(error = %e, "receive failed; retrying");
                        self.permanent.reset();
                    } else if let Some((failures, over)) = self.permanent.failed(Instant::now()) {
                        tracing::error!(error = %e, failures, "receive keeps failing with a permanent error: stopping the consumer");
                        // In-flight work finishes (or is given back) before the consumer reports.
                        if let Err(close) = self.drain().await {
                            warn!(error = %close, "closing the subscription failed");
                        }
                        return Err(ConsumerError::ReceiveFailed {
                            failures,
                            over,
                            last: e,
                        });
                    } else {
                        tracing::error!(error = %e, "receive failed with a permanent error; retrying");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(receive_backoff) => {}
                        () = shutdown.triggered() => break,
                    }
                    receive_backoff = (receive_backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        self.drain().await
    }

    /// Logs tasks that ended by panicking (a panicking handler is caught in `process`; this catches the
    /// rest, e.g. a panicking idempotency store).
    fn reap_finished_tasks(&mut self) {
        while let Some(result) = self.tasks.try_join_next() {
            if let Err(e) = result
                && e.is_panic()
            {
                tracing::error!(error = %e, "a delivery task panicked; its delivery was released");
            }
        }
    }

    /// Pauses the subscription until no blocking hold is active (or shutdown). A broker error pausing or
    /// resuming is counted and logged; consumption stays held by the loop either way.
    async fn hold_consumption(&mut self) {
        if let Err(e) = self.subscription.pause().await {
            warn!(error = %e, "pausing the subscription failed");
            self.shared
                .counters
                .error(&self.shared.counters.receive_errors, e.to_string());
        }
        loop {
            tokio::select! {
                changed = self.pause.changed() => {
                    if changed.is_err() || *self.pause.borrow_and_update() == 0 {
                        break;
                    }
                }
                () = self.shared.shutdown.triggered() => break,
            }
        }
        if let Err(e) = self.subscription.resume().await {
            warn!(error = %e, "resuming the subscription failed");
            self.shared
                .counters
                .error(&self.shared.counters.receive_errors, e.to_string());
        }
    }

    /// Handles `delivery` here as far as it goes without waiting ([`process::start`]); what is left of
    /// it goes on as a task. A panic outside the handler (which is caught inside) is logged as a task's
    /// would be, and the delivery, dropped unsettled, goes back to the broker.
    async fn start_inline(
        &mut self,
        delivery: Delivery,
        slot: Slot,
        mut reading: process::Reading,
    ) {
        let (shared, slots) = (&self.shared, &self.slots);
        let mut once = Some((delivery, slot));
        let rest = std::future::poll_fn(|cx| {
            Poll::Ready(std::panic::catch_unwind(AssertUnwindSafe(|| {
                once.take().and_then(|(delivery, slot)| {
                    process::start(shared, delivery, || slot.take(slots), cx, &mut reading)
                })
            })))
        })
        .await;
        match rest {
            Ok(None) => {}
            Ok(Some(processing)) => {
                self.tasks.spawn(processing);
            }
            Err(_) => {
                tracing::error!("a delivery's processing panicked; its delivery was released");
            }
        }
        // Work done in the loop itself counts against the runtime's cooperative budget (see
        // `run_inline_first`) — on a multi-threaded runtime one unit per `BUDGET_EVERY` deliveries.
        self.inlined = self.inlined.wrapping_add(1);
        if self.inlining.single_thread || self.inlined.is_multiple_of(Self::BUDGET_EVERY) {
            // The budget may yield the thread here: the reading would stand for a time before that.
            tokio::task::coop::consume_budget().await;
        } else {
            self.reading = reading;
        }
    }

    /// Polls `processing` once here; if it has to wait, it goes on as a task. A panic in it (a handler's
    /// is caught inside; this is the rest, e.g. an idempotency store's) is logged as a task's would be,
    /// and its delivery, dropped unsettled, goes back to the broker.
    async fn run_inline_first(&mut self, mut processing: Processing) {
        let first = std::future::poll_fn(|cx| {
            Poll::Ready(std::panic::catch_unwind(AssertUnwindSafe(|| {
                processing.as_mut().poll(cx)
            })))
        })
        .await;
        match first {
            Ok(Poll::Ready(())) => {}
            Ok(Poll::Pending) => {
                self.tasks.spawn(processing);
            }
            Err(_) => {
                tracing::error!("a delivery's processing panicked; its delivery was released");
            }
        }
        // Work done in the loop itself counts against the runtime's cooperative budget, so a stream of
        // deliveries that are always ready cannot starve the thread's other tasks and timers.
        tokio::task::coop::consume_budget().await;
    }

    /// Starts a delivery's processing: as a task, or (when `start` says so and there is no per-key
    /// ordering) returned for [`ReceiveLoop::run_inline_first`] with the number of events it handles
    /// (1, or a batch's length).
    fn dispatch(
        &mut self,
        delivery: Delivery,
        permit: tokio::sync::OwnedSemaphorePermit,
        start: Start,
    ) -> Option<(Processing, u32)> {
        if let Some(batching) = &self.batch {
            let (handler, size) = (batching.handler.clone(), batching.size);
            let (processing, events) = self.batch_from(delivery, permit, handler, size);
            if start != Start::Task {
                return Some((processing, events));
            }
            self.tasks.spawn(processing);
            return None;
        }
        let shared = self.shared.clone();
        let ordered_key = shared.parking.as_ref().and(delivery.message.key.clone());
        match ordered_key {
            // A delivery polled first in the loop takes `start_inline` instead.
            None => {
                self.tasks.spawn(process::process(shared, delivery, permit));
            }
            Some(key) => {
                let queue_slots = self.queue_slots.clone();
                let claimed = self.keys.claim_or_queue(&key, delivery, permit, || {
                    queue_slots.try_acquire_owned().ok()
                });
                // Queued behind its key: the key's running task takes it later.
                let (mut delivery, task_permit) = claimed?;
                // Frees the key (releasing whatever queued behind it) even if processing panics.
                let mut key_guard = ordering::KeyGuard::new(self.keys.clone(), key);
                self.tasks.spawn(async move {
                    // The task holds one work permit for its whole life: one key, one event at a time.
                    let _task_permit = task_permit;
                    loop {
                        if shared.shutdown.is_triggered() {
                            drop(delivery); // released to the broker unsettled
                        } else {
                            process::process(shared.clone(), delivery, ()).await;
                        }
                        match key_guard.next() {
                            // The queued delivery's own permit (a queue slot) is no longer needed.
                            Some((next, _queued_permit)) => delivery = next,
                            None => break,
                        }
                    }
                });
            }
        }
        None
    }

    /// A batch's processing by `handler`, and its length: `first` and the deliveries the subscription
    /// has at hand, up to `size`. None is waited for; once shutdown is asked for, `first` goes alone.
    ///
    /// Each event in flight holds a slot. While at least half a batch of slots is free (`first`'s
    /// included), the batch takes as many deliveries as there are free slots for, and takes the slots
    /// at once: only this loop takes slots, so those free when counted are still free then (one
    /// semaphore operation per batch, not two per event). With fewer free, it still takes up to `size`
    /// and its processing first waits for their slots, which the batches in flight give back as they
    /// end. Started with the few slots free, a batch would be small, and end when those few came back:
    /// with 64 slots and batches of 64, a slow handler's calls alternated 63 and 1 events for as long
    /// as a backlog lasted. The slots' queue is first come, first served, so the loop's own wait for a
    /// slot comes after the batch's: at most one batch waits, holding at most `size` deliveries.
    fn batch_from(
        &mut self,
        first: Delivery,
        permit: tokio::sync::OwnedSemaphorePermit,
        handler: Arc<dyn BatchHandler>,
        size: usize,
    ) -> (Processing, u32) {
        let free = self.slots.available_permits();
        let room = if self.shared.shutdown.is_triggered() {
            0
        } else if free + 1 >= size / 2 {
            free.min(size.saturating_sub(1))
        } else {
            size.saturating_sub(1)
        };
        let mut deliveries = Vec::with_capacity(room + 1);
        deliveries.push(first);
        while deliveries.len() <= room {
            let Some(delivery) = self.subscription.next_ready() else {
                break;
            };
            deliveries.push(delivery);
        }
        let more = u32::try_from(deliveries.len() - 1).unwrap_or(u32::MAX);
        let taken = match more {
            0 => Ok(permit),
            more => match self.slots.clone().try_acquire_many_owned(more) {
                Ok(taken) => {
                    let mut permits = permit;
                    permits.merge(taken);
                    Ok(permits)
                }
                Err(_) => Err((permit, more)),
            },
        };
        let events = u32::try_from(deliveries.len()).unwrap_or(u32::MAX);
        let (shared, slots) = (self.shared.clone(), self.slots.clone());
        let processing = Box::pin(async move {
            let permits = match taken {
                Ok(permits) => permits,
                Err((mut permits, more)) => match slots.acquire_many_owned(more).await {
                    Ok(taken) => {
                        permits.merge(taken);
                        permits
                    }
                    // Not while the consumer runs (its slots are never closed): the deliveries
                    // beyond the slot held go back to the broker unhandled.
                    Err(e) => {
                        warn!(error = %e, "no slots for a batch's deliveries; releasing them");
                        deliveries.truncate(1);
                        permits
                    }
                },
            };
            process::process_batch(shared, deliveries, handler).await;
            drop(permits);
        });
        (processing, events)
    }

    /// Waits for in-flight work within the grace period, then releases what is left and leaves.
    async fn drain(mut self) -> Result<(), ConsumerError> {
        let finished = tokio::time::timeout(self.grace, async {
            while let Some(result) = self.tasks.join_next().await {
                if let Err(e) = result
                    && e.is_panic()
                {
                    tracing::error!(error = %e, "a delivery task panicked; its delivery was released");
                }
            }
        })
        .await;
        if finished.is_err() {
            warn!(
                remaining = self.tasks.len(),
                "shutdown grace elapsed; releasing in-flight events to the broker"
            );
            self.tasks.shutdown().await;
        }
        self.subscription.close().await?;
        info!(topic = %self.shared.spec.topic, "consumer stopped");
        Ok(())
    }
}
