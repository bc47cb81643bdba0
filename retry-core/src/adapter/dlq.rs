//! What a broker does for dead-letter operations: read a DLQ's entries, replay one, remove some, give
//! back the rest. Everything else — decoding, filtering, limits, the order of "replay, confirm, then
//! remove" — is [`crate::dlq::DeadLetters`], written once for every broker.

use async_trait::async_trait;

use crate::error::Error;
use crate::event::{Event, RawMessage};

/// One DLQ entry as the broker holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDeadLetter {
    /// The broker's id for the entry (stable until the entry is removed): an offset, a message id.
    pub id: String,
    /// The message, with the SDK's metadata in its headers and the adapter's own headers removed.
    pub message: RawMessage,
}

impl StoredDeadLetter {
    /// An entry `id` holding `message`.
    pub fn new(id: impl Into<String>, message: RawMessage) -> Self {
        Self {
            id: id.into(),
            message,
        }
    }
}

/// One operation on one DLQ: entries are numbered from 0 in the order [`DlqSession::next`] returned them.
///
/// While a session is open it may hold its entries (taken unacknowledged, hidden, or read from a
/// committed position); [`DlqSession::finish`] gives back everything it did not remove. The SDK always
/// calls `finish`, after a failure too, unless the process dies — then the broker gives the entries back
/// itself (a closed channel, an expired visibility timeout, an uncommitted offset).
#[async_trait]
pub trait DlqSession: Send {
    /// The next entry, or `None` when every entry was read.
    async fn next(&mut self) -> Result<Option<StoredDeadLetter>, Error>;

    /// Refuses, before anything is done, a removal of `entries` that could not be recorded (Kafka keeps
    /// removals as commit metadata of bounded size). By default every removal can be.
    async fn check_removal(&mut self, entries: &[usize]) -> Result<(), Error> {
        let _ = entries;
        Ok(())
    }

    /// Sends `event` — entry `entry` prepared for replay — back to `origin` (or to the retry route of
    /// the group that dead-lettered it, where the broker keeps one per group), and returns once the
    /// broker confirmed the copy.
    async fn replay(&mut self, entry: usize, origin: &str, event: &Event) -> Result<(), Error>;

    /// Removes `entries` from the DLQ (or marks them removed).
    async fn remove(&mut self, entries: &[usize]) -> Result<(), Error>;

    /// Ends the operation: gives back every entry not removed, and records the removals where the broker
    /// keeps them as a position.
    async fn finish(self: Box<Self>) -> Result<(), Error>;
}
