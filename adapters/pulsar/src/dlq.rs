//! The Pulsar side of a DLQ operation on `<topic>-DLQ`, through one subscription kept for them
//! (`event-retry-dlq`).
//!
//! Pulsar removes a message from a subscription when it is acknowledged there, so that subscription *is*
//! the DLQ's content: a session asks the broker how many entries the subscription holds (its backlog)
//! and reads until it has that many — entries a previous operation just gave back can take a moment to
//! be dispatched again, and a quiet moment alone would miss them — or, without the count, until nothing
//! more arrives for a moment;
//! acknowledges what it removes — a replayed entry only after its copy was confirmed, the order being
//! `event_retry_core::dlq`'s — and when it finishes closes its consumer, and the broker gives what it did not
//! acknowledge to the next operation. Each session has a consumer of its own, closed (and the close
//! awaited) before the session ends: a consumer left open would keep the entries it was sent in its
//! receive queue, out of reach of any other process's operation (a `retryctl` run). Within one process
//! the transport lets one session at a time work on a DLQ.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use event_retry_core::adapter::{DlqSession, StoredDeadLetter};
use event_retry_core::error::{Error, Kind};
use event_retry_core::event::Event;
use futures::{FutureExt, StreamExt};
use pulsar::consumer::Message;
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::codec;
use crate::consumer_requests::{self, PulsarConsumer, Received};
use crate::error::error;
use crate::link::Link;

/// Without the backlog's count: how long a session waits for the first entry, and then for each next
/// one, before it has them all.
const FIRST_WAIT: Duration = Duration::from_millis(1_500);
const NEXT_WAIT: Duration = Duration::from_millis(1_000);
/// With the count: how long a session waits for each entry it knows is there, and for one beyond it
/// (dead-lettered while the session started).
const COUNTED_WAIT: Duration = Duration::from_secs(10);
const BEYOND_COUNT_WAIT: Duration = Duration::from_millis(200);

/// How long the client is given to answer a request of the session's consumer (its stats, the last
/// message id, a close).
const ANSWER_PATIENCE: Duration = Duration::from_secs(30);

/// One lock per DLQ: the operations of one transport on a DLQ run one at a time.
#[derive(Default)]
pub(crate) struct DlqConsumers(Mutex<HashMap<String, Arc<Mutex<()>>>>);

impl DlqConsumers {
    async fn lock(&self, topic: &str) -> OwnedMutexGuard<()> {
        let lock = self
            .0
            .lock()
            .await
            .entry(topic.to_string())
            .or_default()
            .clone();
        lock.lock_owned().await
    }
}

/// Opens one operation on `source_topic`'s DLQ (waiting for an operation already running on it).
pub(crate) async fn open(
    link: Arc<Link>,
    consumers: &DlqConsumers,
    source_topic: &str,
) -> Result<Option<Box<dyn DlqSession>>, Error> {
    let turn = consumers.lock(source_topic).await;
    let mut consumer = link.dlq_consumer(source_topic).await?;
    // The entries the client queued while the stats were asked for come first.
    let mut queued = VecDeque::new();
    let stats = consumer_requests::ask(
        &mut consumer,
        "read the DLQ subscription's stats",
        ANSWER_PATIENCE,
        |received| queued.push_back(received),
        |c| c.get_stats().boxed(),
    )
    .await;
    let backlog = match stats {
        Ok(stats) => stats.iter().map(|s| s.msg_backlog).sum::<Option<u64>>(),
        Err(e) => {
            tracing::debug!(error = %e, topic = source_topic, "no backlog count for the DLQ; reading until it is quiet");
            None
        }
    };
    Ok(Some(Box::new(PulsarDlqSession {
        link,
        topic: source_topic.to_string(),
        _turn: turn,
        consumer,
        queued,
        held: Vec::new(),
        removed: Vec::new(),
        wait: FIRST_WAIT,
        backlog: backlog.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        drained: false,
    })))
}

/// One operation: the entries received so far, unacknowledged until removed or given back.
struct PulsarDlqSession {
    link: Arc<Link>,
    topic: String,
    /// This session's turn on the DLQ, held until it ends.
    _turn: OwnedMutexGuard<()>,
    consumer: PulsarConsumer,
    /// Entries taken from the client's queue while it was asked for something, to be read first.
    queued: VecDeque<Received>,
    held: Vec<Message<Vec<u8>>>,
    removed: Vec<bool>,
    wait: Duration,
    /// How many entries the subscription held when the session began, if the broker said.
    backlog: Option<usize>,
    drained: bool,
}

