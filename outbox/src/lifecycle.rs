//! The life of an outbox row as a pure state machine.
//!
//! ```text
//! (enqueue) ──> PENDING ──claim──> CLAIMED ──broker confirmed──> PUBLISHED ──purge──> (gone)
//!                  ^                 │ │ │
//!                  │   failed, budget left (attempts + 1, available_at later)
//!                  ├─────────────────┘ │ │
//!                  │   lease expired or released (not an attempt)
//!                  ├───────────────────┘ │
//!                  │                     └──permanent failure, or policy spent──> DEAD ──purge──> (gone)
//!                  └──────────────────────────operator replay (attempts 0, replay count + 1)───┘
//! ```
//!
//! The store never writes a state by itself: every `UPDATE` takes its allowed source states from
//! [`sources`], and the operator commands ask [`next`] before they touch a row, so a transition this
//! table forbids (replaying a published row, purging a pending one) is an error, not a quiet write.
//! Being a pure type, every (state, input) pair is tested below.

use std::fmt;
use std::str::FromStr;

/// Where an outbox row is in its life. Stored as its upper-case name (`PENDING`, …), the seed's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// Waiting to be published once `available_at` has passed.
    Pending,
    /// Taken by a relay until its lease (`lease_until`) expires.
    Claimed,
    /// The broker confirmed it (terminal, until retention removes it).
    Published,
    /// Not retried automatically: a permanent failure or a spent policy. Only an operator replay moves it.
    Dead,
}

impl State {
    /// Every state, in lifecycle order.
    pub const ALL: [State; 4] = [
        State::Pending,
        State::Claimed,
        State::Published,
        State::Dead,
    ];

    /// The name stored in the database and shown to operators.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "PENDING",
            State::Claimed => "CLAIMED",
            State::Published => "PUBLISHED",
            State::Dead => "DEAD",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = String;

    /// Parses a state name, in any case (`dead`, `DEAD`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        State::ALL
            .into_iter()
            .find(|state| state.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!("unknown state {s:?} (expected pending, claimed, published or dead)")
            })
    }
}

/// What happens to a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Input {
    /// A relay takes a due row under a lease.
    Claim,
    /// The broker confirmed the publish.
    Confirm,
    /// The publish failed and the policy has a retry left: back to pending, later.
    Retry,
    /// The publish failed permanently, or the policy is spent.
    Die,
    /// The lease ran out (the relay crashed or stalled): claimable again, not a failed attempt.
    LeaseExpired,
    /// The relay gives the row back unpublished (shutdown, lease too short to start): not an attempt.
    Release,
    /// An operator replays a dead row: pending again with attempts restarted.
    Replay,
    /// An operator or the retention sweep removes the row.
    Purge,
}

impl Input {
    /// Every input.
    pub const ALL: [Input; 8] = [
        Input::Claim,
        Input::Confirm,
        Input::Retry,
        Input::Die,
        Input::LeaseExpired,
        Input::Release,
        Input::Replay,
        Input::Purge,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Input::Claim => "claim",
            Input::Confirm => "confirm",
            Input::Retry => "retry",
            Input::Die => "die",
            Input::LeaseExpired => "lease expiry",
            Input::Release => "release",
            Input::Replay => "replay",
            Input::Purge => "purge",
        }
    }
}

/// Where a transition leads: a state, or out of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// The row moves to this state.
    State(State),
    /// The row is deleted.
    Removed,
}

/// A transition the lifecycle does not allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a {from} row cannot take a {}: {}", input.as_str(), allowed_text(*input))]
pub struct Forbidden {
    /// The row's state.
    pub from: State,
    /// What was asked.
    pub input: Input,
}

fn allowed_text(input: Input) -> String {
    let names: Vec<&str> = sources(input).iter().map(|s| s.as_str()).collect();
    format!("only {} rows can", names.join(" or "))
}

