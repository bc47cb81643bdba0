//! The receive loop and the receipts.
//!
//! With a retry queue (the `retry_queue` setting, standard queues) a retry is a copy with its metadata,
//! sent there with its delay, and the original is deleted once SQS accepted it. The subscription keeps a
//! receive running on the retry queue beside the source's and hands out what it brings first: in the
//! source queue a retry that becomes visible waits behind every message already visible there, so under a
//! backlog it would run as late as the backlog is long. The retry queue gets short polls, `retry_poll`
//! apart while they find nothing: a waiting long poll is woken by every copy sent to the queue, and
//! ElasticMQ re-examines the whole queue at each wake.
//!
//! Otherwise a retry is the received message itself: `ChangeMessageVisibility(delay)` hides it and SQS
//! brings it back, its `ApproximateReceiveCount` counting the attempts. The metadata the runtime updated (the error,
//! the due time) is kept in this process and given back when the message returns here; a message that
//! returns to another process carries the broker's counts only. A retry that would end beyond the 12 h
//! visibility window (or the queue's retention) is carried instead: a copy with its metadata is sent and
//! the original deleted; on arrival, a copy that is not due yet is hidden again, so no delay is ever
//! capped. So is a retry on a standard queue once `remembered_retries` retries wait already: what this
//! process holds per waiting retry is bounded, however many wait in the queue. While a handler runs, a
//! heartbeat keeps its message hidden.
//!
//! `next` is cancel-safe: a receive in flight is kept in the subscription and finished by the next call,
//! so a dropped call loses no message (and does not inflate its receive count).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use event_retry_core::adapter::{Delivery, DeliveryInfo, Receipt, Subscription, SubscriptionSpec};
use event_retry_core::error::{Error, Kind};
use event_retry_core::event::Event;
use event_retry_core::metadata::{self, Origin, Packing};
use event_retry_core::time::Timestamp;
use tokio::sync::Mutex;
use tracing::{debug, warn};

use crate::batch::{Op, Settler, SqsBatches};
use crate::codec;
use crate::error::sdk_error;
use crate::link::{Link, SendOptions, seconds_up};
use crate::queues::QueueInfo;

/// Room left before a visibility window or retention ends, for clocks and requests in flight.
const MARGIN: Duration = Duration::from_secs(2);

/// A receive running in the background: it goes on while the runtime handles the previous batch, and a
/// cancelled `next` leaves it to the following call.
type Receive = tokio::task::JoinHandle<Result<Vec<Received>, Error>>;

/// A message and when it was received.
pub(crate) struct Received {
    message: Message,
    at: Instant,
}

/// One queue a subscription receives from: the source, or its retry queue (the `retry_queue` setting).
struct Lane {
    /// What this lane's receipts settle, send copies and dead-letter with: the source's, with `url` the
    /// lane's own queue.
    queue: QueueInfo,
    /// Deletes and visibility changes of this queue's messages, in batches.
    settler: Settler,
    buffer: VecDeque<Received>,
    pending: Option<Receive>,
    /// Short polls, this long apart while they find nothing (the retry queue); `None`: long polling.
    idle_poll: Option<Duration>,
    /// The last receive brought nothing.
    last_empty: bool,
}

impl Lane {
    fn new(link: &Link, queue: QueueInfo) -> Self {
        let settler = Settler::new(Arc::new(SqsBatches {
            client: link.queues.client.clone(),
            url: queue.url.clone(),
        }));
        Self {
            queue,
            settler,
            buffer: VecDeque::new(),
            pending: None,
            idle_poll: None,
            last_empty: false,
        }
    }

    /// The source's lane and, with the `retry_queue` setting, the retry queue's.
    fn of(link: &Link, source: &QueueInfo) -> (Self, Option<Self>) {
        let retry = source.retry.as_ref().map(|retry| {
            let queue = QueueInfo {
                url: retry.url.clone(),
                ..source.clone()
            };
            Self {
                // Short polls (`SqsConfig::retry_poll`): a long poll there is woken by every copy sent
                // to it, and ElasticMQ re-examines the whole queue at each wake.
                idle_poll: Some(link.queues.config.retry_poll),
                ..Self::new(link, queue)
            }
        });
        (Self::new(link, source.clone()), retry)
    }

