//! The scenarios, written once, run against every adapter.
//!
//! Each scenario uses topics of its own, so scenarios run concurrently; delays are multiples of the
//! fixture's [`Fixture::delay_unit`], so a broker with one-second granularity gets one-second delays and the
//! in-memory transport gets tenths. A scenario that needs a capability the adapter lacks is skipped with
//! the reason, never silently passed. Each scenario's title says exactly what it asserts; the report and
//! the README show it.

pub mod crash;
pub mod dead_letters;
pub mod delivery;
pub mod fidelity;
pub mod groups;
pub mod holds;
pub mod retry;
mod support;
pub mod trace;

use std::sync::Arc;

use event_retry_core::adapter::Capabilities;

use crate::fixture::{Abilities, Fixture};
use crate::suite::BoxFuture;

/// How a scenario ended, when it did not fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It passed; the note carries figures for the report (lateness).
    Pass(Option<String>),
    /// It passed the part it could check; this part of its title was not checked, and why (the
    /// report and the README show `pass (partial: …)`).
    Partial(String),
    /// It was skipped, for this reason.
    Skip(String),
}

/// A scenario's result: `Err` is a failure with its explanation.
pub type ScenarioResult = Result<Verdict, String>;

type Run = fn(Arc<Fixture>) -> BoxFuture<ScenarioResult>;
/// Why a scenario must be skipped for a broker with these capabilities and a fixture with these abilities.
type Needs = fn(&Capabilities, &Abilities) -> Option<&'static str>;

/// One scenario of the suite.
#[derive(Clone, Copy)]
pub struct Scenario {
    /// Its number in the suite (the report and the README list them in this order).
    pub number: u8,
    /// Its name in test names and the report.
    pub name: &'static str,
    /// What it asserts, in words (the README's table).
    pub title: &'static str,
    /// Why it must be skipped for an adapter, if it must.
    pub needs: Needs,
    /// Runs it.
    pub run: Run,
    /// Runs with no other scenario of its binary under way: it kills a consumer process, and a crash
    /// may hand copies of any topic on the broker out again (delivery is at least once, and a RabbitMQ
    /// ladder's levels are shared by every topic), which would break the other scenarios' exact counts.
    pub alone: bool,
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scenario")
            .field("number", &self.number)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Scenario {
    /// Its test name: `07_per_key_ordering`.
    pub fn test_name(&self) -> String {
        format!("{:02}_{}", self.number, self.name)
    }

    /// Runs it against `fixture`, or skips it (with the reason) where the broker or the fixture lacks
    /// what it needs — what [`crate::run`] does for each trial, callable from a plain `#[tokio::test]`.
    pub async fn check(&self, fixture: Arc<Fixture>) -> ScenarioResult {
        if let Some(reason) = (self.needs)(&fixture.capabilities(), &fixture.abilities()) {
            return Ok(Verdict::Skip(reason.to_string()));
        }
        (self.run)(fixture).await
    }
}

/// The scenario named `name` (`delay_precision`).
pub fn named(name: &str) -> Option<Scenario> {
    all().into_iter().find(|s| s.name == name)
}

fn always(_: &Capabilities, _: &Abilities) -> Option<&'static str> {
    None
}

macro_rules! scenario {
    ($number:literal, $area:ident :: $name:ident, $needs:expr, $title:literal) => {
        Scenario {
            number: $number,
            name: stringify!($name),
            title: $title,
            needs: $needs,
            run: |f| Box::pin($area::$name(f)),
            alone: false,
        }
    };
    (alone $number:literal, $area:ident :: $name:ident, $needs:expr, $title:literal) => {
        Scenario {
            alone: true,
            ..scenario!($number, $area::$name, $needs, $title)
        }
    };
}

