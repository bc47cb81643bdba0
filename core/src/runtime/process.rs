//! One delivery, from decoding to a settled outcome.
//!
//! The common case costs no future of the runtime's own: [`start`] decodes and claims a delivery, polls
//! its handler's call once and acknowledges a success at once where the receipt can
//! ([`Receipt::try_ack`]), all in the receive loop's poll. The handler's call owns its event and context
//! ([`Handler::call`](super::handler::Handler::call)), so a call that has to wait moves, with the rest of
//! the handling ([`finish`]), into a task of its own. On that path, and on every path that waits before
//! the call (per-key parking, an idempotency claim), the delivery's future is allocated and moved whole,
//! so it is kept small: the delivery is decoded
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
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures::FutureExt;
use rand::RngCore;
use tracing::{Instrument, debug, info_span, warn};

use super::batch::{BatchHandler, BatchItem, one_per_event};
use super::handler::{Context, HandlerCall, UndecodablePayload};
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
        receipt,
    } = delivery;
    let prepared = prepare(&shared, message, info, SystemTime::now());
    finish(shared, prepared, receipt, guard, Resume::Admit)
}

/// Where [`finish`] takes a delivery's handling up.
enum Resume {
    /// From the start: admission (parking, the idempotency claim), then the handler's call.
    Admit,
    /// Claimed, its first call made: `attempt` takes the call from there.
    Called {
        lateness: Option<Duration>,
        first: FirstCall,
        state: State,
    },
    /// Decided without waiting; what is left of its settle to carry out.
    Settle(Settle),
}

/// What is left of a settle that [`Handling::ack_at_once`] (or a refused claim) could not finish
/// without waiting.
enum Settle {
    /// Claimed and called with success, the acknowledgement still to make (it has to wait).
    Ack(State),
    /// Acknowledged at once, but the broker refused it: released for redelivery.
    AckFailed(crate::error::Error),
    /// The lifecycle refused the claim or the decision: given back unsettled.
    GiveBack,
}