    /// Takes `queue` (the queue looked up again): a new settler if its URL changed.
    fn update(&mut self, link: &Link, queue: QueueInfo) {
        if queue.url != self.queue.url {
            *self = Self {
                idle_poll: self.idle_poll,
                ..Self::new(link, queue)
            };
        } else {
            self.queue = queue;
        }
    }

    /// Starts a receive unless one is running or messages are buffered.
    fn receive_if_idle(&mut self, link: &Link, spec: &SubscriptionSpec) {
        if self.buffer.is_empty() && self.pending.is_none() {
            let poll = match self.idle_poll {
                None => Poll::Long,
                Some(_) if !self.last_empty => Poll::Short(Duration::ZERO),
                Some(idle) => Poll::Short(link.retry_poll_pause(idle)),
            };
            self.pending = Some(receive(link, spec, &self.queue.url, poll));
        }
    }

    /// Waits for the receive in flight (if any) and keeps what it brought in the buffer.
    async fn finish_receive(&mut self) {
        if let Some(pending) = self.pending.take()
            && let Ok(Ok(received)) = pending.await
        {
            self.buffer.extend(received);
        }
    }

    /// Gives buffered messages back (visibility 0), e.g. before a long pause.
    async fn release_buffer(&mut self, link: &Link) {
        for r in self.buffer.drain(..) {
            if let Some(handle) = r.message.receipt_handle() {
                let _ = link
                    .queues
                    .client
                    .change_message_visibility()
                    .queue_url(&self.queue.url)
                    .receipt_handle(handle)
                    .visibility_timeout(0)
                    .send()
                    .await;
            }
        }
    }

    /// In a drop: gives back what is buffered and what the receive in flight brings, in the background.
    fn release_in_background(&mut self, link: &Link) {
        let pending = self.pending.take();
        let buffered: Vec<String> = self
            .buffer
            .drain(..)
            .filter_map(|r| r.message.receipt_handle().map(str::to_string))
            .collect();
        if pending.is_none() && buffered.is_empty() {
            return;
        }
        let (client, url) = (link.queues.client.clone(), self.queue.url.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let mut handles = buffered;
                if let Some(pending) = pending
                    && let Ok(Ok(received)) = pending.await
                {
                    handles.extend(
                        received
                            .iter()
                            .filter_map(|r| r.message.receipt_handle().map(str::to_string)),
                    );
                }
                for handle in handles {
                    let _ = client
                        .change_message_visibility()
                        .queue_url(&url)
                        .receipt_handle(handle)
                        .visibility_timeout(0)
                        .send()
                        .await;
                }
            });
        }
    }
}

/// Which lane a message or a receive belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Source,
    Retry,
}

/// One consumer of a queue (and of its retry queue, with the `retry_queue` setting).
pub(crate) struct SqsSubscription {
    link: Arc<Link>,
    spec: SubscriptionSpec,
    /// The queue's name: the topic's, or with SNS the group's queue.
    queue_name: String,
    source: Lane,
    /// Received beside the source and handed out first, so a due retry does not wait behind the
    /// source's backlog.
    retry: Option<Lane>,
    paused: bool,
}

impl SqsSubscription {
    pub(crate) fn new(
        link: Arc<Link>,
        spec: SubscriptionSpec,
        queue_name: String,
        queue: QueueInfo,
    ) -> Self {
        let (source, retry) = Lane::of(&link, &queue);
        Self {
            link,
            spec,
            queue_name,
            source,
            retry,
            paused: false,
        }
    }

    fn lane_mut(&mut self, side: Side) -> Option<&mut Lane> {
        match side {
            Side::Source => Some(&mut self.source),
            Side::Retry => self.retry.as_mut(),
        }
    }

