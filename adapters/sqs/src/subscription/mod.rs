//! The consumer side the runtime sees: the receive loop over the subscription's lanes (the `lanes`
//! module) and the receipts that settle what it hands out (the `receipt` module).
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

mod lanes;
mod receipt;

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use event_retry_core::adapter::{Delivery, DeliveryInfo, Subscription, SubscriptionSpec};
use event_retry_core::error::{Error, Kind};
use event_retry_core::metadata::{self, Origin, Packing};
use event_retry_core::time::Timestamp;
use tracing::{debug, warn};

use self::lanes::{Lane, Received};
use self::receipt::{MARGIN, SqsReceipt};
use crate::codec;
use crate::link::{Link, seconds_up};
use crate::queues::QueueInfo;
use crate::settle::Op;

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
