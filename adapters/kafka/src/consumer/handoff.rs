//! The channels the consumer thread hands records to the subscription through, in batches.
//!
//! Two of them: the group's retry topic's records and the source's. The subscription takes a retry
//! batch before any source batch, so a due retry waits behind at most the source batch the runtime is
//! taking records from, not behind every batch queued — which lets the source's channel be deep enough
//! that the runtime seldom finds it empty while records wait ([`SOURCE_BATCHES`]).

use event_retry_core::error::Error;
use tokio::sync::mpsc;

use crate::codec::Copied;
use crate::consumer::offsets::Tp;

/// A record handed to the subscription.
pub(crate) struct Record {
    pub(crate) tp: Tp,
    pub(crate) offset: i64,
    pub(crate) epoch: u64,
    /// The assignment's change count when the record was kept: while it stays so, `epoch` is current.
    pub(crate) generation: u64,
    /// The record as read, decoded by the subscription (on the thread that handles it).
    pub(crate) copied: Copied,
}

/// A batch of records, or the error read in their place.
pub(crate) type Batch = Result<Vec<Record>, Error>;

/// Source batches the consumer thread can hand out before it keeps records in its backlog (each at
/// most 256 records and about 256 KiB, or one record if it is larger: `worker::HANDOUT_BYTES`; so
/// about 8 MiB wait here where records are smaller than that). A revocation does not wait for them:
/// the subscription gives back the records of the partitions being revoked (`KafkaSubscription::sweep`).
/// With a few batches here the runtime's thread and the consumer thread each waited for the other
/// part of every millisecond on the Kafka bench; this many, with the thread woken once half are taken,
/// keeps both busy (docs/PERFORMANCE.md, "The Kafka adapter").
pub(crate) const SOURCE_BATCHES: usize = 32;

/// Retry topic batches the consumer thread can hand out before it keeps them in its backlog.
const RETRY_BATCHES: usize = 4;

/// The consumer thread's ends of the channels.
pub(crate) struct Senders {
    /// The group's retry topic's records.
    pub(crate) retries: mpsc::Sender<Batch>,
    /// The source's records, and the consumer's errors.
    pub(crate) source: mpsc::Sender<Batch>,
}

impl Senders {
    /// Whether the subscription has gone (dropped its ends).
    pub(crate) fn is_closed(&self) -> bool {
        self.source.is_closed()
    }
}

/// The subscription's ends of the channels.
pub(crate) struct Receivers {
    retries: mpsc::Receiver<Batch>,
    source: mpsc::Receiver<Batch>,
}

impl Receivers {
    /// The next batch, a retry topic's before a source's; `None` once the consumer thread has gone.
    /// Cancel-safe: a batch is either received whole or left in its channel.
    pub(crate) async fn recv(&mut self) -> Option<Batch> {
        tokio::select! {
            biased;
            // A closed retry channel disables this branch; the source's then says whether the
            // thread has gone (it drops both together).
            Some(batch) = self.retries.recv() => Some(batch),
            batch = self.source.recv() => batch,
        }
    }

    /// A retry topic batch already queued, without waiting.
    pub(crate) fn try_recv_retries(&mut self) -> Option<Batch> {
        self.retries.try_recv().ok()
    }

    /// A source batch already queued, without waiting.
    pub(crate) fn try_recv_source(&mut self) -> Option<Batch> {
        self.source.try_recv().ok()
    }

    /// How many source batches wait to be taken.
    pub(crate) fn source_queued(&self) -> usize {
        self.source.len()
    }
}

/// A new pair of channels.
pub(crate) fn channels() -> (Senders, Receivers) {
    let (retries, retries_rx) = mpsc::channel(RETRY_BATCHES);
    let (source, source_rx) = mpsc::channel(SOURCE_BATCHES);
    (
        Senders { retries, source },
        Receivers {
            retries: retries_rx,
            source: source_rx,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch whose only trace is its length (an empty batch of records).
    fn batch(n: usize) -> Batch {
        Ok(Vec::with_capacity(n))
    }

    fn capacity_of(received: Option<Batch>) -> usize {
        received.expect("a batch").expect("records").capacity()
    }

    /// Sends `batch` on `channel`, whose receiver is open.
    async fn send(channel: &mpsc::Sender<Batch>, batch: Batch) {
        channel.send(batch).await.expect("the receiver is open");
    }

    #[tokio::test]
    async fn a_retry_batch_is_taken_before_source_batches_sent_earlier() {
        let (senders, mut receivers) = channels();
        for _ in 0..3 {
            send(&senders.source, batch(1)).await;
        }
        send(&senders.retries, batch(7)).await;
        assert_eq!(receivers.source_queued(), 3);
        assert_eq!(capacity_of(receivers.recv().await), 7);
        for _ in 0..3 {
            assert_eq!(capacity_of(receivers.recv().await), 1);
        }
    }

    #[tokio::test]
    async fn the_channels_end_once_the_thread_drops_its_senders_and_the_batches_are_taken() {
        let (senders, mut receivers) = channels();
        send(&senders.source, batch(1)).await;
        send(&senders.retries, batch(2)).await;
        drop(senders);
        assert_eq!(capacity_of(receivers.recv().await), 2);
        assert_eq!(capacity_of(receivers.recv().await), 1);
        assert!(receivers.recv().await.is_none());
    }
}