    /// The lane to hand out from: the retry queue's while it holds messages.
    fn next_side(&self) -> Option<Side> {
        if self.retry.as_ref().is_some_and(|l| !l.buffer.is_empty()) {
            Some(Side::Retry)
        } else if !self.source.buffer.is_empty() {
            Some(Side::Source)
        } else {
            None
        }
    }

    /// Starts a receive on every lane with nothing buffered and none running: the next batch is on its
    /// way while this one is handled, and the retry queue is polled beside the source.
    fn receive_ahead(&mut self) {
        self.source.receive_if_idle(&self.link, &self.spec);
        if let Some(retry) = self.retry.as_mut() {
            retry.receive_if_idle(&self.link, &self.spec);
        }
    }

    /// Keeps what a finished receive of `side` brought; a missing queue is looked up again (and its
    /// error surfaced).
    async fn received(
        &mut self,
        side: Side,
        result: Result<Result<Vec<Received>, Error>, tokio::task::JoinError>,
    ) -> Result<(), Error> {
        let received = result.map_err(|e| {
            Error::from_source(Kind::Other, e).with_operation("receive (the task failed)")
        })?;
        match received {
            Ok(received) => {
                if let Some(lane) = self.lane_mut(side) {
                    lane.last_empty = received.is_empty();
                    lane.buffer.extend(received);
                }
                Ok(())
            }
            Err(e) if e.kind() == Kind::NotFound => {
                self.find_queue_again().await;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// The retry queue's receive, if it finished: what it brought goes ahead of the source's buffer.
    async fn take_finished_retries(&mut self) -> Result<(), Error> {
        let Some(lane) = self.retry.as_mut() else {
            return Ok(());
        };
        if !lane.pending.as_ref().is_some_and(|p| p.is_finished()) {
            return Ok(());
        }
        let Some(pending) = lane.pending.take() else {
            return Ok(());
        };
        let result = pending.await;
        self.received(Side::Retry, result).await
    }

    /// Waits for the first receive in flight to finish.
    async fn first_receive(
        &mut self,
    ) -> (
        Side,
        Result<Result<Vec<Received>, Error>, tokio::task::JoinError>,
    ) {
        let retry = self.retry.as_mut().and_then(|l| l.pending.as_mut());
        let (side, result) = match (self.source.pending.as_mut(), retry) {
            (Some(source), Some(retry)) => tokio::select! {
                r = retry => (Side::Retry, r),
                r = source => (Side::Source, r),
            },
            (Some(source), None) => (Side::Source, source.await),
            (None, Some(retry)) => (Side::Retry, retry.await),
            (None, None) => return std::future::pending().await,
        };
        if let Some(lane) = self.lane_mut(side) {
            lane.pending = None;
        }
        (side, result)
    }

    /// The queue is gone (deleted, or an SQS-compatible server restarted empty): looks it up again,
    /// which creates it anew (with its DLQ, redrive policy and retry queue) when creating queues is on.
    /// The error that showed it is still surfaced, and the runtime receives again after its backoff.
    async fn find_queue_again(&mut self) {
        self.link.forget_source(&self.spec.topic, &self.queue_name);
        match self
            .link
            .source_queue(&self.spec.topic, &self.spec.group)
            .await
        {
            Ok((_, queue)) => {
                warn!(queue = %self.queue_name, "the queue was missing; found or created it again");
                let (source, retry) = Lane::of(&self.link, &queue);
                self.source.update(&self.link, source.queue);
                match (self.retry.as_mut(), retry) {
                    (Some(lane), Some(retry)) => lane.update(&self.link, retry.queue),
                    (_, retry) => self.retry = retry,
                }
            }
            Err(e) => warn!(queue = %self.queue_name, error = %e, "the queue is missing"),
        }
    }
}

/// How one receive waits for messages.
#[derive(Clone, Copy, Debug)]
enum Poll {
    /// Long polling, `SqsConfig::wait`.
    Long,
    /// A short poll (no wait) after this pause.
    Short(Duration),
}

/// Starts a receive of up to the subscription's in-flight bound (at most 10, SQS's batch) from `url`.
fn receive(link: &Link, spec: &SubscriptionSpec, url: &str, poll: Poll) -> Receive {
    let client = link.queues.client.clone();
    let config = &link.queues.config;
    let url = url.to_string();
    let batch = i32::try_from(spec.max_in_flight.clamp(1, 10)).unwrap_or(10);
    let visibility = seconds_up(config.visibility);
    let (wait, pause) = match poll {
        Poll::Long => (seconds_up(config.wait), Duration::ZERO),
        Poll::Short(pause) => (0, pause),
    };
    tokio::spawn(async move {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        crate::link::asking_system_attributes(client.receive_message())
            .queue_url(&url)
            .max_number_of_messages(batch)
            .visibility_timeout(visibility)
            .wait_time_seconds(wait)
            .message_attribute_names("All")
            .send()
            .await
            .map(|out| {
                let at = Instant::now();
                let messages = out.messages.unwrap_or_default();
                messages
                    .into_iter()
                    .map(|message| Received { message, at })
                    .collect()
            })
            .map_err(|e| sdk_error("receive", e))
    })
}

/// The parts of a subscription a delivery is built from (borrowed apart from the pending receive, which
/// is not `Sync`).
struct Parts<'a> {
    link: &'a Arc<Link>,
    spec: &'a SubscriptionSpec,
    queue_name: &'a str,
    lane: &'a Lane,
}

impl Parts<'_> {
    /// Hides a copy that is not due yet until it is (or as long as SQS allows); `true` if it was hidden.
    async fn hide_until_due(&self, m: &Message, raw: &event_retry_core::event::RawMessage) -> bool {
        let (meta, _, _) = metadata::decode_lenient(&raw.headers);
        let Some(due) = meta.due_at else { return false };
        let now = Timestamp::now();
        // Not due yet, by however little: hidden again (a visibility timeout is whole seconds, rounded
        // up), so a carried retry is never handed out before its due time.
        if due <= now {
            return false;
        }
        let remaining = due
            .since(now)
            .min(self.link.queues.config.max_visibility - MARGIN);
        let Some(handle) = m.receipt_handle() else {
            return false;
        };
        let hidden = self
            .lane
            .settler
            .settle(handle, Op::Hide(seconds_up(remaining)))
            .await;
        debug!(
            ?remaining,
            ok = hidden.is_ok(),
            "a carried retry is not due yet; hidden again"
        );
        // If hiding failed, the copy is left alone: it comes back after the receive's visibility.
        true
    }

    async fn deliver(&self, received: Received) -> Option<Delivery> {
        let m = received.message;
        let codec::Decoded {
            mut raw,
            attributes,
            copy,
        } = codec::decode(&m);
        if copy && self.hide_until_due(&m, &raw).await {
            return None;
        }
        let message_id = m.message_id().unwrap_or_default().to_string();
        let receive_count: Option<u32> = m
            .attributes()
            .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
            .and_then(|s| s.parse().ok());
        let sent_at = m
            .attributes()
            .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
            .and_then(|s| s.parse::<u64>().ok())
            .map(Timestamp::from_millis);
        if !copy && let Some(meta) = self.link.recall(&message_id) {
            let (_, foreign, _) = metadata::decode_lenient(&raw.headers);
            raw.headers = metadata::encode_with(&meta, &foreign, Packing::Single);
        }
        // A copy counts in its metadata; the original's receive count includes every earlier delivery.
        let broker_count = (!copy).then(|| receive_count.unwrap_or(1).saturating_sub(1));
        let receipt = SqsReceipt::new(
            self.link.clone(),
            self.lane.settler.clone(),
            self.queue_name.to_string(),
            self.lane.queue.clone(),
            m.receipt_handle().unwrap_or_default().to_string(),
            message_id.clone(),
            copy,
            attributes,
            received.at,
            sent_at,
        );
        let info = DeliveryInfo::new(message_id, Origin::new(self.spec.topic.clone()));
        let info = match broker_count {
            Some(n) => info.with_broker_counts(n, n),
            None => info,
        };
        Some(Delivery::new(raw, info, Box::new(receipt)))
    }
}

#[async_trait]
impl Subscription for SqsSubscription {
    async fn next(&mut self) -> Result<Option<Delivery>, Error> {
        let visibility = self.link.queues.config.visibility;
        let fresh_for = visibility.saturating_sub(MARGIN.min(visibility / 2));
        loop {
            self.take_finished_retries().await?;
            if let Some(side) = self.next_side() {
                let Some(lane) = self.lane_mut(side) else {
                    continue;
                };
                let Some(r) = lane.buffer.pop_front() else {
                    continue;
                };
                // A message buffered past its visibility may be with another consumer by now.
                if r.at.elapsed() >= fresh_for {
                    continue;
                }
                // Receive the next batch while this one is handled.
                if !self.paused {
                    self.receive_ahead();
                }
                let lane = match side {
                    Side::Retry => self.retry.as_ref().unwrap_or(&self.source),
                    Side::Source => &self.source,
                };
                let parts = Parts {
                    link: &self.link,
                    spec: &self.spec,
                    queue_name: &self.queue_name,
                    lane,
                };
                if let Some(d) = parts.deliver(r).await {
                    return Ok(Some(d));
                }
                continue;
            }
            if self.paused {
                return std::future::pending().await;
            }
            self.receive_ahead();
            let (side, result) = self.first_receive().await;
            self.received(side, result).await?;
        }
    }

