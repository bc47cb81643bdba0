//! The delay ladder's hops, made by the SDK: a copy moves from one level to the next with a publisher
//! confirm, and leaves its level only once the next one holds it.
//!
//! Why not the broker's own TTL and dead-lettering: on classic queues dead-lettering is at most once — a
//! broker crash while a copy moves between levels loses it — and on quorum queues it goes through a dead-letter worker that, after a crash or the loss
//! of a node, held copies for minutes. Here a level is a plain durable queue and every consumer process
//! of this transport moves what is due:
//!
//! * one consumer per level, with manual acks and a prefetch of [`PREFETCH`] copies;
//! * a copy's time out of its level travels in its `x-retry-hop-due` header (milliseconds since the Unix
//!   epoch, written when it entered the level); the mover waits until then, sends the copy to the next
//!   level's exchange with the same routing key and its next due time — this one plus the wait of the
//!   level it goes to, so the hops' own latency never adds up — waits for the broker's confirm, and only
//!   then acknowledges it. A crash at any point leaves the copy in at least one queue: a copy can be
//!   moved twice, never lost;
//! * a level's copies all wait the same time, so they come in the order they fall due, and one due
//!   later never holds up one due sooner.
//!
//! A due time the mover cannot trust — no header, a malformed one, or one further away than the level's
//! whole wait (a clock ahead of this one) — counts from now: a copy is moved late rather than early.
//! Copies wait in the ladder while no consumer process of any topic runs; they move on once one does.
//!
//! Closing a transport stops its movers without cutting a move in half: a copy already sent on is
//! acknowledged before the connection closes (otherwise the broker gives it to another process's mover,
//! which sends it a second time and the handler sees that retry twice); a copy still waiting for its
//! time is left unacknowledged and goes back to its level.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use event_retry_core::error::{Error, Kind};
use event_retry_core::metadata::names::HOP_DUE;
use futures::{StreamExt, TryStreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::Ladder;
use crate::error::connection_error;

/// Copies each level's consumer holds at once (waiting for their time, or being sent on).
pub(crate) const PREFETCH: u16 = 256;

/// The first wait after a level's consumer ended with an error; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(200);

/// The longest wait between two attempts to consume a level.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A consumer that ran this long before it ended starts again after [`MIN_BACKOFF`].
const HEALTHY_RUN: Duration = Duration::from_secs(30);

/// What the movers need of a transport's connection: its ladder, a channel to consume a level on, and a
/// publish the broker confirmed. The link is one; the movers hold it weakly and know nothing else of it.
#[async_trait]
pub(crate) trait Hops: Send + Sync + 'static {
    /// The ladder whose levels are moved.
    fn ladder(&self) -> &Ladder;

    /// A new channel on the live connection.
    async fn channel(&self) -> Result<Channel, Error>;

    /// Publishes `body` with `props` to `exchange` with `routing_key`, and waits for the broker's confirm.
    async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
        operation: &str,
    ) -> Result<(), Error>;
}

/// The ladder's movers of one transport: one task per level. [`Movers::stop`] ends them once no move
/// is half done; dropping them aborts the tasks, which is safe only because a mover holds the link
/// strongly for the whole of a move — a link being dropped has no move in flight.
pub(crate) struct Movers {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Movers {
    /// Starts one mover per level of `link`'s ladder on the current runtime. The tasks hold the link
    /// weakly: they end when it is gone.
    pub(crate) fn start<L: Hops>(link: &Arc<L>) -> Self {
        let stop = CancellationToken::new();
        let tasks = (0..link.ladder().levels())
            .map(|k| tokio::spawn(run(Arc::downgrade(link), k, stop.clone())))
            .collect();
        Self { stop, tasks }
    }

