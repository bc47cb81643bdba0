//! One delivery, from decoding to a settled outcome.
//!
//! The common case costs no future of the runtime's own: [`start`] decodes and claims a delivery, polls
//! its handler's call once and acknowledges a success at once where the receipt can
//! ([`Receipt::try_ack`]), all in the receive loop's poll. The handler's call owns its event and context
//! ([`Handler::call`](super::handler::Handler::call)), so a call that has to wait moves, with the rest of
//! the handling ([`finish`]), into a task of its own. On that path, and on every path that waits before
//! the call (per-key parking, an idempotency claim), the delivery's future is allocated and moved whole,
//! so it is kept small: the delivery is decoded before the future is made, the future holds the decoded
//! event once and every step borrows it (a step that took the handling by value left a copy of it in
//! each enclosing future), and the cold paths (a retry, a dead letter, a hold, an in-place wait, a failed settle,
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
//!
//! Each job of the handling has a file of its own: decoding a delivery ([`decode`]), admission before
//! the call ([`admission`]), the call itself ([`call`]), the settles ([`settle`]), dead-lettering
//! ([`dead_letter`]), waiting out a dependency's outage ([`outage`]), the batch path ([`batch`]) and the
//! clock readings ([`clock`]); this file holds the state machine that takes a delivery through them.

mod admission;
mod batch;
mod call;
mod clock;
mod dead_letter;
mod decode;
mod outage;
mod settle;

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rand::RngCore;
use tracing::{Instrument, debug, warn};

use super::handler::UndecodablePayload;
use super::shared::Shared;
use crate::adapter::{Delivery, Receipt};
use crate::classify::{FailureKind, chain};
use crate::decide::{Attempt, Decision, Outcome, decide_in};
use crate::event::Event;
use crate::lifecycle::{Input, State, TransitionError};
use crate::metadata::DeadReason;
use crate::time::Timestamp;

use super::handler::HandlerCall;
use crate::classify::HandlerError;
use admission::Admission;
use call::panicked;
use dead_letter::dead_letter;
use decode::{Prepared, Ready, prepare};
use settle::settle_failed;

pub(super) use batch::process_batch;
pub(super) use clock::Reading;

/// Handles one delivery to a settled (or released) end, and drops `guard` (its work slot, say) at the
/// end.
///
/// The delivery is decoded now, before the future is made, so the future holds the decoded event once:
/// the handling's steps borrow it instead of moving it from one nested future into the next (each move
/// a copy in the enclosing future's layout — the common path's future grew several times larger when
/// they did, allocated and copied per event).
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
}

impl Handling<'_> {
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
        let Decision { outcome, next } = match self.decide(Ok(()), 0, 0, None) {
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
        chosen_delay: Option<Duration>,
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
            chosen_delay,
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
                let chosen = result.as_ref().err().and_then(HandlerError::chosen_delay);
                if let Some(chosen) = chosen {
                    // What the handler asked for; `next_delay_ms` is what the policy allowed.
                    tracing::Span::current()
                        .record("chosen_delay_ms", crate::time::duration_ms(chosen));
                }
                self.decide(kind.map_or(Ok(()), Err), in_place_retries, holds, chosen)
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

    /// Waits `d` unless the consumer shuts down first; `false` on shutdown.
    async fn wait(&mut self, d: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => true,
            () = self.shared.shutdown.triggered() => false,
        }
    }
}