/// The transition from `state` on `input`, or why it is refused.
pub fn next(state: State, input: Input) -> Result<Next, Forbidden> {
    use State::*;
    let to = match (state, input) {
        (Pending, Input::Claim) => Next::State(Claimed),
        (Claimed, Input::Confirm) => Next::State(Published),
        (Claimed, Input::Retry) => Next::State(Pending),
        (Claimed, Input::Die) => Next::State(Dead),
        (Claimed, Input::LeaseExpired | Input::Release) => Next::State(Pending),
        (Dead, Input::Replay) => Next::State(Pending),
        (Dead | Published, Input::Purge) => Next::Removed,
        _ => return Err(Forbidden { from: state, input }),
    };
    Ok(to)
}

/// The states `input` may be applied to: the `WHERE state IN (…)` of the store's statements.
pub fn sources(input: Input) -> &'static [State] {
    match input {
        Input::Claim => &[State::Pending],
        Input::Confirm | Input::Retry | Input::Die | Input::LeaseExpired | Input::Release => {
            &[State::Claimed]
        }
        Input::Replay => &[State::Dead],
        Input::Purge => &[State::Dead, State::Published],
    }
}

/// Whether a failed attempt counts: retries and deaths do; a lease that expired or a release does not.
pub fn counts_as_attempt(input: Input) -> bool {
    matches!(input, Input::Retry | Input::Die)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The whole table, written out: every (state, input) pair not listed is forbidden.
    const ALLOWED: [(State, Input, Next); 9] = [
        (State::Pending, Input::Claim, Next::State(State::Claimed)),
        (
            State::Claimed,
            Input::Confirm,
            Next::State(State::Published),
        ),
        (State::Claimed, Input::Retry, Next::State(State::Pending)),
        (State::Claimed, Input::Die, Next::State(State::Dead)),
        (
            State::Claimed,
            Input::LeaseExpired,
            Next::State(State::Pending),
        ),
        (State::Claimed, Input::Release, Next::State(State::Pending)),
        (State::Dead, Input::Replay, Next::State(State::Pending)),
        (State::Dead, Input::Purge, Next::Removed),
        (State::Published, Input::Purge, Next::Removed),
    ];

    #[test]
    fn every_state_and_input() {
        for state in State::ALL {
            for input in Input::ALL {
                let want = ALLOWED
                    .iter()
                    .find(|(s, i, _)| *s == state && *i == input)
                    .map(|(_, _, n)| *n);
                match (next(state, input), want) {
                    (Ok(got), Some(want)) => assert_eq!(got, want, "{state} on {input:?}"),
                    (Err(e), None) => {
                        assert_eq!(e, Forbidden { from: state, input });
                        assert!(!sources(input).contains(&state), "{state} {input:?}");
                    }
                    (got, want) => panic!("{state} on {input:?}: got {got:?}, want {want:?}"),
                }
            }
        }
    }

    #[test]
    fn sources_agree_with_the_table() {
        for input in Input::ALL {
            for state in State::ALL {
                assert_eq!(
                    sources(input).contains(&state),
                    next(state, input).is_ok(),
                    "{state} {input:?}"
                );
            }
        }
    }

    #[test]
    fn refusals_say_what_is_allowed() {
        let e = next(State::Published, Input::Replay).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a PUBLISHED row cannot take a replay: only DEAD rows can"
        );
        let e = next(State::Pending, Input::Purge).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a PENDING row cannot take a purge: only DEAD or PUBLISHED rows can"
        );
    }

    #[test]
    fn only_failures_count_as_attempts() {
        let counted: Vec<Input> = Input::ALL
            .into_iter()
            .filter(|i| counts_as_attempt(*i))
            .collect();
        assert_eq!(counted, [Input::Retry, Input::Die]);
    }

    #[test]
    fn names_round_trip() {
        for state in State::ALL {
            assert_eq!(state.as_str().parse::<State>().unwrap(), state);
            assert_eq!(
                state.as_str().to_lowercase().parse::<State>().unwrap(),
                state
            );
        }
        assert!("gone".parse::<State>().unwrap_err().contains("gone"));
    }
}