    async fn pause(&mut self) -> Result<(), Error> {
        self.paused = true;
        // A receive in flight ends within the long-poll wait; what it brings goes back too.
        for lane in std::iter::once(&mut self.source).chain(self.retry.as_mut()) {
            lane.finish_receive().await;
            lane.release_buffer(&self.link).await;
        }
        Ok(())
    }

    async fn resume(&mut self) -> Result<(), Error> {
        self.paused = false;
        Ok(())
    }

    async fn close(mut self: Box<Self>) -> Result<(), Error> {
        let this = &mut *self;
        for lane in std::iter::once(&mut this.source).chain(this.retry.as_mut()) {
            lane.finish_receive().await;
            lane.release_buffer(&this.link).await;
        }
        Ok(())
    }
}

impl Drop for SqsSubscription {
    /// A subscription dropped without `close` (a crash, an abort) still gives back what it received but
    /// did not hand out, so it is not held until its visibility runs out.
    fn drop(&mut self) {
        self.source.release_in_background(&self.link);
        if let Some(retry) = self.retry.as_mut() {
            retry.release_in_background(&self.link);
        }
    }
}

/// Settles one received message. Dropping it unsettled makes the message visible again at once.
struct SqsReceipt {
    link: Arc<Link>,
    settler: Settler,
    /// The name of the queue the message came from.
    topic: String,
    queue: QueueInfo,
    handle: String,
    message_id: String,
    copy: bool,
    /// The message's own attributes, which a copy of it writes again.
    attributes: codec::Attributes,
    /// Its DLQ copy was sent (only the delete of the original is left).
    dead_lettered: bool,
    received_at: Instant,
    sent_at: Option<Timestamp>,
    /// `true` once settled; the heartbeat takes it for each extension, so none races a settle.
    settled: Arc<Mutex<bool>>,
    heartbeat: tokio::task::AbortHandle,
}

impl SqsReceipt {
    #[allow(clippy::too_many_arguments)]
    fn new(
        link: Arc<Link>,
        settler: Settler,
        topic: String,
        queue: QueueInfo,
        handle: String,
        message_id: String,
        copy: bool,
        attributes: codec::Attributes,
        received_at: Instant,
        sent_at: Option<Timestamp>,
    ) -> Self {
        let settled = Arc::new(Mutex::new(false));
        let visibility = link.queues.config.visibility;
        let max_visibility = link.queues.config.max_visibility;
        let beat = {
            let (settler, handle, settled) = (settler.clone(), handle.clone(), settled.clone());
            tokio::spawn(async move {
                loop {
                    // Timed from the receive, not the hand-out: a message that waited in the buffer is
                    // extended before its first visibility runs out.
                    let age = received_at.elapsed();
                    let beats = age.as_millis() / (visibility / 2).as_millis().max(1) + 1;
                    let next_beat = (visibility / 2) * u32::try_from(beats).unwrap_or(u32::MAX);
                    tokio::time::sleep(next_beat.saturating_sub(age)).await;
                    let guard = settled.lock().await;
                    let left = max_visibility.saturating_sub(received_at.elapsed() + MARGIN);
                    if *guard || left.is_zero() {
                        return;
                    }
                    let _ = settler
                        .settle(&handle, Op::Hide(seconds_up(visibility.min(left))))
                        .await;
                }
            })
        };
        Self {
            link,
            settler,
            topic,
            queue,
            handle,
            message_id,
            copy,
            attributes,
            dead_lettered: false,
            received_at,
            sent_at,
            settled,
            heartbeat: beat.abort_handle(),
        }
    }

