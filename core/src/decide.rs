//! The one pure function that decides what happens after a handler call.
//!
//! Policy, classification and budget rules live here and only here; adapters never decide, they carry out
//! the [`Outcome`] with their broker's native mechanism. Keeping it pure (no clock, no I/O, the random
//! source passed in) makes it exhaustively testable and cheap enough to run on every event.

use std::time::Duration;

use rand::RngCore;

use crate::classify::FailureKind;
use crate::lifecycle::{Input, State, TransitionError};
use crate::metadata::{DeadReason, RetryMetadata};
use crate::policy::RetryPolicy;
use crate::time::Timestamp;

/// What to do with an event after a handler call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Success: acknowledge it.
    Ack,
    /// Transient failure: call the handler again inside the consumer after this pause.
    RetryInPlace(Duration),
    /// Retry later through the broker's delay mechanism, after this delay.
    RetryAfter(Duration),
    /// Blocking failure: hold the event, pause consumption, and try again after this backoff.
    Hold(Duration),
    /// Dead-letter it for this reason.
    Dead(DeadReason),
}

impl Outcome {
    /// The lifecycle input that allows this outcome's action for an event in flight, decided at `now`
    /// (a retry's `available_at` is `now` plus its delay); `None` for an in-place retry, which leaves
    /// the event in flight. The runtime asks the lifecycle with it before it acts.
    pub fn input(&self, now: Timestamp) -> Option<Input> {
        match self {
            Outcome::Ack => Some(Input::Ack),
            Outcome::RetryInPlace(_) => None,
            Outcome::RetryAfter(delay) => Some(Input::Retry {
                available_at: now.plus(*delay),
            }),
            Outcome::Hold(_) => Some(Input::Block),
            Outcome::Dead(_) => Some(Input::Die),
        }
    }

    /// The state this outcome's action leads to from `from`, decided at `now`, or the lifecycle's
    /// refusal. An in-place retry leaves the event where it is (in flight: the handler just ran).
    pub fn transition(&self, from: State, now: Timestamp) -> Result<State, TransitionError> {
        match self.input(now) {
            Some(input) => from.on(input),
            None => Ok(from),
        }
    }
}

/// A decision: the outcome and the lifecycle state its action leads to. The runtime takes the action
/// only when the lifecycle allowed the transition, and moves the event to `next` once the broker has
/// accepted the action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// What to do.
    pub outcome: Outcome,
    /// Where the event is once it is done (a retry's `available_at` is the decision's time plus its
    /// delay: the due time the runtime records).
    pub next: State,
}

/// Decides the outcome of a handler call for an event in state `from` ([`decide`]) together with the
/// state it leads to; a refusal means the runtime must not act (a bug: see the runtime's
/// `lifecycle_violations`).
pub fn decide_in(
    from: State,
    result: Result<(), FailureKind>,
    attempt: &Attempt<'_>,
    policies: &Policies,
    rng: &mut dyn RngCore,
) -> Result<Decision, TransitionError> {
    let outcome = decide(result, attempt, policies, rng);
    let next = outcome.transition(from, attempt.now)?;
    Ok(Decision { outcome, next })
}

/// The three policies an event's failures draw on.
#[derive(Clone, Debug, PartialEq)]
pub struct Policies {
    /// Deferred retries through the broker; when spent, the event is dead-lettered.
    pub deferred: RetryPolicy,
    /// In-place retries for transient errors; when spent, the event falls through to `deferred`.
    pub in_place: RetryPolicy,
    /// Backoff while a blocking error holds consumption; an unlimited policy never gives up. If it is
    /// limited and spent, the event falls through to `deferred`.
    pub blocking: RetryPolicy,
}

impl Default for Policies {
    /// Deferred `exp(1s, 10m, 2, 10)`, in place `exp(100ms, 1s, 2, 3)`, blocking `exp(500ms, 30s, 2)`.
    fn default() -> Self {
        let parse = |s: &str| RetryPolicy::parse(s).unwrap_or_else(|e| unreachable!("{s}: {e}"));
        Self {
            deferred: parse("exp(1s, 10m, 2, 10)"),
            in_place: parse("exp(100ms, 1s, 2, 3)"),
            blocking: parse("exp(500ms, 30s, 2)"),
        }
    }
}