impl PulsarDlqSession {
    fn held(&self, entry: usize) -> Result<&Message<Vec<u8>>, Error> {
        self.held
            .get(entry)
            .ok_or_else(|| Error::new(Kind::NotFound, format!("no DLQ entry #{entry}")))
    }
}

/// The consumer group that dead-lettered `message`, if it says.
fn group_of(message: &Message<Vec<u8>>) -> Option<String> {
    message
        .payload
        .metadata
        .properties
        .iter()
        .find(|kv| kv.key == event_retry_core::metadata::names::GROUP)
        .map(|kv| kv.value.clone())
}

fn stored(message: &Message<Vec<u8>>) -> StoredDeadLetter {
    let raw = codec::decode(
        bytes::Bytes::from(message.payload.data.clone()),
        &message.payload.metadata,
    );
    let id = message.message_id();
    StoredDeadLetter::new(
        format!(
            "{}:{}:{}",
            id.ledger_id,
            id.entry_id,
            id.batch_index.unwrap_or(-1)
        ),
        raw,
    )
    .with_group(group_of(message))
    .with_native(codec::Envelope::of(&message.payload.metadata).native())
}

#[async_trait]
impl DlqSession for PulsarDlqSession {
    async fn next(&mut self) -> Result<Option<StoredDeadLetter>, Error> {
        if self.drained {
            return Ok(None);
        }
        let wait = match self.backlog {
            Some(n) if self.held.len() < n => COUNTED_WAIT,
            Some(_) => BEYOND_COUNT_WAIT,
            None => self.wait,
        };
        let next = match self.queued.pop_front() {
            Some(queued) => Some(queued),
            None => match tokio::time::timeout(wait, self.consumer.next()).await {
                Ok(next) => next,
                Err(_) => {
                    self.drained = true;
                    return Ok(None);
                }
            },
        };
        let Some(message) = next else {
            self.drained = true;
            return Ok(None);
        };
        let message = message.map_err(error(&format!("read the DLQ of {}", self.topic)))?;
        self.wait = NEXT_WAIT;
        let entry = stored(&message);
        self.held.push(message);
        self.removed.push(false);
        Ok(Some(entry))
    }

    /// Back to the group that dead-lettered it (its retry topic, due at once), so other groups of the
    /// topic do not handle it again; an entry without a group goes to the topic.
    async fn replay(&mut self, entry: usize, origin: &str, event: &Event) -> Result<(), Error> {
        let config = &self.link.config;
        let target = match group_of(self.held(entry)?) {
            Some(group) => config.retry_topic(origin, &group),
            None => config.full_name(origin),
        };
        let native = codec::Envelope::of(&self.held(entry)?.payload.metadata);
        let message = codec::encode(event, Some(&native), None, &[])?;
        self.link
            .send(&target, message, &format!("replay to {target}"))
            .await
            .map(drop)
    }

    async fn remove(&mut self, entries: &[usize]) -> Result<(), Error> {
        for &entry in entries {
            let message = self
                .held
                .get(entry)
                .ok_or_else(|| Error::new(Kind::NotFound, format!("no DLQ entry #{entry}")))?;
            self.consumer.ack(message).await.map_err(|e| {
                Error::from_source(Kind::Connection, e).with_operation("remove a DLQ entry")
            })?;
            self.removed[entry] = true;
        }
        Ok(())
    }

    /// Makes sure the removals reached the broker, then gives back what was not removed by closing the
    /// consumer and waiting for the broker's answer: the client queues acknowledgements without a
    /// receipt (a request on the same consumer after them returns once the broker has read them), and a
    /// closed consumer's unacknowledged entries go back to the subscription at once — so the next
    /// operation, in this process or a short-lived `retryctl`, finds them.
    async fn finish(mut self: Box<Self>) -> Result<(), Error> {
        if self.removed.iter().any(|r| *r)
            && let Err(e) = consumer_requests::ask(
                &mut self.consumer,
                "confirm the DLQ removals",
                ANSWER_PATIENCE,
                drop,
                |c| c.get_last_message_id().boxed(),
            )
            .await
        {
            tracing::warn!(error = %e, topic = self.topic, "could not confirm that the DLQ removals reached the broker");
        }
        let close = consumer_requests::close(
            &mut self.consumer,
            "close the DLQ consumer",
            ANSWER_PATIENCE,
        );
        if let Err(e) = close.await {
            // The broker gives the entries back when the connection goes, too.
            tracing::warn!(error = %e, topic = self.topic, "could not close the DLQ consumer");
        }
        Ok(())
    }
}
