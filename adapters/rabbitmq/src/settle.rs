//! Settling deliveries in batches: one `basic.ack` with `multiple` settles a run of deliveries. Separate
//! from the subscription because it is the one place that decides which acks may be merged.
//!
//! Each `basic.ack` is a frame the broker handles on its own, so acknowledging a run of deliveries with
//! one `multiple` ack costs the broker much less CPU than one ack per delivery (the throughput bench
//! shows it). So a receipt's ack only marks its
//! delivery acknowledged, and one flush at a time sends what has gathered meanwhile: a `multiple` ack up
//! to the last of the oldest open deliveries that are all acknowledged, and a single ack for each
//! acknowledged delivery behind a gap (an earlier delivery still being handled), so a slow handler never
//! holds the others' acks back (the broker's prefetch window would fill).
//!
//! A `multiple` ack settles every unacknowledged delivery up to its tag, so it must never pass a
//! delivery that is open or whose nack is still on its way: such a delivery stays in the open set until
//! its own settlement has been sent, and ends the run there.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use lapin::options::BasicAckOptions;
use lapin::{Acker, Channel};
use tracing::warn;

/// The deliveries of one channel handed out and not yet settled on the wire.
pub(crate) struct Acks {
    state: Mutex<Open<Acker>>,
    /// Told when a flush ends with nothing left to send.
    idle: tokio::sync::Notify,
    /// Keeps the channel open while acks wait to be sent on it (lapin closes a channel when its last
    /// handle goes, and a receipt lets go of its handle once it has marked its ack).
    _channel: Option<Arc<Channel>>,
}

impl Acks {
    /// The acks of the deliveries of `channel` (`None` before the first channel is opened).
    pub(crate) fn new(channel: Option<Arc<Channel>>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(Open::default()),
            idle: tokio::sync::Notify::new(),
            _channel: channel,
        })
    }

    /// Waits until every ack handed over so far has been sent (a closing subscription calls it, so a
    /// graceful shutdown leaves no handled delivery unacknowledged on the broker).
    pub(crate) async fn sent(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if !self.lock().flushing {
                return;
            }
            idle.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open<Acker>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A delivery with `tag` was handed out.
    pub(crate) fn opened(&self, tag: u64) {
        self.lock().opened(tag);
    }

    /// The delivery's nack (or requeue) has been sent: a `multiple` ack may pass it now.
    pub(crate) fn closed(&self, tag: u64) {
        self.lock().closed(tag);
    }

    /// The delivery was handled: its ack goes with the next flush (started here if none runs).
    pub(crate) fn ack(self: &Arc<Self>, tag: u64, acker: Acker) {
        let start_flush = self.lock().acked(tag, acker);
        if start_flush {
            let acks = self.clone();
            tokio::spawn(async move { acks.flush().await });
        }
    }

    /// Sends what was acknowledged, batch after batch, until nothing is left to send.
    async fn flush(&self) {
        loop {
            let Some(batch) = self.lock().take() else {
                self.idle.notify_waiters();
                return;
            };
            if let Some(last) = batch.run {
                send(&last, true).await;
            }
            for single in batch.singles {
                send(&single, false).await;
            }
        }
    }
}

/// Sends one ack. A failure means the channel is gone: the broker requeues what it had not been told
/// of, so those deliveries come back (at least once), which is all a consumer can do then.
async fn send(acker: &Acker, multiple: bool) {
    match acker.ack(BasicAckOptions { multiple }).await {
        Ok(true) => {}
        Ok(false) => {
            warn!("an ack was not sent: the channel is gone; the broker redelivers the messages")
        }
        Err(e) => {
            warn!(error = %e, "an ack failed; the broker redelivers the messages")
        }
    }
}

/// What one flush sends.
#[derive(Debug, PartialEq)]
struct Batch<A> {
    /// The acker of the last of the oldest open deliveries, all acknowledged: acked with `multiple`.
    run: Option<A>,
    /// Acknowledged deliveries behind a gap, acked one by one.
    singles: Vec<A>,
}

/// Open deliveries by tag, with the acker of each acknowledged one (generic for the tests).
#[derive(Debug)]
struct Open<A> {
    open: BTreeMap<u64, Option<A>>,
    flushing: bool,
}

