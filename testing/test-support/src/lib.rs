//! What the adapters' broker tests and benches share, so each adapter writes only what is its own.
//!
//! * [`broker`]: which broker a test binary runs against (`RETRY_TEST_<BROKER>`), whether
//!   `RETRY_TEST_REQUIRE` names it (a missing broker then fails instead of skipping loudly), and the
//!   trials of a `harness = false` test binary;
//! * [`bench`](mod@bench): a bench binary's start, its parts, the SDK's throughput round and the retry lateness
//!   part, which are the same on every broker;
//! * [`batch`]: a batch handler gets more than one event per call from a real broker;
//! * [`allocator`]: glibc's allocator, or mimalloc with the feature `mimalloc`;
//! * [`backlog`]: healthy-event latency and the consumer's memory while retries wait in the broker;
//! * [`child`]: a bench's helper process (the same binary, one part), its output and resident set;
//! * [`scale`]: throughput of 1, 2 and 4 consumer processes in one group;
//! * [`security`]: the secured listeners' material, URL edits, "fails fast" and secrets hidden from
//!   every output;
//! * [`restart`]: delayed retries surviving a restart of the broker (`scripts/brokers restart`).
//!
//! Adapters use it as a dev-dependency. It is internal (not published); what a test outside this
//! repository needs is in `event-retry-testkit`, which this crate builds on.

pub mod allocator;
pub mod backlog;
pub mod batch;
pub mod bench;
pub mod broker;
pub mod busy;
pub mod child;
pub mod forward;
pub mod restart;
pub mod scale;
pub mod security;
pub mod stall;
