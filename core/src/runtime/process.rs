//! One delivery, from decoding to a settled outcome.
//!
//! Each delivery's future is allocated and moved whole, so it is kept small: the delivery is decoded
//! before the future is made, the future holds the decoded event once and every step borrows it (a step
//! that took the handling by value left a copy of it in each enclosing future: 4,240 bytes per event, now
//! about 1,000), and the cold paths (a retry, a dead letter, a hold, an in-place wait, a failed settle,
//! the idempotency claim) are boxed where they are awaited.
//!
//! The order of operations is the safety argument: the handler runs, the pure decision picks an outcome,
//! and the receipt carries it out — an acknowledgement only after success, a retry or DLQ copy that the
//! broker confirmed before the original is let go. An unwritable DLQ is a dependency outage: the original
//! stays unsettled where the broker keeps it, consumption is held (as for a blocking error), and the dead
//! letter is tried again with the blocking backoff until the DLQ accepts it, each failure counted and
//! surfaced. Any other settle the broker does not accept is counted and surfaced and the delivery released
//! for redelivery: never dropped.
//!
//! A batch handler's deliveries take the same steps ([`process_batch`]): each is prepared and admitted
//! alone, the handler is called once for those admitted, and each is settled by its own result through
//! the same decision and settle code as a single delivery.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt;
use rand::RngCore;
use tracing::{Instrument, debug, info_span, warn};

use super::batch::{BatchHandler, BatchItem, one_per_event};
use super::handler::{Context, UndecodablePayload};
use super::ordering::Verdict;
use super::receive::Shared;
use crate::adapter::{Delivery, DeliveryInfo, Receipt};
use crate::classify::{FailureKind, HandlerError, chain};
use crate::decide::{Attempt, Decision, Outcome, decide_in};

use super::probe::ProbeFn;
use crate::error::Kind;
use crate::event::Event;
use crate::idempotency::Begin;
use crate::lifecycle::{Input, State, TransitionError};
use crate::metadata::{self, DeadInfo, DeadReason};
use crate::time::Timestamp;

/// Handles one delivery to a settled (or released) end, and drops `guard` (its work slot, say) at the
/// end.
///
/// The delivery is decoded now, before the future is made, so the future holds the decoded event once:
/// the handling's steps borrow it instead of moving it from one nested future into the next (each move
/// a copy in the enclosing future's layout — measured, the future of the common path was 4,240 bytes
/// when they did, allocated and copied per event).
pub(super) fn process<G: Send + 'static>(
    shared: Arc<Shared>,
    delivery: Delivery,
    guard: G,
) -> impl Future<Output = ()> + Send + 'static {
    let Delivery {
        message,
        info,
        mut receipt,
    } = delivery;
    let mut prepared = prepare(&shared, message, info);
    async move {
        match &mut prepared {
            Prepared::Ready(ready) => {
                let span = std::mem::replace(&mut ready.span, tracing::Span::none());
                let mut handling = Handling {
                    shared: &shared,
                    receipt: &mut *receipt,
                    event: &mut ready.event,
                    id: &ready.id,
                    state: State::Pending,
                };
                handling.run(ready.received).instrument(span).await;
            }
            Prepared::Poison(poison) => {
                Box::pin(dead_letter(
                    &shared,
                    &mut *receipt,
                    poison,
                    DeadReason::Poison,
                ))
                .await;
            }
        }
        // The delivery (its receipt) goes before its work slot, so that no more deliveries are alive
        // than the slots allow.
        drop(prepared);
        drop(receipt);
        drop(guard);
    }
}

/// Decodes a delivery: ready to handle, with its receipt; `None` when it was poison, and went to the DLQ.
async fn prepare_or_dead_letter(
    shared: &Shared,
    delivery: Delivery,
) -> Option<(Ready, Box<dyn Receipt>)> {
    let Delivery {
        message,
        info,
        mut receipt,
    } = delivery;
    // Decoding is synchronous and its locals die before the first await: only what the handling needs
    // is kept in this future.
    match prepare(shared, message, info) {
        Prepared::Ready(ready) => Some((ready, receipt)),
        Prepared::Poison(mut poison) => {
            Box::pin(dead_letter(
                shared,
                &mut *receipt,
                &mut poison,
                DeadReason::Poison,
            ))
            .await;
            None
        }
    }
}

