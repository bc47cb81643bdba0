//! The suite called the way a crate outside this repository calls it: through its public API only, one
//! plain `#[tokio::test]` per scenario, against the in-memory transport — no `harness = false` binary, no
//! report, no driver.
//!
//! The fixture here has no fault switch, so scenario 15 (an unwritable DLQ) must come back skipped with
//! the reason; every other scenario must pass (scenarios 1 and 12 partly: there is no broker view or raw
//! client to read).

use std::sync::Arc;
use std::time::Duration;

use event_retry_core::broker::Broker;
use event_retry_testkit::Fixture;
use event_retry_testkit::scenarios::{self, Verdict};

fn fixture() -> Arc<Fixture> {
    Arc::new(Fixture::new(
        "memory-plain",
        Broker::memory(),
        Duration::from_millis(100),
    ))
}

/// Runs the scenario named `name` and fails unless it passed, in full or in part.
async fn passes(name: &str) {
    let Some(scenario) = scenarios::named(name) else {
        panic!("the suite has no scenario {name}");
    };
    match scenario.check(fixture()).await {
        Ok(Verdict::Pass(_) | Verdict::Partial(_)) => {}
        Ok(Verdict::Skip(why)) => panic!("{name} was skipped: {why}"),
        Err(e) => panic!("{name} failed: {e}"),
    }
}

macro_rules! scenario_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                passes(stringify!($name)).await;
            }
        )*
    };
}

scenario_tests!(
    success_acked_once,
    transient_then_success,
    policy_spent_to_dlq,
    non_retryable_to_dlq,
    non_blocking_isolation,
    blocking_pauses_in_order,
    per_key_ordering,
    crash_mid_handle_redelivered,
    dlq_replay,
    poison_input_to_dlq,
    duplicate_delivery_idempotent,
    bytes_preserved_every_hop,
    delay_precision,
    rebalance_during_retries,
    graceful_shutdown,
    groups_each_get_every_event,
    trace_context_every_hop,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_unwritable_holds_is_skipped_without_a_fault_switch() {
    let Some(scenario) = scenarios::named("dlq_unwritable_holds") else {
        panic!("the suite has no scenario dlq_unwritable_holds");
    };
    let verdict = scenario.check(fixture()).await;
    assert_eq!(
        verdict,
        Ok(Verdict::Skip(
            "the fixture cannot make the DLQ unwritable".into()
        ))
    );
}

/// A scenario is also a plain `pub async fn`, for a test that wants one without the skip check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scenario_called_by_its_function() {
    let verdict = scenarios::retry::transient_then_success(fixture()).await;
    assert!(
        matches!(verdict, Ok(Verdict::Pass(_))),
        "transient_then_success called directly: {verdict:?}"
    );
}