    /// Marks the receipt settling (stops the heartbeat); an error if it already was.
    async fn settle(&self) -> Result<tokio::sync::OwnedMutexGuard<bool>, Error> {
        let guard = self.settled.clone().lock_owned().await;
        if *guard {
            return Err(Error::already_settled());
        }
        self.heartbeat.abort();
        Ok(guard)
    }

    async fn change_visibility(&self, d: Duration, operation: &str) -> Result<(), Error> {
        self.settler
            .settle(&self.handle, Op::Hide(seconds_up(d)))
            .await
            .map_err(|e| e.with_operation(operation.to_string()))
    }

    /// Deletes the message. A queue that no longer exists took the message with it, and a receipt handle
    /// SQS no longer knows (the queue was created anew) can delete nothing: neither is an error to retry —
    /// holding on would only stall the consumer — and a message still there comes back to be handled
    /// again (at least once).
    async fn delete(&self) -> Result<(), Error> {
        match self.settler.settle(&self.handle, Op::Delete).await {
            Err(e) if e.kind() == Kind::NotFound => {
                warn!(queue = %self.topic, error = %e, "the message is not there to delete");
                Ok(())
            }
            other => {
                other.map_err(|e| e.with_operation(format!("delete a message from {}", self.topic)))
            }
        }
    }

