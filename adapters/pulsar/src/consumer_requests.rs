//! Asking the pulsar client's consumer for something (a close, its stats, the last message id) when
//! nobody may be reading its messages: each request is made in growing attempts, taking what the
//! consumer's engine task queued in between. Separate because the subscription, the DLQ sessions and
//! the link all ask this way.
//!
//! The client runs one engine task per consumer. It receives the broker's messages, asks the broker for
//! more as it receives them (not as they are read), and puts them on a bounded queue the consumer reads
//! from. The same task answers the consumer's requests, between two messages. Once that queue is full
//! it waits for room before it does anything else, so a request made while nobody reads the consumer
//! waits for ever. That happens to a consumer that shuts down with a backlog behind it, to a DLQ
//! operation on a large DLQ, and to a consumer that only makes a subscription and leaves.
//!
//! [`ask`] makes the request in attempts, the first `FIRST_ATTEMPT` long and each next one twice as
//! long (an attempt also waits for the broker's answer). Before each one it takes the messages the
//! engine queued, so the engine has room to reach the request, and hands them to the caller: a DLQ
//! session keeps them; a consumer that is closing lets them go, and the broker gives back what was not
//! acknowledged once the consumer is closed. One taking is enough when the consumer's queue holds a
//! whole batch (the client asks the broker for up to a batch at a time): the DLQ's consumers and those
//! that only make a subscription. A consumer of the runtime queues no more than its `max_in_flight`, so
//! with a backlog up to a whole batch of received messages can be ahead of the request, and each
//! attempt asks again behind the newest: its close is given a few seconds (see `subscription`).
//!
//! An attempt given up leaves its request with the engine, which answers it to nobody (the client logs
//! that as an error); the next attempt asks again (Pulsar 4 answers a repeated close as done; older
//! brokers answer it with an error). Each topic's engine answers in the order it was asked, after the
//! acknowledgements made before the request, so an answered request still means those acknowledgements
//! reached the client's connection first (unless it reconnected in between, when they are lost and
//! their messages come back).

use std::time::Duration;

use event_retry_core::error::{Error, Kind};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use pulsar::consumer::Message;
use pulsar::{Consumer, TokioExecutor};

use crate::error::error;

/// The client's consumer of raw payloads, as the adapter uses it.
pub(crate) type PulsarConsumer = Consumer<Vec<u8>, TokioExecutor>;

/// A message (or a receive error) the consumer's queue held.
pub(crate) type Received = Result<Message<Vec<u8>>, pulsar::Error>;

/// How long the first attempt waits; each next one waits twice as long as the one before.
const FIRST_ATTEMPT: Duration = Duration::from_millis(250);

/// Makes `request` of `consumer` for `operation`, taking the messages its engine queued before each
/// attempt and handing them to `keep`, until the request is answered or `patience` has passed (an
/// error of [`Kind::Timeout`]). A failed request is an error of the kind the client's error tells.
/// `request` may be made more than once, so it must be one that can be repeated.
pub(crate) async fn ask<T>(
    consumer: &mut PulsarConsumer,
    operation: &str,
    patience: Duration,
    mut keep: impl FnMut(Received),
    mut request: impl for<'c> FnMut(&'c mut PulsarConsumer) -> BoxFuture<'c, Result<T, pulsar::Error>>,
) -> Result<T, Error> {
    let deadline = tokio::time::Instant::now() + patience;
    let mut attempt = FIRST_ATTEMPT;
    loop {
        take_queued(consumer, &mut keep);
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let wait = attempt.min(left);
        attempt = attempt.saturating_mul(2);
        match tokio::time::timeout(wait, request(consumer)).await {
            Ok(answer) => return answer.map_err(error(operation)),
            Err(_) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(
                    operation,
                    "the Pulsar client has not answered yet: taking what it queued and asking again"
                );
            }
            Err(_) => {
                return Err(Error::new(
                    Kind::Timeout,
                    format!("the Pulsar client did not answer within {patience:?}"),
                )
                .with_operation(operation.to_string()));
            }
        }
    }
}

/// Closes `consumer` for `operation` within `patience`, letting go of the messages it queued: the
/// broker gives them back (unacknowledged) once it is closed.
pub(crate) async fn close(
    consumer: &mut PulsarConsumer,
    operation: &str,
    patience: Duration,
) -> Result<(), Error> {
    ask(consumer, operation, patience, drop, |c| c.close().boxed()).await
}

/// Hands `keep` every message the consumer's queue holds now, without waiting for more.
fn take_queued(consumer: &mut PulsarConsumer, keep: &mut impl FnMut(Received)) {
    while let Some(Some(received)) = consumer.next().now_or_never() {
        keep(received);
    }
}
