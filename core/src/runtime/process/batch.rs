//! A batch handler's deliveries: each decoded and admitted alone, the handler called once for those
//! admitted, each settled by its own result through the same decision and settle as a single delivery.
//!
//! Separate because only a batch consumer takes this path, and what it adds — one call for many
//! events, their futures joined in short lists — is about batches alone.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use tracing::Instrument;

use super::admission::Admission;
use super::call::panicked;
use super::dead_letter::dead_letter;
use super::decode::{Prepared, prepare};
use super::{FirstCall, Handling};
use crate::adapter::Delivery;
use crate::classify::HandlerError;
use crate::lifecycle::Input;
use crate::metadata::DeadReason;
use crate::runtime::batch::{BatchHandler, BatchItem, one_per_event};
use crate::runtime::shared::Shared;

/// Handles a batch of deliveries with `handler`: each delivery is decoded and admitted on its own (a
/// poison one dead-lettered, a duplicate acknowledged), the handler is called once with the events
/// admitted, and each event is then settled by its own result, as [`process`] settles one.
pub(in crate::runtime) async fn process_batch(
    shared: Arc<Shared>,
    deliveries: Vec<Delivery>,
    handler: Arc<dyn BatchHandler>,
) {
    let mut prepared = Vec::with_capacity(deliveries.len());
    // The batch's deliveries were taken together: one reading of the clock is the time of each.
    let taken = SystemTime::now();
    for delivery in deliveries {
        let Delivery {
            message,
            info,
            mut receipt,
        } = delivery;
        // Decoded in place; only a poison delivery waits here, for its dead letter.
        match prepare(&shared, message, info, taken) {
            Prepared::Ready(ready) => prepared.push((ready, receipt)),
            Prepared::Poison(mut poison) => {
                Box::pin(dead_letter(
                    &shared,
                    &mut *receipt,
                    &mut poison,
                    DeadReason::Poison,
                ))
                .await;
            }
        }
    }
    let handlings = prepared.iter_mut().map(|(ready, receipt)| {
        let span = std::mem::replace(&mut ready.span, tracing::Span::none());
        (Handling::new(&shared, &mut **receipt, ready), span)
    });
    let mut admitted = Vec::with_capacity(handlings.len());
    let mut busy = Vec::new();
    let mut refused = Vec::new();
    if shared.idempotency.is_none() && shared.parking.is_none() {
        // Nothing to wait for before the call: admitted in place, without a future each.
        for (mut handling, span) in handlings {
            let lateness = handling.lateness();
            if handling.step(Input::Claim) {
                admitted.push((handling, lateness, span));
            } else {
                refused.push((handling, span));
            }
        }
    } else {
        let admitting = handlings.map(|(mut handling, span)| {
            let outer = span.clone();
            async move {
                let admission = handling.admit(false).await;
                (handling, admission, span)
            }
            .instrument(outer)
        });
        for (handling, admission, span) in join_all_chunked(admitting.collect()).await {
            match admission {
                Admission::Run(lateness) => admitted.push((handling, lateness, span)),
                Admission::Busy(lateness) => busy.push((handling, lateness, span)),
                Admission::Ended => {}
            }
        }
    }
    for (mut handling, span) in refused {
        handling.release(Duration::ZERO).instrument(span).await;
    }
    if !admitted.is_empty() {
        call_and_settle(&shared, &*handler, admitted).await;
    }
    // Deliveries of an id another one held (a duplicate in the same batch, say) claim it now, waiting
    // for its owner as a single delivery does, and run alone.
    for (mut handling, lateness, span) in busy {
        async move {
            if let Admission::Run(lateness) = handling.claim(lateness, true).await {
                handling.attempt(lateness, FirstCall::None).await;
            }
        }
        .instrument(span)
        .await;
    }
}

/// Calls `handler` once with the admitted events, then settles each by its own result.
async fn call_and_settle<'a>(
    shared: &Shared,
    handler: &dyn BatchHandler,
    admitted: Vec<(Handling<'a>, Option<Duration>, tracing::Span)>,
) {
    let items: Vec<BatchItem<'_>> = admitted
        .iter()
        .map(|(handling, lateness, _)| BatchItem {
            event: handling.event,
            ctx: handling.context(*lateness),
        })
        .collect();
    let events = items.len();
    for _ in 0..events {
        shared.counters.bump(&shared.counters.attempts);
    }
    let started = Instant::now();
    let mut results = AssertUnwindSafe(handler.handle_batch(&items))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            let message = panicked(&*panic).message();
            (0..events)
                .map(|_| Err(HandlerError::unclassified(message.clone())))
                .collect()
        });
    let took = started.elapsed();
    drop(items);
    for _ in 0..events {
        shared.telemetry.attempt(took);
    }
    one_per_event(&mut results, events);
    // A success is acknowledged here where the receipt can without waiting, as a single delivery's is
    // (`Handling::first_poll`): only the events with something to wait for — a failure's route, an
    // acknowledgement in flight, an idempotency record — get a future of their own.
    let mut settling = Vec::new();
    for ((mut handling, lateness, span), result) in admitted.into_iter().zip(results) {
        let rest = if result.is_ok() {
            match span.in_scope(|| handling.ack_at_once()) {
                None => continue,
                rest => rest,
            }
        } else {
            None
        };
        settling.push(
            async move {
                match rest {
                    Some(rest) => handling.settle(rest).await,
                    None => handling.attempt(lateness, FirstCall::Done(result)).await,
                }
            }
            .instrument(span),
        );
    }
    if !settling.is_empty() {
        join_all_chunked(settling).await;
    }
}

/// Runs `futures` concurrently and returns their outputs in order. `futures::future::join_all` keeps a
/// list of up to 30 futures in one allocation but gives each future of a longer one a task of its own
/// (so a batch longer than that runs markedly slower on the runtime bench); here every chunk of up to 30
/// is one such short list, and the chunks are joined the same way.
async fn join_all_chunked<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    /// The longest list `join_all` keeps in one allocation.
    const CHUNK: usize = 30;
    let mut futures = futures.into_iter().peekable();
    let mut chunks = Vec::new();
    while futures.peek().is_some() {
        chunks.push(futures::future::join_all(
            futures.by_ref().take(CHUNK).collect::<Vec<_>>(),
        ));
    }
    futures::future::join_all(chunks)
        .await
        .into_iter()
        .flatten()
        .collect()
}
