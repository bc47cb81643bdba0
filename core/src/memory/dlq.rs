//! One DLQ operation on the in-memory broker: a snapshot of the entries, removals applied at once.

use std::collections::HashSet;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryTransport;
use crate::adapter::{DlqSession, StoredDeadLetter};
use crate::error::Error;
use crate::event::Event;

/// One DLQ operation: a snapshot of the entries; removals apply to the broker at once.
pub(super) struct MemoryDlqSession {
    pub(super) transport: MemoryTransport,
    pub(super) topic: String,
    pub(super) entries: Vec<StoredDeadLetter>,
    pub(super) read: usize,
}

#[async_trait]
impl DlqSession for MemoryDlqSession {
    async fn next(&mut self) -> Result<Option<StoredDeadLetter>, Error> {
        let entry = self.entries.get(self.read).cloned();
        self.read += usize::from(entry.is_some());
        Ok(entry)
    }

    /// Back to the group that dead-lettered it, so the topic's other groups do not handle it again.
    async fn replay(&mut self, entry: usize, origin: &str, event: &Event) -> Result<(), Error> {
        let group = self.entries.get(entry).and_then(|e| e.group.as_deref());
        self.transport
            .broker
            .enqueue(origin, group, event.to_raw(), Instant::now(), None);
        Ok(())
    }

    async fn remove(&mut self, entries: &[usize]) -> Result<(), Error> {
        let doomed: HashSet<&str> = entries
            .iter()
            .filter_map(|&i| self.entries.get(i))
            .map(|e| e.id.as_str())
            .collect();
        if let Some(list) = self.transport.broker.lock().dead.get_mut(&self.topic) {
            list.retain(|e| !doomed.contains(e.id.as_str()));
        }
        Ok(())
    }

    async fn finish(self: Box<Self>) -> Result<(), Error> {
        Ok(())
    }
}