impl<A> Default for Open<A> {
    fn default() -> Self {
        Self {
            open: BTreeMap::new(),
            flushing: false,
        }
    }
}

impl<A> Open<A> {
    fn opened(&mut self, tag: u64) {
        self.open.insert(tag, None);
    }

    fn closed(&mut self, tag: u64) {
        self.open.remove(&tag);
    }

    /// Marks `tag` acknowledged; `true` if the caller must start a flush (none is running).
    fn acked(&mut self, tag: u64, acker: A) -> bool {
        // A delivery not opened here (not expected) is acknowledged alone, in the flush's singles.
        self.open.insert(tag, Some(acker));
        !std::mem::replace(&mut self.flushing, true)
    }

    /// Takes the next batch, or ends the flush (under the same lock, so no ack is left behind).
    fn take(&mut self) -> Option<Batch<A>> {
        let mut run = None;
        while let Some(entry) = self.open.first_entry() {
            if entry.get().is_none() {
                break;
            }
            run = entry.remove();
        }
        // What is left starts with an open delivery: the acknowledged ones behind it go alone.
        let mut singles = Vec::new();
        self.open.retain(|_, acker| match acker.take() {
            Some(a) => {
                singles.push(a);
                false
            }
            None => true,
        });
        if run.is_none() && singles.is_empty() {
            self.flushing = false;
            return None;
        }
        Some(Batch { run, singles })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(tags: &[u64]) -> Open<&'static str> {
        let mut o = Open::default();
        for &t in tags {
            o.opened(t);
        }
        o
    }

    #[tokio::test]
    async fn sent_waits_for_a_running_flush_to_end() {
        let acks = Acks::new(None);
        acks.sent().await; // nothing to send: returns at once
        acks.lock().flushing = true;
        let waiter = tokio::spawn({
            let acks = acks.clone();
            async move { acks.sent().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "returned while a flush ran");
        // What `flush` does when `take` finds nothing left.
        assert!(acks.lock().take().is_none());
        acks.idle.notify_waiters();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("sent() returns once the flush ended")
            .expect("no panic");
    }

    #[test]
    fn acks_in_order_go_out_as_one_multiple_ack_of_the_last() {
        let mut o = open(&[1, 2, 3, 4]);
        assert!(o.acked(1, "a1"), "the first ack starts a flush");
        assert!(!o.acked(2, "a2"), "a flush runs already");
        assert!(!o.acked(3, "a3"));
        assert_eq!(
            o.take(),
            Some(Batch {
                run: Some("a3"),
                singles: vec![]
            })
        );
        assert_eq!(o.take(), None, "4 is still being handled");
        assert!(
            o.acked(4, "a4"),
            "the flush ended, so this ack starts another"
        );
    }

    #[test]
    fn a_multiple_ack_never_passes_an_open_delivery() {
        let mut o = open(&[1, 2, 3, 4, 5]);
        for (t, a) in [(1, "a1"), (3, "a3"), (5, "a5")] {
            o.acked(t, a);
        }
        assert_eq!(
            o.take(),
            Some(Batch {
                run: Some("a1"),
                singles: vec!["a3", "a5"]
            }),
            "2 and 4 are open: 3 and 5 go alone, not held back"
        );
        assert_eq!(o.take(), None);
    }

    #[test]
    fn a_delivery_being_requeued_ends_the_run_until_its_nack_is_sent() {
        let mut o = open(&[1, 2, 3]);
        // 2 is being requeued: its nack is on its way, so it stays open.
        o.acked(1, "a1");
        o.acked(3, "a3");
        assert_eq!(
            o.take(),
            Some(Batch {
                run: Some("a1"),
                singles: vec!["a3"]
            })
        );
        o.closed(2);
        o.opened(4);
        o.opened(5);
        o.acked(4, "a4");
        o.acked(5, "a5");
        assert_eq!(
            o.take(),
            Some(Batch {
                run: Some("a5"),
                singles: vec![]
            }),
            "with 2's nack sent, the run starts at 4"
        );
    }
}