/// Runs a decoded delivery's handling from `resume` to its end, then drops its receipt and `guard`.
async fn finish<G: Send + 'static>(
    shared: Arc<Shared>,
    mut prepared: Prepared,
    mut receipt: Box<dyn Receipt>,
    guard: G,
    resume: Resume,
) {
    match &mut prepared {
        Prepared::Ready(ready) => {
            let span = std::mem::replace(&mut ready.span, tracing::Span::none());
            let mut handling = Handling::new(&shared, &mut *receipt, ready);
            async move {
                match resume {
                    Resume::Admit => handling.run().await,
                    Resume::Called {
                        lateness,
                        first,
                        state,
                    } => {
                        handling.state = state;
                        handling.attempt(lateness, first).await;
                    }
                    Resume::Settle(rest) => handling.settle(rest).await,
                }
            }
            .instrument(span)
            .await;
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

/// A delivery's processing, boxed so that it can run as a task.
pub(super) type Processing = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Handles a delivery as far as it goes without waiting, here and now (the receive loop calls it, with
/// its task's `cx`): decoded, claimed, its handler's call polled once and — when that call is done with
/// success and the receipt acknowledges without waiting ([`Receipt::try_ack`]) — acknowledged. `None`
/// when the delivery is settled; otherwise the rest of its handling, to run as a task (a call still
/// running goes on in it), holding what `guard` makes (a work slot; made only if there is a rest).
/// Without a future of the runtime's own for an event that is done at once: the handler's call (see
/// [`Handler::call`](super::handler::Handler::call)) is the only one.
///
/// A delivery that needs more before its call — a poison one, one of a consumer with per-key ordering
/// or an idempotency store — takes the whole path ([`process`]) as a task.
///
/// `reading` is the clock as the previous delivery's handling ended, when the loop took this one right
/// after it without waiting: this delivery's time of taking then. The reading that ends this one's call
/// is left there when it is settled here.
pub(super) fn start<G: Send + 'static>(
    shared: &Arc<Shared>,
    delivery: Delivery,
    guard: impl FnOnce() -> G,
    cx: &mut std::task::Context<'_>,
    reading: &mut Reading,
) -> Option<Processing> {
    let Delivery {
        message,
        info,
        mut receipt,
    } = delivery;
    let mut prepared = prepare(shared, message, info, reading.take_or_now());
    let resume = match &mut prepared {
        Prepared::Ready(ready) if shared.idempotency.is_none() && shared.parking.is_none() => {
            let span = ready.span.clone();
            let mut handling = Handling::new(shared, &mut *receipt, ready);
            span.in_scope(|| handling.first_poll(cx, reading))?
        }
        _ => Resume::Admit,
    };
    // Polled once here too, as a whole processing polled first in the loop was: what it does before it
    // first waits — a blocking error's hold above all, which pauses consumption — happens before the
    // next delivery is taken.
    let mut rest: Processing = Box::pin(finish(shared.clone(), prepared, receipt, guard(), resume));
    rest.as_mut().poll(cx).is_pending().then_some(rest)
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

/// How long since `started`, read on the wall clock: the first call's time starts with the clock
/// reading taken when its delivery was (one reading fewer per event than a monotonic clock of its own).
/// A clock set back meanwhile gives zero.
fn elapsed_since(started: SystemTime) -> Duration {
    SystemTime::now()
        .duration_since(started)
        .unwrap_or_default()
}

/// A wall-clock reading the receive loop hands from one delivery's end to the next one's start, so that
/// a stream of deliveries settled in the loop's own poll reads the clock once per event where it read it
/// twice: the reading that ends a handler's call (its time, for the attempt metric) is the next
/// delivery's time of taking, when the loop takes that one without waiting in between. What lies between
/// the two is the loop's own work: the acknowledgement of the one, the taking (on Kafka, the decoding)
/// of the next — so that delivery's call time includes its own taking, as it included its decoding
/// before. On this 2-core VM a reading costs 30–70 ns, about 2 % of the SDK's CPU per event on Kafka.
/// The loop forgets it whenever it waits or may yield ([`Reading::forget`], and by not keeping it), so a
/// reading never stands for a time after a wait. On a current-thread runtime, where the loop spends its
/// cooperative budget after every delivery, it is never carried: two readings per event there.
#[derive(Debug, Default)]
pub(super) struct Reading(Option<SystemTime>);

impl Reading {
    /// The reading left by the previous delivery, or the clock now.
    fn take_or_now(&mut self) -> SystemTime {
        self.0.take().unwrap_or_else(SystemTime::now)
    }

    /// Drops the reading: the loop waited (or may have) since it was taken.
    pub(super) fn forget(&mut self) {
        self.0 = None;
    }
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
    /// When the delivery was taken, to the millisecond: one clock reading serves first-seen, lateness
    /// and the start of the first call's time (`taken`, the same reading). In a stream of deliveries
    /// settled in the receive loop, the reading that ended the previous one's call (see [`Reading`]).
    received: Timestamp,
    /// The same reading, whole.
    taken: SystemTime,
}

/// Decodes a delivery's metadata and completes it from the broker's facts; it was `taken` then.
fn prepare(
    shared: &Shared,
    message: crate::event::RawMessage,
    info: DeliveryInfo,
    taken: SystemTime,
) -> Prepared {
    shared.counters.bump(&shared.counters.received);
    let now = Timestamp::from_system_time(taken);
    // Decoded from the headers into the event where it stays: the message itself is needed again only
    // for a poison event.
    let crate::event::RawMessage {
        payload,
        key,
        headers: raw_headers,
    } = message;
    let mut event = Event {
        payload,
        key,
        headers: crate::headers::Headers::new(),
        meta: metadata::RetryMetadata::default(),
    };
    let decoded = metadata::decode_into(&raw_headers, &mut event.meta, &mut event.headers);
    if let Err(err) = decoded {
        return Prepared::Poison(poison(event, &raw_headers, &info, now, &err));
    }
    drop(raw_headers);
    let meta = &mut event.meta;
    let id = meta
        .event_id
        .get_or_insert_with(|| info.message_id().into())
        .clone();
    // The delivery's facts are moved in, not copied: each is needed once.
    let DeliveryInfo {
        origin,
        broker_attempts,
        broker_retries,
        ..
    } = info;
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
        taken,
    })
}

/// The first call's state when [`Handling::attempt`] takes over.
pub(super) enum FirstCall {
    /// Not made yet: `attempt` makes it.
    None,
    /// Made and done (a batch's call, or a call done at its first poll).
    Done(Result<(), HandlerError>),
    /// Made and still running, since the time given: `attempt` awaits it.
    Running(HandlerCall, SystemTime),
}

/// The consumer's random source, locked only if a decision draws from it (jitter): most decisions —
/// every success — draw nothing, and the lock is shared by every event in flight.
struct LazyRng<'a> {
    shared: &'a Shared,
    locked: Option<std::sync::MutexGuard<'a, rand::rngs::StdRng>>,
}

impl<'a> LazyRng<'a> {
    fn new(shared: &'a Shared) -> Self {
        Self {
            shared,
            locked: None,
        }
    }

    fn rng(&mut self) -> &mut rand::rngs::StdRng {
        let shared = self.shared;
        self.locked
            .get_or_insert_with(|| shared.rng.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl RngCore for LazyRng<'_> {
    fn next_u32(&mut self) -> u32 {
        self.rng().next_u32()
    }

    fn next_u64(&mut self) -> u64 {
        self.rng().next_u64()
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        self.rng().fill_bytes(dst);
    }
}

/// The poison event a delivery whose metadata does not parse (`err`) becomes: what did parse (event
/// id, origin, history) kept for whoever triages its DLQ entry, completed from the broker's facts, its
/// kind non-retryable and the reasons as its last error.
fn poison(
    event: Event,
    raw_headers: &crate::headers::Headers,
    info: &DeliveryInfo,
    now: Timestamp,
    err: &metadata::MetadataError,
) -> Event {
    let (meta, headers, problems) = metadata::decode_lenient(raw_headers);
    let mut poison = Event {
        headers,
        meta,
        ..event
    };
    poison
        .meta
        .event_id
        .get_or_insert_with(|| info.message_id().into());
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
    warn!(event_id = %info.message_id(), error = %err, "poison message: malformed metadata");
    poison
}

/// One event's handling: references to what the delivery's future holds, so that the nested futures of
/// its steps (each borrowing this) stay small.
struct Handling<'a> {
    shared: &'a Shared,
    receipt: &'a mut dyn Receipt,
    event: &'a mut Event,
    /// The event id, shared with every context made for it.
    id: &'a Arc<str>,
    /// When the delivery was taken.
    received: Timestamp,
    /// The same, whole: when the first call's time starts.
    taken: SystemTime,
    state: State,
}

impl<'a> Handling<'a> {
    /// The handling of `ready`, settled through `receipt`, from the start of its lifecycle.
    fn new(shared: &'a Shared, receipt: &'a mut dyn Receipt, ready: &'a mut Ready) -> Self {
        Self {
            shared,
            receipt,
            event: &mut ready.event,
            id: &ready.id,
            received: ready.received,
            taken: ready.taken,
            state: State::Pending,
        }
    }

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

    /// Handles the event.
    async fn run(&mut self) {
        if let Admission::Run(lateness) = self.admit(true).await {
            self.attempt(lateness, FirstCall::None).await;
        }
    }

    /// The first stretch of [`start`]: claims the event, calls the handler and polls the call once with
    /// `cx`; on success, acknowledges if the receipt can without waiting. `None` once settled, else where
    /// the rest of the handling resumes. Only for a consumer without per-key ordering or an idempotency
    /// store (nothing to wait for before the call).
    /// A call settled here leaves the reading that ended it in `reading` (see [`start`]).
    fn first_poll(
        &mut self,
        cx: &mut std::task::Context<'_>,
        reading: &mut Reading,
    ) -> Option<Resume> {
        let lateness = self.lateness();
        if !self.step(Input::Claim) {
            return Some(Resume::Settle(Settle::GiveBack));
        }
        let mut call = self.start_call(lateness);
        let started = self.taken;
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| call.as_mut().poll(cx)));
        let result = match polled {
            Ok(Poll::Pending) => {
                return Some(Resume::Called {
                    lateness,
                    first: FirstCall::Running(call, started),
                    state: self.state,
                });
            }
            Ok(Poll::Ready(result)) => result,
            Err(panic) => Err(panicked(&*panic)),
        };
        drop(call);
        let ended = SystemTime::now();
        self.shared
            .telemetry
            .attempt(ended.duration_since(started).unwrap_or_default());
        if result.is_ok() {
            let rest = self.ack_at_once();
            if rest.is_none() {
                reading.0 = Some(ended);
            }
            return rest.map(Resume::Settle);
        }
        Some(Resume::Called {
            lateness,
            first: FirstCall::Done(result),
            state: self.state,
        })
    }

    /// The success of the first call, acknowledged here if the receipt can without waiting: `None` once
    /// acknowledged, else what is left to carry out ([`Handling::settle`]: the acknowledgement to await,
    /// or its refusal). With an idempotency store the acknowledgement always waits: the success is
    /// recorded in the store first.
    fn ack_at_once(&mut self) -> Option<Settle> {
        let Decision { outcome, next } = match self.decide(Ok(()), 0, 0) {
            Ok(decision) => decision,
            Err(e) => {
                self.refused(e);
                return Some(Settle::GiveBack);
            }
        };
        debug!(?outcome, "decided");
        record_outcome(&outcome);
        if self.shared.idempotency.is_some() {
            return Some(Settle::Ack(next));
        }
        match self.receipt.try_ack() {
            Some(Ok(())) => {
                self.acked(next);
                None
            }
            Some(Err(e)) => Some(Settle::AckFailed(e)),
            None => Some(Settle::Ack(next)),
        }
    }

    /// Carries out what [`Handling::ack_at_once`] left.
    async fn settle(&mut self, rest: Settle) {
        match rest {
            Settle::Ack(succeeded) => self.ack(succeeded).await,
            Settle::AckFailed(e) => {
                Box::pin(settle_failed(self.shared, self.receipt, "ack", e)).await;
            }
            Settle::GiveBack => self.release(Duration::ZERO).await,
        }
    }

    /// The pure decision on a call's `result` (the error's kind), with its transition: at the time of
    /// receipt on success (nothing then depends on the time), the current time otherwise.
    fn decide(
        &self,
        result: Result<(), FailureKind>,
        in_place_retries: u32,
        holds: u32,
    ) -> Result<Decision, TransitionError> {
        let now = if result.is_ok() {
            self.received
        } else {
            Timestamp::now()
        };
        let attempt = Attempt {
            meta: &self.event.meta,
            in_place_retries,
            holds,
            now,
        };
        let shared = self.shared;
        decide_in(
            self.state,
            result,
            &attempt,
            &shared.policies,
            &mut LazyRng::new(shared),
        )
    }

    /// Everything before the handler's first call: lateness, per-key parking, the idempotency claim and
    /// the claim transition (see [`Handling::claim`]).
    async fn admit(&mut self, wait_for_owner: bool) -> Admission {
        let shared = self.shared;
        let now = self.received;
        let lateness = self.lateness();
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

    /// How late this retry started, received when it was (recorded in the lateness metric); `None` for
    /// a first delivery, and for a parked event coming back (lateness is a property of retries).
    fn lateness(&self) -> Option<Duration> {
        let lateness = match self.event.meta.parked_behind {
            None => self.event.meta.due_at.map(|due| self.received.since(due)),
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

    /// Calls the handler (or takes `first`, a call made already) and carries out what the decision
    /// says, calling again for in-place retries and holds, until the event is settled or given back.
    async fn attempt(&mut self, lateness: Option<Duration>, mut first: FirstCall) {
        let shared = self.shared;
        let mut in_place_retries = 0;
        let mut holds = 0;
        let mut pause = None;
        loop {
            let result = match std::mem::replace(&mut first, FirstCall::None) {
                FirstCall::Done(result) => result,
                FirstCall::Running(call, started) => self.finish_call(call, started).await,
                FirstCall::None => {
                    let started = SystemTime::now();
                    let call = self.start_call(lateness);
                    self.finish_call(call, started).await
                }
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
            let decided = if poison {
                let outcome = Outcome::Dead(DeadReason::Poison);
                outcome
                    .transition(self.state, Timestamp::now())
                    .map(|next| Decision { outcome, next })
            } else {
                self.decide(kind.map_or(Ok(()), Err), in_place_retries, holds)
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

    /// Starts a handler call with this event's context, counted.
    fn start_call(&mut self, lateness: Option<Duration>) -> HandlerCall {
        let ctx = self.context(lateness);
        self.shared.counters.bump(&self.shared.counters.attempts);
        self.shared.handler.clone().call(self.event.clone(), ctx)
    }

    /// Awaits a call made at `started` (a panic is its error) and records how long it took.
    async fn finish_call(
        &mut self,
        call: HandlerCall,
        started: SystemTime,
    ) -> Result<(), HandlerError> {
        let result = AssertUnwindSafe(call)
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(panicked(&*panic)));
        self.shared.telemetry.attempt(elapsed_since(started));
        result
    }

    /// Waits `d` unless the consumer shuts down first; `false` on shutdown.
    async fn wait(&mut self, d: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => true,
            () = self.shared.shutdown.triggered() => false,
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
        if self.settle_ack().await {
            self.acked(succeeded);
        }
    }

    /// The acknowledgement was accepted: the event moves to `succeeded` and is counted.
    fn acked(&mut self, succeeded: State) {
        let shared = self.shared;
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
            () = shared.shutdown.triggered() => return false,
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
