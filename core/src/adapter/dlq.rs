//! What a broker does for dead-letter operations: read a DLQ's entries, replay one, remove some, give
//! back the rest. Everything else — decoding, filtering, limits, the order of "replay, confirm, then
//! remove" — is [`crate::dlq::DeadLetters`], written once for every broker.

use async_trait::async_trait;

use crate::error::Error;
use crate::event::{Event, RawMessage};

/// One DLQ entry as the broker holds it (built with [`StoredDeadLetter::new`] and its `with_` setters).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredDeadLetter {
    /// The broker's id for the entry (stable until the entry is removed): an offset, a message id.
    pub id: String,
    /// The message, with the SDK's metadata in its headers and the adapter's own headers removed.
    pub message: RawMessage,
    /// The consumer group that dead-lettered it, where the broker keeps one per entry (a replay goes
    /// back to that group alone).
    pub group: Option<String>,
    /// What the broker holds of the entry beyond payload, key and headers.
    pub native: Native,
}

impl StoredDeadLetter {
    /// An entry `id` holding `message`, with no group and nothing native.
    pub fn new(id: impl Into<String>, message: RawMessage) -> Self {
        Self {
            id: id.into(),
            message,
            group: None,
            native: Native::default(),
        }
    }

    /// Records the consumer group that dead-lettered the entry.
    pub fn with_group(mut self, group: Option<String>) -> Self {
        self.group = group;
        self
    }

    /// Records what the broker holds beyond payload, key and headers.
    pub fn with_native(mut self, native: Native) -> Self {
        self.native = native;
        self
    }
}

/// What a broker holds of a message beyond its payload, key and header bytes, in words for people:
/// message properties (AMQP's priority or content type, Pulsar's event time) and the broker's type of
/// each header (an AMQP `long-int`, an SQS `Number`, a Kafka null).
///
/// A DLQ console shows it; a migration to another broker reports what of it the target cannot hold.
/// Only what differs from the broker's plain form is listed: a header absent from
/// [`Native::header_types`] is a plain string or byte header. Built with [`Native::default`] and
/// [`Native::property`] / [`Native::header_type`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Native {
    /// Message properties, as name and value (`amqp.priority` = `5`).
    pub properties: Vec<(String, String)>,
    /// Header types, as header name and the broker's name of its type (`retries` = `long-int`).
    pub header_types: Vec<(String, String)>,
}

impl Native {
    /// Whether there is nothing native to show or carry.
    pub fn is_empty(&self) -> bool {
        self.properties.is_empty() && self.header_types.is_empty()
    }

    /// Adds a property.
    pub fn property(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.properties.push((name.into(), value.into()));
    }

    /// Adds a header's type.
    pub fn header_type(&mut self, header: impl Into<String>, kind: impl Into<String>) {
        self.header_types.push((header.into(), kind.into()));
    }

    /// The type of header `name`, if the broker gave it one.
    pub fn type_of(&self, name: &str) -> Option<&str> {
        self.header_types
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    }

    /// Each native fact as one line (`amqp.priority=5`, `header retries: long-int`), for a report.
    pub fn describe(&self) -> Vec<String> {
        let properties = self.properties.iter().map(|(n, v)| format!("{n}={v}"));
        let types = self
            .header_types
            .iter()
            .map(|(n, t)| format!("header {n}: {t}"));
        properties.chain(types).collect()
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
