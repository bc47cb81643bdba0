//! The event lifecycle as a pure state machine.
//!
//! ```text
//! PENDING --claim--> IN_FLIGHT --ack--> SUCCEEDED
//!                    IN_FLIGHT --retryable, budget left--> RETRY_SCHEDULED(available_at) --due--> IN_FLIGHT
//!                    IN_FLIGHT --non-retryable, or budget spent--> DEAD
//!                    IN_FLIGHT --lease lost (crash, rebalance, visibility expiry)--> PENDING
//!                    IN_FLIGHT --blocking failure--> IN_FLIGHT (held; consumption paused)
//! DEAD --operator replay--> PENDING  (attempts restart; replay count kept)
//! ```
//!
//! Every other transition is refused with an error. Writing the machine down as a type, with no I/O, lets
//! every (state, input) pair be tested, and lets the runtime check that it never does something the
//! lifecycle forbids (acknowledging a dead event, retrying a succeeded one).

use std::fmt;

use crate::time::Timestamp;

/// Where an event is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Waiting to be delivered.
    Pending,
    /// Delivered to a handler; `held` while a blocking failure pauses consumption.
    InFlight {
        /// Whether a blocking failure holds it.
        held: bool,
    },
    /// Waiting in the broker's delay mechanism until `available_at`.
    RetryScheduled {
        /// When it becomes deliverable again.
        available_at: Timestamp,
    },
    /// Handled successfully (terminal).
    Succeeded,
    /// In the dead letter queue; only an operator replay moves it on.
    Dead,
}

/// What happens to an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// A consumer takes it.
    Claim,
    /// The handler succeeded and the broker accepted the acknowledgement.
    Ack,
    /// A retryable failure with budget left: retry at `available_at`.
    Retry {
        /// When to retry.
        available_at: Timestamp,
    },
    /// A scheduled retry is due.
    Due,
    /// Non-retryable failure or budget spent.
    Die,
    /// The consumer lost its lease (crash, rebalance, visibility expiry); not a failed attempt.
    LeaseLost,
    /// A blocking failure: hold the event and pause consumption.
    Block,
    /// The blocking dependency healed; the held event is tried again normally.
    Unblock,
    /// An operator replays it from the DLQ.
    Replay,
}

/// A transition the lifecycle does not allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("lifecycle: {input:?} is not allowed in state {from}")]
pub struct TransitionError {
    /// The state the event was in.
    pub from: State,
    /// The refused input.
    pub input: Input,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            State::Pending => f.write_str("PENDING"),
            State::InFlight { held: false } => f.write_str("IN_FLIGHT"),
            State::InFlight { held: true } => f.write_str("IN_FLIGHT(held)"),
            State::RetryScheduled { available_at } => write!(f, "RETRY_SCHEDULED({available_at})"),
            State::Succeeded => f.write_str("SUCCEEDED"),
            State::Dead => f.write_str("DEAD"),
        }
    }
}

impl State {
    /// The state after `input`, or the refusal.
    pub fn on(self, input: Input) -> Result<State, TransitionError> {
        use Input as I;
        use State as S;
        let next = match (self, input) {
            (S::Pending, I::Claim) => S::InFlight { held: false },
            (S::InFlight { .. }, I::Ack) => S::Succeeded,
            (S::InFlight { .. }, I::Retry { available_at }) => S::RetryScheduled { available_at },
            (S::InFlight { .. }, I::Die) => S::Dead,
            (S::InFlight { .. }, I::LeaseLost) => S::Pending,
            (S::InFlight { .. }, I::Block) => S::InFlight { held: true },
            (S::InFlight { held: true }, I::Unblock) => S::InFlight { held: false },
            (S::RetryScheduled { .. }, I::Due) => S::InFlight { held: false },
            (S::Dead, I::Replay) => S::Pending,
            (from, input) => return Err(TransitionError { from, input }),
        };
        Ok(next)
    }