/// Handles a batch of deliveries with `handler`: each delivery is decoded and admitted on its own (a
/// poison one dead-lettered, a duplicate acknowledged), the handler is called once with the events
/// admitted, and each event is then settled by its own result, as [`process`] settles one.
pub(super) async fn process_batch(
    shared: Arc<Shared>,
    deliveries: Vec<Delivery>,
    handler: Arc<dyn BatchHandler>,
) {
    let mut prepared = Vec::with_capacity(deliveries.len());
    for delivery in deliveries {
        if let Some(ready) = prepare_or_dead_letter(&shared, delivery).await {
            prepared.push(ready);
        }
    }
    let handlings = prepared.iter_mut().map(|(ready, receipt)| {
        let handling = Handling {
            shared: &shared,
            receipt: &mut **receipt,
            event: &mut ready.event,
            id: &ready.id,
            state: State::Pending,
        };
        let span = std::mem::replace(&mut ready.span, tracing::Span::none());
        (handling, span, ready.received)
    });
    let mut admitted = Vec::with_capacity(handlings.len());
    let mut busy = Vec::new();
    let mut refused = Vec::new();
    if shared.idempotency.is_none() && shared.parking.is_none() {
        // Nothing to wait for before the call: admitted in place, without a future each.
        for (mut handling, span, received) in handlings {
            let lateness = handling.lateness_at(received);
            if handling.step(Input::Claim) {
                admitted.push((handling, lateness, span));
            } else {
                refused.push((handling, span));
            }
        }
    } else {
        let admitting = handlings.map(|(mut handling, span, received)| {
            let outer = span.clone();
            async move {
                let admission = handling.admit(received, false).await;
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
                handling.attempt(lateness, None).await;
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
    let settling =
        admitted
            .into_iter()
            .zip(results)
            .map(|((mut handling, lateness, span), result)| {
                async move { handling.attempt(lateness, Some(result)).await }.instrument(span)
            });
    join_all_chunked(settling.collect()).await;
}

/// Runs `futures` concurrently and returns their outputs in order. `futures::future::join_all` keeps a
/// list of up to 30 futures in one allocation but gives each future of a longer one a task of its own
/// (measured: a batch of 64 ran at two thirds of the rate of batches of 30); here every chunk of up to 30
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

/// The error a handler's panic becomes: unclassified, with the panic's message.
fn panicked(panic: &(dyn std::any::Any + Send)) -> HandlerError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string());
    HandlerError::unclassified(format!("handler panicked: {message}"))
}

/// Records what an attempt led to on its span: `outcome` (`ack`, `retry`, `retry_in_place`, `hold`,
/// `dead`), and an error status for a dead letter.
fn record_outcome(outcome: &Outcome) {
    let span = tracing::Span::current();
    let name = match outcome {
        Outcome::Ack => "ack",
        Outcome::RetryAfter(_) => "retry",
        Outcome::RetryInPlace(_) => "retry_in_place",
        Outcome::Hold(_) => "hold",
        Outcome::Dead(_) => {
            span.record("otel.status_code", "ERROR");
            "dead"
        }
    };
    span.record("outcome", name);
}

/// Where an event's handling stands after [`Handling::admit`].
enum Admission {
    /// The handler is to run, with this retry lateness.
    Run(Option<Duration>),
    /// Another delivery of the same id holds its idempotency key; claim again once it is settled.
    Busy(Option<Duration>),
    /// Settled or given back already (parked, a duplicate, refused).
    Ended,
}

/// What an idempotency claim found.
enum Claim {
    /// The id is this delivery's to handle.
    Fresh,
    /// The delivery was settled (a duplicate) or released.
    Ended,
    /// Another delivery holds the id.
    Busy,
}

/// A delivery decoded: ready to handle, or poison (its metadata does not parse).
enum Prepared {
    Ready(Ready),
    Poison(Event),
}

/// A delivery decoded and ready to handle.
struct Ready {
    event: Event,
    id: Arc<str>,
    span: tracing::Span,
    /// When the delivery was taken (one clock reading serves first-seen and lateness).
    received: Timestamp,
}

/// Decodes a delivery's metadata and completes it from the broker's facts.
fn prepare(shared: &Shared, message: crate::event::RawMessage, info: DeliveryInfo) -> Prepared {
    shared.counters.bump(&shared.counters.received);
    let now = Timestamp::now();
    // Decoded from the headers in place: the message itself is needed again only for a poison event.
    let mut event = match metadata::decode(&message.headers) {
        Ok((meta, headers)) => Event {
            payload: message.payload,
            key: message.key,
            headers,
            meta,
        },
        Err(err) => {
            // Keep what did parse (event id, origin, history) for whoever triages the DLQ entry.
            let (meta, headers, problems) = metadata::decode_lenient(&message.headers);
            let mut poison = Event {
                payload: message.payload,
                key: message.key,
                headers,
                meta,
            };
            poison
                .meta
                .event_id
                .get_or_insert_with(|| info.message_id.clone());
            poison
                .meta
                .origin
                .get_or_insert_with(|| info.origin.clone());
            poison.meta.first_seen.get_or_insert(now);
            poison.meta.error_kind = Some(FailureKind::NonRetryable);
            let reasons: Vec<String> = problems.iter().map(ToString::to_string).collect();
            let reasons = if reasons.is_empty() {
                err.to_string()
            } else {
                reasons.join("; ")
            };
            poison.meta.set_last_error(&format!("poison: {reasons}"));
            warn!(event_id = %info.message_id, error = %err, "poison message: malformed metadata");
            return Prepared::Poison(poison);
        }
    };
    let meta = &mut event.meta;
    // The delivery's facts are moved in, not copied: each is needed once.
    let DeliveryInfo {
        message_id,
        origin,
        broker_attempts,
        broker_retries,
    } = info;
    let id: Arc<str> = Arc::from(meta.event_id.get_or_insert(message_id).as_str());
    meta.first_seen.get_or_insert(now);
    meta.origin.get_or_insert(origin);
    if let Some(counted) = broker_attempts {
        meta.attempts = meta.attempts.max(counted);
    }
    if let Some(counted) = broker_retries {
        meta.retries = meta.retries.max(counted);
    }
    // One span per attempt, named and attributed after the OpenTelemetry messaging conventions (so an
    // exporter shows it as a consumer span); `topic`, `event_id` and `attempt` are kept for logs.
    let span = info_span!(
        "event",
        topic = %shared.spec.topic,
        event_id = %id,
        attempt = meta.attempts.saturating_add(1),
        replays = meta.replay_count,
        next_delay_ms = tracing::field::Empty,
        outcome = tracing::field::Empty,
        otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        messaging.system = shared.system,
        messaging.operation.type = "process",
        messaging.destination.name = %shared.spec.topic,
        messaging.consumer.group.name = %shared.spec.group,
        messaging.message.id = %id,
    );
    #[cfg(feature = "opentelemetry")]
    crate::trace_context::continue_from(&span, &event.headers);
    Prepared::Ready(Ready {
        event,
        id,
        span,
        received: now,
    })
}

/// One event's handling: references to what the delivery's future holds, so that the nested futures of
/// its steps (each borrowing this) stay small.
struct Handling<'a> {
    shared: &'a Shared,
    receipt: &'a mut dyn Receipt,
    event: &'a mut Event,
    /// The event id, shared with every context made for it.
    id: &'a Arc<str>,
    state: State,
}

impl<'a> Handling<'a> {
    /// The state `input` moves the event to, if the lifecycle allows it now. The runtime asks before
    /// it acts and takes the action only when allowed: a refused transition is a bug in the runtime, so
    /// it panics in debug builds (every test), and in production it is counted (`lifecycle_violations`,
    /// and the metric of that name) and logged, and the caller gives the delivery back to the broker
    /// instead of acting.
    fn permit(&self, input: Input) -> Option<State> {
        match self.state.on(input) {
            Ok(next) => Some(next),
            Err(e) => {
                self.refused(e);
                None
            }
        }
    }

    /// Reports a transition the lifecycle refused: a panic in debug builds, counted and logged in
    /// production; the caller then gives the delivery back instead of acting.
    fn refused(&self, e: TransitionError) {
        if cfg!(debug_assertions) {
            panic!("{e}");
        }
        let shared = self.shared;
        shared
            .counters
            .error(&shared.counters.lifecycle_violations, e.to_string());
        shared.telemetry.lifecycle_violation();
        tracing::error!(error = %e, "lifecycle transition refused: the action is not taken");
    }

    /// Moves the lifecycle on with `input`, an input that changes nothing at the broker (a claim, a
    /// hold and its end); `false` when refused.
    fn step(&mut self, input: Input) -> bool {
        match self.permit(input) {
            Some(next) => {
                self.state = next;
                true
            }
            None => false,
        }
    }

    fn ordered_key(&self) -> Option<Bytes> {
        self.shared.parking.as_ref().and(self.event.key.clone())
    }

    /// Handles the event, received at `now`.
    async fn run(&mut self, now: Timestamp) {
        if let Admission::Run(lateness) = self.admit(now, true).await {
            self.attempt(lateness, None).await;
        }
    }

    /// Everything before the handler's first call, received at `now`: lateness, per-key parking, the
    /// idempotency claim and the claim transition (see [`Handling::claim`]).
    async fn admit(&mut self, now: Timestamp, wait_for_owner: bool) -> Admission {
        let shared = self.shared;
        let lateness = self.lateness_at(now);
        if let (Some(parking), Some(key)) = (&shared.parking, self.ordered_key()) {
            match parking.verdict(&key, self.id, now) {
                Verdict::Run => self.event.meta.parked_behind = None,
                Verdict::Park { head, delay } => {
                    Box::pin(self.park(head, delay)).await;
                    return Admission::Ended;
                }
                Verdict::FollowToDlq { head } => {
                    self.event
                        .meta
                        .set_last_error(&format!("parked behind {head}, which was dead-lettered"));
                    let dead = if self.step(Input::Claim) {
                        self.permit(Input::Die)
                    } else {
                        None
                    };
                    let Some(dead) = dead else {
                        self.release(Duration::ZERO).await;
                        return Admission::Ended;
                    };
                    self.state = dead;
                    Box::pin(dead_letter(
                        shared,
                        &mut *self.receipt,
                        self.event,
                        DeadReason::ParkedBehindDead,
                    ))
                    .await;
                    return Admission::Ended;
                }
            }
        }
        self.claim(lateness, wait_for_owner).await
    }

    /// How late this retry, received at `now`, started (recorded in the lateness metric); `None` for a
    /// first delivery, and for a parked event coming back (lateness is a property of retries).
    fn lateness_at(&self, now: Timestamp) -> Option<Duration> {
        let lateness = match self.event.meta.parked_behind {
            None => self.event.meta.due_at.map(|due| now.since(due)),
            Some(_) => None,
        };
        if let Some(late) = lateness {
            self.shared.telemetry.lateness(late);
        }
        lateness
    }

    /// Claims the event: its idempotency key (where the consumer has a store) and the lifecycle's claim.
    /// `Run` when the handler is to run; `Ended` when the event's handling ended here (a duplicate,
    /// given back); `Busy` — only unless `wait_for_owner` — when another delivery of the same id holds
    /// the key (a batch cannot wait for it: it may be the batch's own).
    async fn claim(&mut self, lateness: Option<Duration>, wait_for_owner: bool) -> Admission {
        if self.shared.idempotency.is_some() {
            match Box::pin(self.claim_idempotency(wait_for_owner)).await {
                Claim::Fresh => {}
                Claim::Ended => return Admission::Ended,
                Claim::Busy => return Admission::Busy(lateness),
            }
        }
        if !self.step(Input::Claim) {
            self.release(Duration::ZERO).await;
            return Admission::Ended;
        }
        Admission::Run(lateness)
    }

    /// Calls the handler (or takes `first`, the result of a batch call already made) and carries out
    /// what the decision says, calling again for in-place retries and holds, until the event is
    /// settled or given back.
    async fn attempt(
        &mut self,
        lateness: Option<Duration>,
        mut first: Option<Result<(), HandlerError>>,
    ) {
        let shared = self.shared;
        let mut in_place_retries = 0;
        let mut holds = 0;
        let mut pause = None;
        loop {
            let result = match first.take() {
                Some(result) => result,
                None => self.call_handler(lateness).await,
            };
            let poison = result
                .as_ref()
                .err()
                .is_some_and(|e| chain(e.as_error()).any(|e| e.is::<UndecodablePayload>()));
            let kind = result
                .as_ref()
                .map_err(|e| shared.classifier.classify(e))
                .err();
            if let Err(e) = &result {
                self.event.meta.attempts = self.event.meta.attempts.saturating_add(1);
                self.event.meta.set_last_error(&e.message());
                self.event.meta.error_kind = kind;
            }
            let now = Timestamp::now();
            let decided = if poison {
                let outcome = Outcome::Dead(DeadReason::Poison);
                outcome
                    .transition(self.state, now)
                    .map(|next| Decision { outcome, next })
            } else {
                let attempt = Attempt {
                    meta: &self.event.meta,
                    in_place_retries,
                    holds,
                    now,
                };
                let mut rng = shared.rng.lock().unwrap_or_else(|p| p.into_inner());
                decide_in(
                    self.state,
                    kind.map_or(Ok(()), Err),
                    &attempt,
                    &shared.policies,
                    &mut *rng as &mut dyn RngCore,
                )
            };
            // The decision carries the state its action leads to; a refused one is not acted on.
            let Decision { outcome, next } = match decided {
                Ok(decision) => decision,
                Err(e) => {
                    self.refused(e);
                    return Box::pin(self.give_back()).await;
                }
            };
            debug!(?outcome, "decided");
            record_outcome(&outcome);
            match outcome {
                Outcome::RetryInPlace(pause_for) => {
                    in_place_retries += 1;
                    shared.counters.bump(&shared.counters.in_place_retries);
                    shared.telemetry.in_place_retry();
                    if !Box::pin(self.wait(pause_for)).await {
                        return Box::pin(self.release_on_shutdown()).await;
                    }
                }
                Outcome::Hold(backoff) => {
                    if pause.is_none() {
                        self.state = next;
                        warn!(error = ?self.event.meta.last_error, "blocking error: pausing consumption");
                        let reason = self.event.meta.last_error.as_deref().unwrap_or("blocking");
                        pause = Some(shared.pause.hold(reason));
                    }
                    holds += 1;
                    shared.counters.bump(&shared.counters.holds);
                    shared.telemetry.hold();
                    if let Err(e) =
                        Box::pin(self.receipt.keep_alive(backoff + Duration::from_secs(30))).await
                    {
                        shared
                            .counters
                            .error(&shared.counters.settle_errors, e.to_string());
                    }
                    if !Box::pin(self.wait(backoff)).await {
                        return Box::pin(self.release_on_shutdown()).await;
                    }
                    let probe = result
                        .as_ref()
                        .err()
                        .and_then(|e| shared.probes.for_error(e));
                    if let Some(probe) = probe
                        && !Box::pin(self.probe_until_healed(&probe, &mut holds)).await
                    {
                        return Box::pin(self.release_on_shutdown()).await;
                    }
                }
                Outcome::Ack => {
                    if pause.take().is_some() && !self.step(Input::Unblock) {
                        return Box::pin(self.give_back()).await;
                    }
                    self.ack(next).await;
                    return;
                }
                Outcome::RetryAfter(delay) => {
                    if pause.take().is_some() && !self.step(Input::Unblock) {
                        return Box::pin(self.give_back()).await;
                    }
                    return Box::pin(self.retry_later(delay, next)).await;
                }
                Outcome::Dead(reason) => {
                    if pause.take().is_some() && !self.step(Input::Unblock) {
                        return Box::pin(self.give_back()).await;
                    }
                    self.state = next;
                    self.abandon_idempotency().await;
                    let key = self.ordered_key();
                    let accepted =
                        Box::pin(dead_letter(shared, &mut *self.receipt, self.event, reason)).await;
                    if let (true, Some(parking), Some(key)) = (accepted, &shared.parking, key) {
                        parking.resolved(&key, self.id, true, Timestamp::now());
                    }
                    return;
                }
            }
        }
    }

    /// Calls the dependency's probe on the blocking backoff until it answers `Ok` (the held event then
    /// runs again) or its backoff is spent (the handler runs again, and the decision falls through as
    /// without a probe); the handler is not run meanwhile. `false` on shutdown.
    async fn probe_until_healed(&mut self, probe: &ProbeFn, holds: &mut u32) -> bool {
        let shared = self.shared;
        loop {
            match probe().await {
                Ok(()) => return true,
                Err(e) => debug!(error = %e, "the blocking dependency's probe failed"),
            }
            let backoff = {
                let mut rng = shared.rng.lock().unwrap_or_else(|p| p.into_inner());
                shared
                    .policies
                    .blocking
                    .delay(*holds, None, &mut *rng as &mut dyn RngCore)
            };
            let Some(backoff) = backoff else {
                return true;
            };
            *holds += 1;
            shared.counters.bump(&shared.counters.holds);
            shared.telemetry.hold();
            if let Err(e) = self
                .receipt
                .keep_alive(backoff + Duration::from_secs(30))
                .await
            {
                shared
                    .counters
                    .error(&shared.counters.settle_errors, e.to_string());
            }
            if !self.wait(backoff).await {
                return false;
            }
        }
    }

    /// Claims the event id in the idempotency store: `Ended` when the delivery was settled as a
    /// duplicate or released; `Busy`, without waiting, when another delivery holds the id and
    /// `wait_for_owner` is false.
    ///
    /// A store that fails (its database is down) is a dependency outage, as a blocking error is:
    /// consumption pauses and the claim is asked again on the blocking backoff until the store answers —
    /// the event is neither handled unguarded nor dead-lettered for it.
    async fn claim_idempotency(&mut self, wait_for_owner: bool) -> Claim {
        let shared = self.shared;
        let Some(store) = &shared.idempotency else {
            return Claim::Fresh;
        };
        let mut waited = Duration::ZERO;
        let mut outage = None;
        let mut holds = 0;
        loop {
            match store.begin(self.id).await {
                Ok(Begin::Fresh) => return Claim::Fresh,
                Ok(Begin::Done) => {
                    self.shared
                        .counters
                        .bump(&self.shared.counters.duplicates_skipped);
                    self.shared.telemetry.duplicate_skipped();
                    debug!("duplicate delivery skipped");
                    self.settle_ack().await;
                    return Claim::Ended;
                }
                Ok(Begin::InProgress) if !wait_for_owner => return Claim::Busy,
                Ok(Begin::InProgress) if waited < Duration::from_secs(30) => {
                    let step = Duration::from_millis(50);
                    if !self.wait(step).await {
                        self.release(Duration::ZERO).await;
                        return Claim::Ended;
                    }
                    waited += step;
                }
                Ok(Begin::InProgress) => {
                    self.release(Duration::from_secs(1)).await;
                    return Claim::Ended;
                }
                Err(e) => {
                    shared
                        .counters
                        .error(&shared.counters.settle_errors, e.to_string());
                    if outage.is_none() {
                        warn!(error = %e, "idempotency store unavailable: pausing consumption");
                        outage = Some(
                            shared
                                .pause
                                .hold(&format!("idempotency store unavailable: {e}")),
                        );
                    }
                    let backoff = outage_backoff(shared, holds);
                    holds = holds.saturating_add(1);
                    shared.counters.bump(&shared.counters.holds);
                    shared.telemetry.hold();
                    if let Err(e) = self
                        .receipt
                        .keep_alive(backoff + Duration::from_secs(30))
                        .await
                    {
                        shared
                            .counters
                            .error(&shared.counters.settle_errors, e.to_string());
                    }
                    if !self.wait(backoff).await {
                        self.release(Duration::ZERO).await;
                        return Claim::Ended;
                    }
                }
            }
        }
    }

    async fn abandon_idempotency(&mut self) {
        if let Some(store) = &self.shared.idempotency
            && let Err(e) = store.abandon(self.id).await
        {
            warn!(error = %e, "idempotency store: abandon failed");
        }
    }

    /// The context of this event's next call.
    fn context(&self, lateness: Option<Duration>) -> Context {
        let meta = &self.event.meta;
        Context {
            topic: self.shared.topic.clone(),
            event_id: self.id.clone(),
            attempt: meta.attempts.saturating_add(1),
            retries: meta.retries,
            due_at: meta.due_at,
            lateness,
            replay_count: meta.replay_count,
        }
    }

    async fn call_handler(&mut self, lateness: Option<Duration>) -> Result<(), HandlerError> {
        let ctx = self.context(lateness);
        self.shared.counters.bump(&self.shared.counters.attempts);
        let started = Instant::now();
        let result = AssertUnwindSafe(self.shared.handler.handle(self.event, &ctx))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(panicked(&*panic)));
        self.shared.telemetry.attempt(started.elapsed());
        result
    }

    /// Waits `d` unless the consumer shuts down first; `false` on shutdown.
    async fn wait(&mut self, d: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => true,
            () = self.shared.shutdown.cancelled() => false,
        }
    }

    /// Acknowledges the event and moves it to `succeeded` (the decision's next state).
    async fn ack(&mut self, succeeded: State) {
        let shared = self.shared;
        // The handler succeeded: record it before acknowledging, so a redelivery after a failed ack (or a
        // crash in between) is skipped as a duplicate instead of repeating the side effects.
        if let Some(store) = &shared.idempotency
            && let Err(e) = store.complete(self.id).await
        {
            warn!(error = %e, "idempotency store: complete failed");
        }
        if !self.settle_ack().await {
            return;
        }
        self.state = succeeded;
        // `succeeded` last: whoever waits on it sees the success complete, its retry count included.
        if self.event.meta.attempts > 0 {
            shared.counters.bump(&shared.counters.succeeded_after_retry);
            shared.telemetry.success_after_retry();
        }
        shared.counters.bump(&shared.counters.succeeded);
        if let (Some(parking), Some(key)) = (&shared.parking, self.ordered_key()) {
            parking.resolved(&key, self.id, false, Timestamp::now());
        }
    }

    async fn settle_ack(&mut self) -> bool {
        match self.receipt.ack().await {
            Ok(()) => true,
            Err(e) => {
                Box::pin(settle_failed(self.shared, self.receipt, "ack", e)).await;
                false
            }
        }
    }

    /// Hands the event to the broker's delay mechanism and moves it to `scheduled` (the decision's
    /// next state, whose `available_at` is the due time recorded in the metadata).
    async fn retry_later(&mut self, delay: Duration, scheduled: State) {
        let shared = self.shared;
        let due = match scheduled {
            State::RetryScheduled { available_at } => available_at,
            _ => Timestamp::now().plus(delay),
        };
        tracing::Span::current().record("next_delay_ms", crate::time::duration_ms(delay));
        self.state = scheduled;
        let meta = &mut self.event.meta;
        meta.retries = meta.retries.saturating_add(1);
        meta.due_at = Some(due);
        meta.last_delay = Some(delay);
        self.abandon_idempotency().await;
        match self.receipt.retry(self.event, delay).await {
            Ok(()) => {
                shared.counters.bump(&shared.counters.retries_scheduled);
                shared.telemetry.retry_scheduled();
                if let (Some(parking), Some(key)) = (&shared.parking, self.ordered_key()) {
                    parking.head_retrying(&key, self.id, due, Timestamp::now());
                }
            }
            Err(e) => settle_failed(shared, &mut *self.receipt, "retry", e).await,
        }
    }

    async fn park(&mut self, head: String, delay: Duration) {
        let shared = self.shared;
        debug!(%head, ?delay, "parked behind the key's retrying event");
        self.event.meta.parked_behind = Some(head);
        self.event.meta.due_at = Some(Timestamp::now().plus(delay));
        match self.receipt.retry(self.event, delay).await {
            Ok(()) => shared.counters.bump(&shared.counters.parked),
            Err(e) => settle_failed(shared, &mut *self.receipt, "park", e).await,
        }
    }

    async fn release(&mut self, after: Duration) {
        self.shared.counters.bump(&self.shared.counters.released);
        if let Err(e) = self.receipt.release(after).await {
            self.shared
                .counters
                .error(&self.shared.counters.settle_errors, e.to_string());
        }
    }

    async fn release_on_shutdown(&mut self) {
        self.step(Input::LeaseLost);
        self.give_back().await;
    }

    /// Gives the delivery back to the broker unsettled, so it is delivered again: on shutdown, and
    /// after the lifecycle refused the action the runtime was about to take (see [`Handling::permit`]).
    async fn give_back(&mut self) {
        self.abandon_idempotency().await;
        self.release(Duration::ZERO).await;
    }
}