/// What the decision knows about the call that just ended.
#[derive(Clone, Copy, Debug)]
pub struct Attempt<'a> {
    /// The event's metadata as delivered (attempts before this call, policy position, first seen).
    pub meta: &'a RetryMetadata,
    /// In-place retries already made in this delivery.
    pub in_place_retries: u32,
    /// Blocking holds already made in this delivery.
    pub holds: u32,
    /// The current time.
    pub now: Timestamp,
    /// The delay the handler's error chose for the next retry
    /// ([`HandlerError::chosen_delay`](crate::classify::HandlerError::chosen_delay)), if any.
    pub chosen_delay: Option<Duration>,
}

/// Decides the outcome of a handler call: `result` is `Ok` on success or the error's kind.
pub fn decide(
    result: Result<(), FailureKind>,
    attempt: &Attempt<'_>,
    policies: &Policies,
    rng: &mut dyn RngCore,
) -> Outcome {
    let kind = match result {
        Ok(()) => return Outcome::Ack,
        Err(kind) => kind,
    };
    match kind {
        FailureKind::NonRetryable => Outcome::Dead(DeadReason::NonRetryable),
        FailureKind::Blocking => match policies.blocking.delay(attempt.holds, None, rng) {
            Some(backoff) => Outcome::Hold(
                attempt
                    .chosen_delay
                    .map_or(backoff, |d| policies.blocking.chosen_delay(d)),
            ),
            None => deferred(attempt, policies, rng),
        },
        // A chosen delay is a wait through the broker: waiting it in place would stall the consumer.
        FailureKind::Transient if attempt.chosen_delay.is_some() => {
            deferred(attempt, policies, rng)
        }
        FailureKind::Transient => {
            match policies.in_place.delay(attempt.in_place_retries, None, rng) {
                Some(pause) => Outcome::RetryInPlace(pause),
                None => deferred(attempt, policies, rng),
            }
        }
        FailureKind::Deferred => deferred(attempt, policies, rng),
    }
}