    /// Sends the dead letter to the DLQ. When the DLQ is missing because the source queue is gone too
    /// (an SQS-compatible server restarted empty) and queues may be created, both are created again and
    /// the send tried once more; a DLQ deleted on its own stays an outage the runtime holds for.
    async fn send_dead_letter(&self, event: &Event) -> Result<(), Error> {
        let send = || {
            self.link
                .send_dead_letter(&self.queue, event, Some(&self.attributes))
        };
        match send().await {
            Err(e) if e.kind() == Kind::NotFound => {
                if self.link.queues.recreate_if_gone(&self.topic).await? {
                    warn!(queue = %self.topic, "the queue and its DLQ were gone; created them again");
                    send().await
                } else {
                    Err(e)
                }
            }
            other => other,
        }
    }

    /// Whether a visibility retry of `delay` ends inside the receive's visibility window and the
    /// queue's retention; otherwise it must be carried by a copy.
    fn fits_visibility(&self, delay: Duration) -> bool {
        let config = &self.link.queues.config;
        let window_ends = self.received_at.elapsed() + delay + MARGIN <= config.max_visibility;
        let age = self
            .sent_at
            .map_or(Duration::ZERO, |s| Timestamp::now().since(s));
        let retained = age + delay + MARGIN * 30 <= self.queue.retention;
        window_ends && retained
    }
}

#[async_trait]
impl Receipt for SqsReceipt {
    async fn ack(&mut self) -> Result<(), Error> {
        let mut settled = self.settle().await?;
        self.delete().await?;
        *settled = true;
        Ok(())
    }

