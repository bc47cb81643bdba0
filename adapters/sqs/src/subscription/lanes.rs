//! The lanes of a subscription: each queue it receives from (the source, and with the `retry_queue`
//! setting its retry queue) with its buffer, the receive running in the background, how it polls, and
//! its own settler. Separate from the subscription, which only chooses which lane to hand out from, so
//! that what one queue's receiving needs stays in one place.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::Message;
use event_retry_core::adapter::SubscriptionSpec;
use event_retry_core::error::Error;

use crate::error::sdk_error;
use crate::link::{Link, seconds_up};
use crate::queues::QueueInfo;
use crate::settle::{Settler, SqsBatches};

/// A receive running in the background: it goes on while the runtime handles the previous batch, and a
/// cancelled `next` leaves it to the following call.
pub(super) type Receive = tokio::task::JoinHandle<Result<Vec<Received>, Error>>;

/// A message and when it was received.
pub(crate) struct Received {
    pub(super) message: Message,
    pub(super) at: Instant,
}

/// One queue a subscription receives from: the source, or its retry queue (the `retry_queue` setting).
pub(super) struct Lane {
    /// What this lane's receipts settle, send copies and dead-letter with: the source's, with `url` the
    /// lane's own queue.
    pub(super) queue: QueueInfo,
    /// Deletes and visibility changes of this queue's messages, in batches.
    pub(super) settler: Settler,
    pub(super) buffer: VecDeque<Received>,
    pub(super) pending: Option<Receive>,
    /// Short polls, this long apart while they find nothing (the retry queue); `None`: long polling.
    pub(super) idle_poll: Option<Duration>,
    /// The last receive brought nothing.
    pub(super) last_empty: bool,
}

impl Lane {
    pub(super) fn new(link: &Link, queue: QueueInfo) -> Self {
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
    pub(super) fn of(link: &Link, source: &QueueInfo) -> (Self, Option<Self>) {
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
    pub(super) fn update(&mut self, link: &Link, queue: QueueInfo) {
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
    pub(super) fn receive_if_idle(&mut self, link: &Link, spec: &SubscriptionSpec) {
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
    pub(super) async fn finish_receive(&mut self) {
        if let Some(pending) = self.pending.take()
            && let Ok(Ok(received)) = pending.await
        {
            self.buffer.extend(received);
        }
    }

    /// Gives buffered messages back (visibility 0), e.g. before a long pause.
    pub(super) async fn release_buffer(&mut self, link: &Link) {
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
    pub(super) fn release_in_background(&mut self, link: &Link) {
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
