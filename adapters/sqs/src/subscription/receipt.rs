//! The receipt of one received message: how it is acknowledged, retried (a visibility change, a copy
//! through the retry queue, or a copy that carries a delay beyond the visibility window),
//! dead-lettered or released, and the heartbeat that keeps it hidden while its handler runs. Separate
//! from the receive loop: a receipt outlives the call that handed it out and needs none of the lanes'
//! state.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use event_retry_core::adapter::Receipt;
use event_retry_core::error::{Error, Kind};
use event_retry_core::event::Event;
use event_retry_core::time::Timestamp;
use tokio::sync::Mutex;
use tracing::warn;

use crate::codec;
use crate::link::{Link, SendOptions, seconds_up};
use crate::queues::QueueInfo;
use crate::settle::{Op, Settler};

/// Room left before a visibility window or retention ends, for clocks and requests in flight.
pub(super) const MARGIN: Duration = Duration::from_secs(2);

/// Settles one received message. Dropping it unsettled makes the message visible again at once.
pub(super) struct SqsReceipt {
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
    pub(super) fn new(
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
