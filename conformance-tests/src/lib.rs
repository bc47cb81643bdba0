//! The event-retry conformance suite: retry and DLQ semantics written once, run against every adapter.
//!
//! The scenarios ([`scenarios`]) are generic over a [`fixture::Fixture`]; the test binary
//! (`tests/conformance.rs`) runs all of them against the in-memory transport and every broker named by
//! the `RETRY_TEST_*` env vars, and writes a Markdown report (see [`report`]). A third-party adapter can
//! run the same checks by implementing the fixture and calling [`harness`]-style code of its own.

#[cfg(feature = "testcontainers")]
pub mod containers;
pub mod fixture;
pub mod harness;
pub mod kafka;
pub mod probe;
pub mod pulsar;
pub mod rabbitmq;
pub mod report;
pub mod scenarios;
pub mod sqs;