fn deferred(attempt: &Attempt<'_>, policies: &Policies, rng: &mut dyn RngCore) -> Outcome {
    let meta = attempt.meta;
    let Some(scheduled) = policies.deferred.delay(meta.retries, meta.last_delay, rng) else {
        return Outcome::Dead(DeadReason::Exhausted);
    };
    let delay = attempt
        .chosen_delay
        .map_or(scheduled, |d| policies.deferred.chosen_delay(d));
    if let Some(budget) = policies.deferred.max_elapsed() {
        // A replay starts the budget again; the first-seen time stays as history.
        let started = meta.replayed_at.or(meta.first_seen).unwrap_or(attempt.now);
        if attempt.now.plus(delay).since(started) > budget {
            return Outcome::Dead(DeadReason::BudgetElapsed);
        }
    }
    Outcome::RetryAfter(delay)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// No action without a transition: every outcome the decision can give for an event in flight is
    /// one the lifecycle allows there (held or not), and leads where the action means.
    #[test]
    fn every_outcome_is_a_transition_the_lifecycle_allows_in_flight() {
        use crate::lifecycle::State;
        let now = Timestamp::from_millis(1_000);
        let outcomes = [
            Outcome::Ack,
            Outcome::RetryInPlace(Duration::from_millis(5)),
            Outcome::RetryAfter(Duration::from_secs(5)),
            Outcome::Hold(Duration::from_secs(1)),
            Outcome::Dead(DeadReason::Exhausted),
        ];
        for held in [false, true] {
            let from = State::InFlight { held };
            for outcome in &outcomes {
                let Some(input) = outcome.input(now) else {
                    assert_eq!(outcome, &Outcome::RetryInPlace(Duration::from_millis(5)));
                    continue;
                };
                let next = from.on(input);
                let want = match outcome {
                    Outcome::Ack => State::Succeeded,
                    Outcome::RetryAfter(_) => State::RetryScheduled {
                        available_at: Timestamp::from_millis(6_000),
                    },
                    Outcome::Hold(_) => State::InFlight { held: true },
                    _ => State::Dead,
                };
                assert_eq!(next, Ok(want), "{outcome:?} from {from}");
            }
        }
    }
    /// The decision carries the state its action leads to, and a decision for an event the lifecycle
    /// has finished with is refused instead of acted on.
    #[test]
    fn a_decision_names_its_next_state_and_is_refused_for_a_finished_event() {
        let meta = meta(0);
        let attempt = Attempt {
            meta: &meta,
            in_place_retries: 3,
            holds: 0,
            now: Timestamp::from_millis(100_000),
            chosen_delay: None,
        };
        let policies = policies("5000x3,10000x5");
        let mut rng = StdRng::seed_from_u64(7);
        let in_flight = crate::lifecycle::State::InFlight { held: false };
        let cases = [
            (Ok(()), crate::lifecycle::State::Succeeded),
            (
                Err(FailureKind::Transient),
                crate::lifecycle::State::RetryScheduled {
                    available_at: Timestamp::from_millis(105_000),
                },
            ),
            (
                Err(FailureKind::NonRetryable),
                crate::lifecycle::State::Dead,
            ),
            (
                Err(FailureKind::Blocking),
                crate::lifecycle::State::InFlight { held: true },
            ),
        ];
        for (result, want) in cases {
            let decision = decide_in(in_flight, result, &attempt, &policies, &mut rng).unwrap();
            assert_eq!(decision.next, want, "{result:?}");
        }
        for finished in [
            crate::lifecycle::State::Succeeded,
            crate::lifecycle::State::Dead,
            crate::lifecycle::State::Pending,
        ] {
            let refused = decide_in(finished, Ok(()), &attempt, &policies, &mut rng);
            assert_eq!(
                refused,
                Err(TransitionError {
                    from: finished,
                    input: Input::Ack
                })
            );
        }
    }

    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn policies(deferred: &str) -> Policies {
        Policies {
            deferred: RetryPolicy::parse(deferred).unwrap(),
            in_place: RetryPolicy::parse("10ms x2").unwrap(),
            blocking: RetryPolicy::parse("exp(100ms, 1s, 2)").unwrap(),
        }
    }

    fn run(
        result: Result<(), FailureKind>,
        meta: &RetryMetadata,
        in_place: u32,
        holds: u32,
    ) -> Outcome {
        let attempt = Attempt {
            meta,
            in_place_retries: in_place,
            holds,
            now: Timestamp::from_millis(100_000),
            chosen_delay: None,
        };
        decide(
            result,
            &attempt,
            &policies("5000x3,10000x5"),
            &mut StdRng::seed_from_u64(7),
        )
    }

    fn meta(retries: u32) -> RetryMetadata {
        RetryMetadata {
            retries,
            first_seen: Some(Timestamp::from_millis(100_000)),
            ..RetryMetadata::default()
        }
    }

    #[test]
    fn success_acks() {
        assert_eq!(run(Ok(()), &meta(0), 0, 0), Outcome::Ack);
    }

    #[test]
    fn non_retryable_dies_at_once() {
        assert_eq!(
            run(Err(FailureKind::NonRetryable), &meta(0), 0, 0),
            Outcome::Dead(DeadReason::NonRetryable)
        );
    }

    #[test]
    fn deferred_follows_the_policy_then_dies() {
        let delays: Vec<_> = (0..9)
            .map(|r| run(Err(FailureKind::Deferred), &meta(r), 0, 0))
            .collect();
        let secs = |s| Outcome::RetryAfter(Duration::from_secs(s));
        assert_eq!(
            delays,
            [
                secs(5),
                secs(5),
                secs(5),
                secs(10),
                secs(10),
                secs(10),
                secs(10),
                secs(10),
                Outcome::Dead(DeadReason::Exhausted)
            ]
        );
    }

    #[test]
    fn transient_retries_in_place_then_falls_through_to_deferred() {
        let t = Err(FailureKind::Transient);
        assert_eq!(
            run(t, &meta(0), 0, 0),
            Outcome::RetryInPlace(Duration::from_millis(10))
        );
        assert_eq!(
            run(t, &meta(0), 1, 0),
            Outcome::RetryInPlace(Duration::from_millis(10))
        );
        assert_eq!(
            run(t, &meta(0), 2, 0),
            Outcome::RetryAfter(Duration::from_secs(5))
        );
        assert_eq!(run(t, &meta(8), 2, 0), Outcome::Dead(DeadReason::Exhausted));
    }

    #[test]
    fn blocking_holds_with_backoff_and_never_dies() {
        let b = Err(FailureKind::Blocking);
        assert_eq!(
            run(b, &meta(0), 0, 0),
            Outcome::Hold(Duration::from_millis(100))
        );
        assert_eq!(
            run(b, &meta(0), 0, 3),
            Outcome::Hold(Duration::from_millis(800))
        );
        assert_eq!(
            run(b, &meta(99), 0, 1_000),
            Outcome::Hold(Duration::from_secs(1))
        );
    }

    #[test]
    fn limited_blocking_falls_through_to_deferred() {
        let mut p = policies("5000x1");
        p.blocking = RetryPolicy::parse("10ms x1").unwrap();
        let m = meta(0);
        let attempt = Attempt {
            meta: &m,
            in_place_retries: 0,
            holds: 1,
            now: Timestamp::from_millis(100_000),
            chosen_delay: None,
        };
        let out = decide(
            Err(FailureKind::Blocking),
            &attempt,
            &p,
            &mut StdRng::seed_from_u64(1),
        );
        assert_eq!(out, Outcome::RetryAfter(Duration::from_secs(5)));
    }

    #[test]
    fn a_chosen_delay_replaces_the_scheduled_one_within_the_policy() {
        let mut p = policies("1s x2; max-delay=1m");
        p.blocking = RetryPolicy::parse("exp(500ms, 30s, 2)").unwrap();
        let at = |retries, chosen: u64| {
            let m = meta(retries);
            let attempt = Attempt {
                meta: &m,
                in_place_retries: 0,
                holds: 0,
                now: Timestamp::from_millis(100_000),
                chosen_delay: Some(Duration::from_secs(chosen)),
            };
            let mut rng = StdRng::seed_from_u64(1);
            [
                FailureKind::Deferred,
                FailureKind::Transient,
                FailureKind::Blocking,
                FailureKind::NonRetryable,
            ]
            .map(|kind| decide(Err(kind), &attempt, &p, &mut rng))
        };
        let secs = Duration::from_secs;
        // Deferred and transient go through the broker after it; blocking holds for it (bounded by
        // the blocking policy's longest delay); non-retryable ignores it.
        assert_eq!(
            at(0, 30),
            [
                Outcome::RetryAfter(secs(30)),
                Outcome::RetryAfter(secs(30)),
                Outcome::Hold(secs(30)),
                Outcome::Dead(DeadReason::NonRetryable),
            ]
        );
        // Bounded by max-delay.
        assert_eq!(at(1, 3_600)[0], Outcome::RetryAfter(secs(60)));
        assert_eq!(at(1, 3_600)[2], Outcome::Hold(secs(30)));
        // It still counts: once the policy is spent, the event is dead-lettered.
        assert_eq!(at(2, 30)[0], Outcome::Dead(DeadReason::Exhausted));
        assert_eq!(at(2, 30)[1], Outcome::Dead(DeadReason::Exhausted));
    }

    #[test]
    fn the_time_budget_ends_retries_early() {
        let p = policies("5000x3; max-elapsed=12s");
        let m = RetryMetadata {
            retries: 1,
            first_seen: Some(Timestamp::from_millis(100_000)),
            ..RetryMetadata::default()
        };
        let at = |now| Attempt {
            meta: &m,
            in_place_retries: 0,
            holds: 0,
            now: Timestamp::from_millis(now),
            chosen_delay: None,
        };
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            decide(Err(FailureKind::Deferred), &at(105_000), &p, &mut rng),
            Outcome::RetryAfter(Duration::from_secs(5))
        );
        assert_eq!(
            decide(Err(FailureKind::Deferred), &at(108_000), &p, &mut rng),
            Outcome::Dead(DeadReason::BudgetElapsed)
        );
    }

    #[test]
    fn a_replay_starts_the_time_budget_again() {
        let p = policies("5000x3; max-elapsed=12s");
        let mut m = RetryMetadata {
            retries: 3,
            first_seen: Some(Timestamp::from_millis(100_000)),
            ..RetryMetadata::default()
        };
        m.reset_for_replay(Timestamp::from_millis(900_000));
        let attempt = Attempt {
            meta: &m,
            in_place_retries: 0,
            holds: 0,
            now: Timestamp::from_millis(901_000),
            chosen_delay: None,
        };
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            decide(Err(FailureKind::Deferred), &attempt, &p, &mut rng),
            Outcome::RetryAfter(Duration::from_secs(5)),
            "800 s after first seen, but 1 s after the replay"
        );
    }

    #[test]
    fn default_policies_parse() {
        let p = Policies::default();
        assert_eq!(p.deferred.max_retries(), Some(10));
        assert_eq!(p.blocking.max_retries(), None);
    }
}