    /// Stops taking copies and waits, up to `within`, until every move under way is acknowledged;
    /// copies still waiting for their time stay unacknowledged (they go back to their level when the
    /// channel closes). Tasks still running after `within` are aborted.
    pub(crate) async fn stop(mut self, within: Duration) {
        self.stop.cancel();
        let ended = futures::future::join_all(self.tasks.iter_mut());
        if tokio::time::timeout(within, ended).await.is_err() {
            warn!("a delay-ladder move did not finish within {within:?}; it is abandoned");
        }
    }
}

impl Drop for Movers {
    fn drop(&mut self) {
        self.stop.cancel();
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Moves level `k`'s due copies until the link is gone or `stop` is cancelled, consuming again after
/// any error.
async fn run<L: Hops>(link: Weak<L>, k: u32, stop: CancellationToken) {
    let mut backoff = MIN_BACKOFF;
    while !stop.is_cancelled() {
        let started = tokio::time::Instant::now();
        match move_level(&link, k, &stop).await {
            Ok(()) => return,
            Err(e) => {
                if started.elapsed() >= HEALTHY_RUN {
                    backoff = MIN_BACKOFF;
                }
                warn!(level = k, error = %e, retry_in = ?backoff, "moving the delay ladder's copies stopped");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = stop.cancelled() => return,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Consumes level `k` and moves each copy when it is due. Returns `Ok` when the transport is gone or
/// `stop` was cancelled and the moves under way are done, an error when the channel or a move failed
/// (the broker gives what was not acknowledged to a consumer again).
async fn move_level<L: Hops>(
    link: &Weak<L>,
    k: u32,
    stop: &CancellationToken,
) -> Result<(), Error> {
    let Some(strong) = link.upgrade() else {
        return Ok(());
    };
    let queue = strong.ladder().level(k);
    let channel = strong.channel().await?;
    drop(strong);
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await
        .map_err(connection_error("set the prefetch of a delay level"))?;
    let consumer = channel
        .basic_consume(
            queue.as_str().into(),
            format!("event-retry-ladder-{k:02}").as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(connection_error("consume a delay level"))?;
    debug!(level = k, %queue, "moving the delay ladder's copies");
    let moved = consumer
        .take_until(stop.clone().cancelled_owned())
        .map_err(|e| connection_error("receive from a delay level")(e))
        .try_for_each_concurrent(usize::from(PREFETCH), |delivery| {
            move_copy(link, k, delivery, stop)
        })
        .await;
    match moved {
        Ok(()) if stop.is_cancelled() => Ok(()),
        Err(e) if e.kind() == Kind::Closed && link.upgrade().is_none() => Ok(()),
        Err(e) => Err(e),
        Ok(()) => Err(Error::new(
            Kind::Connection,
            format!("the broker ended the consumer of {queue}"),
        )),
    }
}

fn gone() -> Error {
    Error::new(Kind::Closed, "the transport is gone")
}

/// Waits until `delivery`, a copy in level `k`, is due out of it, sends it on and acknowledges it. The
/// link is held only to read the settings and from the send to the acknowledgement, never while
/// waiting, so a transport dropped meanwhile is dropped (and its movers stopped). Once `stop` is
/// cancelled a copy still waiting is left unacknowledged; one being sent is sent and acknowledged.
async fn move_copy<L: Hops>(
    link: &Weak<L>,
    k: u32,
    delivery: Delivery,
    stop: &CancellationToken,
) -> Result<(), Error> {
    let key = delivery.routing_key.as_str();
    let now = now_ms();
    let (due, next_due) = {
        let link = link.upgrade().ok_or_else(gone)?;
        let due = due_out(&delivery.properties, link.ladder().wait_ms(k), now);
        (due, link.ladder().next_due(key, k, due))
    };
    if due > now {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(due - now)) => {}
            () = stop.cancelled() => return Ok(()),
        }
    }
    if stop.is_cancelled() {
        return Ok(());
    }
    let link = link.upgrade().ok_or_else(gone)?;
    let props = with_hop_due(delivery.properties.clone(), next_due);
    link.publish(
        &link.ladder().below(k),
        key,
        &delivery.data,
        props,
        "move a retry copy down the delay ladder",
    )
    .await?;
    delivery
        .acker
        .ack(BasicAckOptions::default())
        .await
        .map(drop)
        .map_err(connection_error("acknowledge a moved copy"))
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// When a copy with `props` leaves a level whose wait is `wait` ms, seen at `now`: its header, unless
/// there is none, it does not parse or it lies further away than the whole wait; then `now + wait`.
fn due_out(props: &BasicProperties, wait: u64, now: u64) -> u64 {
    let latest = now.saturating_add(wait);
    hop_due(props)
        .filter(|&due| due <= latest)
        .unwrap_or(latest)
}

/// The `x-retry-hop-due` header of `props`, in milliseconds since the Unix epoch.
fn hop_due(props: &BasicProperties) -> Option<u64> {
    let value = props.headers().as_ref()?.inner().get(HOP_DUE)?;
    match value {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.parse().ok(),
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongUInt(n) => Some(u64::from(*n)),
        _ => None,
    }
}

/// `props` with `x-retry-hop-due` set to `due` (milliseconds since the Unix epoch), or removed for a copy
/// that leaves the ladder.
pub(crate) fn with_hop_due(props: BasicProperties, due: Option<u64>) -> BasicProperties {
    let mut table = FieldTable::default();
    if let Some(headers) = props.headers() {
        for (name, value) in headers.inner() {
            if name.as_str() != HOP_DUE {
                table.insert(name.clone(), value.clone());
            }
        }
    }
    if let Some(due) = due {
        table.insert(
            ShortString::from(HOP_DUE),
            AMQPValue::LongString(LongString::from(due.to_string())),
        );
    }
    props.with_headers(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due_at(due: Option<u64>) -> BasicProperties {
        with_hop_due(BasicProperties::default(), due)
    }

    #[test]
    fn a_copy_leaves_its_level_at_its_header_time() {
        assert_eq!(due_out(&due_at(Some(1_500)), 800, 1_000), 1_500);
        // Already past: at once.
        assert_eq!(due_out(&due_at(Some(900)), 800, 1_000), 900);
        assert_eq!(hop_due(&due_at(Some(42))), Some(42));
    }

    #[test]
    fn a_time_it_cannot_trust_counts_a_whole_wait_from_now() {
        // No header: never early.
        assert_eq!(due_out(&BasicProperties::default(), 800, 1_000), 1_800);
        // Further away than the level's wait: a clock ahead of this one.
        assert_eq!(due_out(&due_at(Some(5_000)), 800, 1_000), 1_800);
        let mut table = FieldTable::default();
        table.insert(
            ShortString::from(HOP_DUE),
            AMQPValue::LongString(LongString::from("soon")),
        );
        let malformed = BasicProperties::default().with_headers(table);
        assert_eq!(due_out(&malformed, 800, 1_000), 1_800);
    }

    #[test]
    fn leaving_the_ladder_removes_the_header_and_keeps_the_others() {
        let mut table = FieldTable::default();
        table.insert(
            ShortString::from("app"),
            AMQPValue::LongString(LongString::from("kept")),
        );
        let props = with_hop_due(BasicProperties::default().with_headers(table), Some(7));
        let out = with_hop_due(props, None);
        let headers = out.headers().clone().unwrap_or_default();
        assert!(headers.inner().get(HOP_DUE).is_none());
        assert!(headers.inner().get("app").is_some());
    }
}