    /// Whether no input can move the event on without an operator.
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Succeeded | State::Dead)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const T: Timestamp = Timestamp::from_millis(10);

    fn states() -> [State; 6] {
        [
            State::Pending,
            State::InFlight { held: false },
            State::InFlight { held: true },
            State::RetryScheduled { available_at: T },
            State::Succeeded,
            State::Dead,
        ]
    }

    fn inputs() -> [Input; 9] {
        [
            Input::Claim,
            Input::Ack,
            Input::Retry { available_at: T },
            Input::Due,
            Input::Die,
            Input::LeaseLost,
            Input::Block,
            Input::Unblock,
            Input::Replay,
        ]
    }

    /// The complete table: every allowed (state, input) pair and where it leads; everything else refused.
    fn expected(s: State, i: Input) -> Option<State> {
        let in_flight = State::InFlight { held: false };
        let held = State::InFlight { held: true };
        match (s, i) {
            (State::Pending, Input::Claim) => Some(in_flight),
            (State::InFlight { .. }, Input::Ack) => Some(State::Succeeded),
            (State::InFlight { .. }, Input::Retry { .. }) => {
                Some(State::RetryScheduled { available_at: T })
            }
            (State::InFlight { .. }, Input::Die) => Some(State::Dead),
            (State::InFlight { .. }, Input::LeaseLost) => Some(State::Pending),
            (State::InFlight { .. }, Input::Block) => Some(held),
            (State::InFlight { held: true }, Input::Unblock) => Some(in_flight),
            (State::RetryScheduled { .. }, Input::Due) => Some(in_flight),
            (State::Dead, Input::Replay) => Some(State::Pending),
            _ => None,
        }
    }

    #[test]
    fn every_state_times_every_input() {
        let mut allowed = 0;
        for s in states() {
            for i in inputs() {
                match (s.on(i), expected(s, i)) {
                    (Ok(next), Some(want)) => {
                        assert_eq!(next, want, "{s} + {i:?}");
                        allowed += 1;
                    }
                    (Err(e), None) => {
                        assert_eq!(e, TransitionError { from: s, input: i });
                        assert!(e.to_string().contains("not allowed"));
                    }
                    (got, want) => panic!("{s} + {i:?}: got {got:?}, want {want:?}"),
                }
            }
        }
        assert_eq!(
            allowed, 14,
            "the allowed transitions are exactly the table's"
        );
    }

    #[test]
    fn terminal_states_accept_nothing_but_replay() {
        for i in inputs() {
            assert!(State::Succeeded.on(i).is_err());
            assert_eq!(State::Dead.on(i).is_ok(), i == Input::Replay);
        }
        assert!(State::Succeeded.is_terminal() && State::Dead.is_terminal());
        assert!(!State::Pending.is_terminal());
    }

    #[test]
    fn a_full_life_with_retry_hold_and_replay() {
        let s = State::Pending
            .on(Input::Claim)
            .and_then(|s| s.on(Input::Retry { available_at: T }))
            .and_then(|s| s.on(Input::Due))
            .and_then(|s| s.on(Input::Block))
            .and_then(|s| s.on(Input::Unblock))
            .and_then(|s| s.on(Input::Die))
            .and_then(|s| s.on(Input::Replay))
            .and_then(|s| s.on(Input::Claim))
            .and_then(|s| s.on(Input::Ack))
            .unwrap();
        assert_eq!(s, State::Succeeded);
    }

    /// Random lives: 10,000 sequences of up to 40 random inputs from PENDING, each input applied only
    /// when the table allows it (as the runtime does). Every state reached is one of the six, the table
    /// alone moved it (a refused input leaves it where it was), and from every state reached the event
    /// can still end: SUCCEEDED, or DEAD, is reachable from it.
    #[test]
    fn random_lives_stay_in_the_table_and_can_always_end() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let all = inputs();
        let mut reached = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let mut state = State::Pending;
            for _ in 0..rng.random_range(1..=40) {
                let input = all[rng.random_range(0..all.len())];
                match state.on(input) {
                    Ok(next) => {
                        assert_eq!(Some(next), expected(state, input), "{state} + {input:?}");
                        state = next;
                    }
                    Err(e) => assert_eq!(e, TransitionError { from: state, input }),
                }
                reached.insert(state.to_string());
                assert!(
                    can_end(state),
                    "{state} cannot reach SUCCEEDED or DEAD any more"
                );
            }
        }
        assert_eq!(reached.len(), 6, "every state is reachable: {reached:?}");
    }

    /// Whether SUCCEEDED or DEAD is reachable from `from` through allowed inputs.
    fn can_end(from: State) -> bool {
        let mut seen = vec![from];
        let mut queue = vec![from];
        while let Some(s) = queue.pop() {
            if s.is_terminal() {
                return true;
            }
            for i in inputs() {
                if let Ok(next) = s.on(i)
                    && !seen.contains(&next)
                {
                    seen.push(next);
                    queue.push(next);
                }
            }
        }
        false
    }
}