/// Dead-letters the event; `true` once the broker accepted the DLQ copy.
async fn dead_letter(
    shared: &Shared,
    receipt: &mut dyn Receipt,
    event: &mut Event,
    reason: DeadReason,
) -> bool {
    event.meta.dead = Some(DeadInfo {
        reason,
        at: Timestamp::now(),
        consumer: shared.spec.consumer.clone(),
    });
    event.meta.due_at = None;
    warn!(%reason, error = ?event.meta.last_error, "dead-lettering");
    let mut hold = None;
    let mut failures: u32 = 0;
    loop {
        let error = match receipt.dead_letter(event).await {
            Ok(()) => {
                if hold.is_some() {
                    tracing::info!("the DLQ accepts again: resuming consumption");
                }
                shared.counters.bump(&shared.counters.dead_lettered);
                shared.telemetry.dead_letter(reason);
                return true;
            }
            Err(e) => e,
        };
        if matches!(error.kind(), Kind::AlreadySettled | Kind::Closed) {
            shared.counters.error(
                &shared.counters.settle_errors,
                format!("dead-letter failed: {error}"),
            );
            return false;
        }
        // An unwritable DLQ is a dependency outage: the original stays unsettled where the broker keeps
        // it (nothing is acknowledged, nothing goes through the retry route), consumption is held, and
        // the write is tried again with the blocking backoff until the DLQ accepts it.
        let message = format!("dead-letter failed: {error}");
        if hold.is_none() {
            tracing::error!(%message, "the DLQ does not accept the entry: holding consumption until it does");
            hold = Some(shared.pause.hold(&message));
        }
        shared.telemetry.settle_error();
        shared.telemetry.hold();
        shared
            .counters
            .error(&shared.counters.settle_errors, message);
        shared.counters.bump(&shared.counters.holds);
        let backoff = outage_backoff(shared, failures);
        failures = failures.saturating_add(1);
        if let Err(e) = receipt.keep_alive(backoff + Duration::from_secs(30)).await {
            shared
                .counters
                .error(&shared.counters.settle_errors, e.to_string());
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            // Shutdown: the delivery is left unsettled; dropping its receipt gives it back to the broker.
            () = shared.shutdown.cancelled() => return false,
        }
    }
}

/// The wait before asking a dependency that is down again (the DLQ, the idempotency store), after
/// `failures` failed asks: the blocking policy's delay, its retries spent or not, since an outage is
/// waited out, never given up on.
fn outage_backoff(shared: &Shared, failures: u32) -> Duration {
    shared
        .policies
        .blocking
        .nominal_delay(failures)
        .unwrap_or(shared.settle_backoff)
        .max(Duration::from_millis(10))
}

/// A settle the broker did not accept: count it, surface it, and release the delivery so the broker
/// delivers it again after the settle backoff. Nothing is acknowledged and nothing is dropped.
async fn settle_failed(
    shared: &Shared,
    receipt: &mut dyn Receipt,
    what: &str,
    error: crate::error::Error,
) {
    let message = format!("{what} failed: {error}");
    tracing::error!(%message, "settle failed; the delivery is released for redelivery");
    shared.telemetry.settle_error();
    shared
        .counters
        .error(&shared.counters.settle_errors, message);
    shared.counters.bump(&shared.counters.released);
    if let Err(e) = receipt.release(shared.settle_backoff).await {
        shared.counters.error(
            &shared.counters.settle_errors,
            format!("release after a failed {what} failed: {e}"),
        );
    }
}