/// All scenarios, in order.
pub fn all() -> Vec<Scenario> {
    vec![
        scenario!(
            1,
            delivery::success_acked_once,
            always,
            "success acked once; nothing in retry or DLQ"
        ),
        scenario!(
            2,
            retry::transient_then_success,
            always,
            "transient failures then success; each retry has the policy's delay, never early"
        ),
        scenario!(
            3,
            retry::policy_spent_to_dlq,
            always,
            "policy spent → DLQ with complete metadata; handler ran 1 + retries times"
        ),
        scenario!(
            4,
            retry::non_retryable_to_dlq,
            always,
            "non-retryable → DLQ after one call"
        ),
        scenario!(
            5,
            delivery::non_blocking_isolation,
            always,
            "events behind a retrying one finish before its retry fires"
        ),
        scenario!(
            6,
            holds::blocking_pauses_in_order,
            |c, _| (!c.blocking_pause).then_some("the transport cannot pause consumption"),
            "blocking kind pauses consumption and keeps order until healed"
        ),
        scenario!(
            7,
            holds::per_key_ordering,
            |c, a| {
                if a.batch_handler {
                    Some("per-key ordering needs a per-event handler: a batch handler refuses it")
                } else {
                    (!c.per_key_order).then_some("the transport cannot keep per-key order")
                }
            },
            "per-key order: a key's later events wait for its retry, in order; others go on"
        ),
        scenario!(
            alone 8,
            crash::crash_mid_handle_redelivered,
            |c, _| (!c.crash_redelivery)
                .then_some("the transport does not redeliver after a crash"),
            "consumer killed mid-handle: all events finish, retries stay retries, none early"
        ),
        scenario!(
            9,
            dead_letters::dlq_replay,
            |c, _| (!c.replay).then_some("the transport cannot replay its DLQ"),
            "DLQ replay → run unedited, attempts restarted, replay counted, DLQ emptied"
        ),
        scenario!(
            10,
            fidelity::poison_input_to_dlq,
            always,
            "poison input (bad metadata, bad payload) → DLQ with the reason; consumer alive"
        ),
        scenario!(
            11,
            delivery::duplicate_delivery_idempotent,
            always,
            "duplicate delivery with the idempotency store → one side effect"
        ),
        scenario!(
            12,
            fidelity::bytes_preserved_every_hop,
            always,
            "payload, key, headers, native fields byte for byte through every hop and replay"
        ),
        scenario!(
            13,
            retry::delay_precision,
            always,
            "delay precision: 80 random delays, never early, lateness p99 <= step + 2 s"
        ),
        scenario!(
            14,
            groups::rebalance_during_retries,
            |c, _| (!c.shared_subscription).then_some("the transport has no shared subscription"),
            "two consumers, rebalance during retries: exact counts"
        ),
        scenario!(
            15,
            dead_letters::dlq_unwritable_holds,
            |_, a| {
                if !a.faults {
                    Some("the fixture cannot make the DLQ unwritable")
                } else if !a.inspect {
                    Some("the fixture cannot read the broker's own view")
                } else {
                    None
                }
            },
            "DLQ unwritable: error surfaced, consumption held, original kept; one entry later"
        ),
        scenario!(
            16,
            delivery::graceful_shutdown,
            always,
            "graceful shutdown: in-flight work finishes or is released"
        ),
        scenario!(
            17,
            groups::groups_each_get_every_event,
            |c, _| (!c.fan_out).then_some(
                "the transport's consumer groups compete for one queue: no group gets every event"
            ),
            "two groups on one topic: each gets every event and retries and replays its own"
        ),
        scenario!(
            18,
            trace::trace_context_every_hop,
            |c, _| (!c.replay).then_some("the transport cannot replay its DLQ"),
            "one trace: publish → attempt → retry → attempt → DLQ → replay → attempt"
        ),
        scenario!(
            19,
            retry::handler_chosen_delay,
            always,
            "a delay the handler's error chooses: honoured, never early, bounded, counted"
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_fit_a_line_and_the_numbers_run_in_order() {
        let scenarios = all();
        for s in &scenarios {
            assert!(
                s.title.chars().count() <= 80,
                "scenario {}'s title is {} characters; the detail belongs in its doc comment",
                s.number,
                s.title.chars().count()
            );
        }
        let numbers: Vec<u8> = scenarios.iter().map(|s| s.number).collect();
        assert_eq!(numbers, (1..=19).collect::<Vec<u8>>());
    }
}
