//! The RabbitMQ side of a DLQ operation on a topic's DLQ queue.
//!
//! RabbitMQ has no way to read a queue without taking from it, so a session takes the messages on a
//! channel of its own without acknowledging them, acknowledges the ones it removes (a replayed entry only
//! after its copy to the origin was confirmed — the order is `event_retry_core::dlq`'s), and closes the channel
//! when it finishes: the broker puts every other message back where it was, and does the same if the
//! process dies mid-operation. While a session runs, the entries it holds are invisible to another one.

use std::sync::Arc;

use async_trait::async_trait;
use event_retry_core::adapter::{DlqSession, StoredDeadLetter};
use event_retry_core::error::{Error, Kind};
use event_retry_core::event::Event;
use lapin::Channel;
use lapin::message::BasicGetMessage;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

use crate::codec;
use crate::error::{amqp_error, connection_error};
use crate::link::Link;

/// Opens one operation on `source_topic`'s DLQ; `None` when the DLQ queue does not exist.
pub(crate) async fn open(
    link: Arc<Link>,
    source_topic: &str,
) -> Result<Option<Box<dyn DlqSession>>, Error> {
    let dlq = link.names.dlq(source_topic);
    let channel = link.channel().await?;
    let exists = channel
        .queue_declare(
            dlq.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    match exists {
        Ok(_) => Ok(Some(Box::new(RabbitDlqSession {
            link,
            channel,
            topic: source_topic.to_string(),
            dlq,
            held: Vec::new(),
            drained: false,
        }))),
        // No DLQ queue: nothing was dead-lettered (or it was deleted); there are no entries.
        Err(e) => match amqp_error(e, format!("check DLQ {dlq}")) {
            e if e.kind() == Kind::NotFound => Ok(None),
            e => Err(e),
        },
    }
}

/// A text header of a message, if it has it.
fn text_header(properties: &lapin::BasicProperties, name: &str) -> Option<String> {
    match properties.headers().as_ref()?.inner().get(name)? {
        lapin::types::AMQPValue::LongString(s) => {
            Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
        _ => None,
    }
}

/// One operation: the entries taken (unacknowledged) so far on the session's channel.
struct RabbitDlqSession {
    link: Arc<Link>,
    channel: Channel,
    /// The source topic whose DLQ this is.
    topic: String,
    dlq: String,
    held: Vec<BasicGetMessage>,
    drained: bool,
}

impl RabbitDlqSession {
    /// The group an entry names: the adapter's own dead letters carry it.
    fn group_of(&self, properties: &lapin::BasicProperties) -> Option<String> {
        text_header(properties, event_retry_core::metadata::names::GROUP)
    }

    /// The group of the queue a message the broker dead-lettered itself (over a quorum queue's delivery
    /// limit) died in, among `origin`'s groups.
    fn died_in(&self, origin: &str, properties: &lapin::BasicProperties) -> Option<String> {
        text_header(properties, "x-first-death-queue").and_then(|queue| {
            self.link
                .names
                .group_of_queue(origin, &queue)
                .map(str::to_string)
        })
    }

    fn held(&self, entry: usize) -> Result<&BasicGetMessage, Error> {
        self.held
            .get(entry)
            .ok_or_else(|| Error::new(Kind::NotFound, format!("no DLQ entry #{entry}")))
    }
}

#[async_trait]
impl DlqSession for RabbitDlqSession {
    async fn next(&mut self) -> Result<Option<StoredDeadLetter>, Error> {
        if self.drained {
            return Ok(None);
        }
        let dlq = self.dlq.as_str();
        let got = self
            .channel
            .basic_get(dlq.into(), BasicGetOptions { no_ack: false })
            .await
            .map_err(|e| amqp_error(e, format!("read DLQ {dlq}")))?;
        let Some(mut message) = got else {
            self.drained = true;
            return Ok(None);
        };
        self.drained = message.message_count == 0;
        let raw = codec::raw_message(
            bytes::Bytes::from(std::mem::take(&mut message.delivery.data)),
            &message.delivery.properties,
        );
        // The entry's own id, which the adapter gave it when it dead-lettered it; a message put in the DLQ
        // by something else is known by its message id or, lacking one, its place in this read.
        let properties = &message.delivery.properties;
        let id = text_header(properties, event_retry_core::metadata::names::DLQ_ENTRY)
            .or_else(|| properties.message_id().as_ref().map(|id| id.to_string()))
            .unwrap_or_else(|| format!("tag-{}", message.delivery.delivery_tag));
        let group = self
            .group_of(properties)
            .or_else(|| self.died_in(&self.topic, properties));
        let stored = StoredDeadLetter::new(id, raw)
            .with_group(group)
            .with_native(codec::native(properties));
        self.held.push(message);
        Ok(Some(stored))
    }

    /// Back to the queue of the group that dead-lettered it, so the topic's other groups do not handle it
    /// again; an entry that names no group goes to the topic's exchange.
    async fn replay(&mut self, entry: usize, origin: &str, event: &Event) -> Result<(), Error> {
        let native = self.held(entry)?.delivery.properties.clone();
        let group = self
            .group_of(&native)
            .or_else(|| self.died_in(origin, &native));
        self.link
            .publish_event(
                origin,
                group.as_deref(),
                event,
                Some(&native),
                &format!("replay to {origin}"),
            )
            .await
            .map(drop)
    }

    async fn remove(&mut self, entries: &[usize]) -> Result<(), Error> {
        for &entry in entries {
            self.held(entry)?
                .delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .map_err(connection_error("remove a DLQ entry"))?;
        }
        Ok(())
    }

    /// Closing the channel gives back every message the operation did not acknowledge.
    async fn finish(self: Box<Self>) -> Result<(), Error> {
        let _ = self.channel.close(200, "done".into()).await;
        Ok(())
    }
}