    async fn retry(&mut self, event: &Event, delay: Duration) -> Result<(), Error> {
        let mut settled = self.settle().await?;
        let operation = format!("retry of {} on {}", self.message_id, self.topic);
        if let Some(retry) = &self.queue.retry {
            // Through the retry queue: a copy with the event's metadata, delayed (and hidden again on
            // arrival while not due), then the original deleted.
            let out = codec::encode(event, Some(&self.attributes), true, false)?;
            let options = SendOptions {
                delay,
                ..SendOptions::default()
            };
            let operation = format!("{operation} (through {})", retry.name);
            self.link
                .send(&self.queue, &retry.url, out, options, &operation)
                .await?;
            self.link.expect_copy(delay);
            self.delete().await?;
            *settled = true;
            return Ok(());
        }
        let visibility = !self.copy && self.fits_visibility(delay);
        // A standard queue carries the retry by a copy once the remembered retries are full; a FIFO
        // queue cannot delay a copy and keeps the broker's counts only.
        let remembered = visibility && {
            let until = Instant::now()
                + delay
                + self.link.queues.config.visibility
                + Duration::from_secs(60);
            self.link
                .remember(&self.message_id, event.metadata(), until)
        };
        if visibility && (remembered || self.queue.fifo) {
            if let Err(e) = self.change_visibility(delay, &operation).await {
                if remembered {
                    self.link.forget(&self.message_id);
                }
                return Err(e);
            }
        } else if self.queue.fifo {
            return Err(Error::new(
                Kind::Unsupported,
                format!(
                    "a FIFO queue cannot carry a delay of {delay:?} beyond the visibility window (no per-message delay)"
                ),
            )
            .with_operation(operation));
        } else {
            let out = codec::encode(event, Some(&self.attributes), true, self.queue.fifo)?;
            self.link
                .send(
                    &self.queue,
                    &self.queue.url,
                    out,
                    SendOptions {
                        delay,
                        ..SendOptions::default()
                    },
                    &operation,
                )
                .await
                .map(drop)?;
            self.delete().await?;
        }
        *settled = true;
        Ok(())
    }

    /// Sends the DLQ copy, then deletes the original; if the delete fails, a second call only deletes
    /// (the copy is already in the DLQ, and a second one would be a duplicate entry).
    async fn dead_letter(&mut self, event: &Event) -> Result<(), Error> {
        let mut settled = self.settle().await?;
        if !self.dead_lettered {
            self.send_dead_letter(event).await?;
            self.dead_lettered = true;
        }
        self.delete().await?;
        *settled = true;
        Ok(())
    }

    async fn release(&mut self, after: Duration) -> Result<(), Error> {
        let mut settled = self.settle().await?;
        let after = after.min(
            self.link
                .queues
                .config
                .max_visibility
                .saturating_sub(self.received_at.elapsed() + MARGIN),
        );
        self.change_visibility(after, "release").await?;
        *settled = true;
        Ok(())
    }

    async fn keep_alive(&mut self, for_at_least: Duration) -> Result<(), Error> {
        let guard = self.settled.lock().await;
        if *guard {
            return Err(Error::already_settled());
        }
        let config = &self.link.queues.config;
        let left = config
            .max_visibility
            .saturating_sub(self.received_at.elapsed() + MARGIN);
        self.change_visibility(for_at_least.max(config.visibility).min(left), "keep alive")
            .await
    }
}

impl Drop for SqsReceipt {
    fn drop(&mut self) {
        self.heartbeat.abort();
        let settled = self.settled.clone();
        let (settler, handle) = (self.settler.clone(), self.handle.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if *settled.lock().await {
                    return;
                }
                settler.settle_later(&handle, Op::Hide(0));
            });
        }
    }
}
