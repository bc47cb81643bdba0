//! The event-retry conformance suite: retry and DLQ semantics written once, run against every adapter.
//!
//! The suite is a library that each adapter's own tests call, so an adapter outside this repository runs
//! exactly the same checks: build a [`Fixture`] over a real broker (a [`Broker`](retry_core::broker::Broker),
//! a delay unit, and the faults the broker's test can inject) and hand it to [`run`] from a
//! `harness = false` test binary. Each run writes the adapter's part of the report; the parts make one
//! Markdown table (`target/conformance/report.md`) of every scenario × every adapter. The suite depends on
//! no adapter.
//!
//! The in-memory transport runs it the same way (`retry-core/tests/conformance.rs`).
//!
//! A scenario can also be called on its own from a plain `#[tokio::test]`: [`scenarios::numbered`]
//! gives it by number and [`scenarios::Scenario::check`] runs it (or skips it, with the reason, where
//! the broker or fixture lacks what it needs); each is a `pub async fn` too
//! (`scenarios::retry::transient_then_success(fixture)`). `tests/plain_tokio_tests.rs` runs all of
//! them that way against the in-memory transport, through the public API only. The driver ([`run`])
//! adds what a plain test cannot: the report, the crash scenario's re-executed child process, and the
//! loud skip of a broker that is not there.

#[cfg(feature = "testcontainers")]
pub mod containers;
pub mod fixture;
pub mod probe;
pub mod report;
pub mod scenarios;
pub mod suite;

pub use fixture::{Abilities, Faults, Fixture, HeldParts, Inspect, NativeMessage, RawClient, hex};
pub use suite::{Adapter, BoxFuture, Connect, run, run_current_thread, run_only};
