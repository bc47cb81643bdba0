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

/// Runs scenario `number` and fails unless it passed, in full or in part.
async fn passes(number: u8) {
    let Some(scenario) = scenarios::numbered(number) else {
        panic!("the suite has no scenario {number}");
    };
    match scenario.check(fixture()).await {
        Ok(Verdict::Pass(_) | Verdict::Partial(_)) => {}
        Ok(Verdict::Skip(why)) => panic!("scenario {number} was skipped: {why}"),
        Err(e) => panic!("scenario {number} failed: {e}"),
    }
}

macro_rules! scenario_tests {
    ($($name:ident = $number:literal),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                passes($number).await;
            }
        )*
    };
}

scenario_tests!(
    s01_success_acked_once = 1,
    s02_transient_then_success = 2,
    s03_policy_spent_to_dlq = 3,
    s04_non_retryable_to_dlq = 4,
    s05_non_blocking_isolation = 5,
    s06_blocking_pauses_in_order = 6,
    s07_per_key_ordering = 7,
    s08_crash_mid_handle_redelivered = 8,
    s09_dlq_replay = 9,
    s10_poison_input_to_dlq = 10,
    s11_duplicate_delivery_idempotent = 11,
    s12_bytes_preserved_every_hop = 12,
    s13_delay_precision = 13,
    s14_rebalance_during_retries = 14,
    s16_graceful_shutdown = 16,
    s17_groups_each_get_every_event = 17,
    s18_trace_context_every_hop = 18,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_is_skipped_without_a_fault_switch() {
    let Some(scenario) = scenarios::numbered(15) else {
        panic!("the suite has no scenario 15");
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
        "scenario 2 called directly: {verdict:?}"
    );
}
