//! The relay: claims due rows under a lease, publishes them through a [`Producer`], and records what the
//! broker said.
//!
//! The bugs every hand-written relay meets, and what this one does about each:
//! * **Two workers take the same row.** A claim is one statement that moves rows to `CLAIMED` under a
//!   claim name (`SKIP LOCKED` on PostgreSQL, SQLite's single writer); every later write names the claim,
//!   so a relay that lost its row cannot overwrite the new owner's outcome.
//! * **A crashed worker holds a row forever.** A claim is a lease (`lease_until`); an expired lease makes
//!   the row claimable again, and that is not a failed attempt. A relay does not start a publish its lease
//!   cannot cover (lease ≥ 2 × publish timeout), so two live relays never publish one row at once.
//! * **Events of one key get reordered.** With [`RelayBuilder::ordered_by_key`], only the head of a key is
//!   claimable while an earlier row of that key is pending or claimed: a failing head holds its own key
//!   and nothing else.
//! * **An empty table is polled every few milliseconds.** The relay sleeps until a notification, the next
//!   row's `available_at`, or the fallback poll interval.
//! * **Retries hammer a broker that is down.** A broker-down failure backs the whole relay off
//!   (exponentially, one probe row at a time) until a publish succeeds.
//! * **SIGTERM kills the process mid-batch.** [`RelayHandle::shutdown`] stops claiming, lets the batch in
//!   hand finish (each publish bounded by the publish timeout) and records it; a hard kill leaves rows
//!   `CLAIMED`, which the lease returns.
//!
//! Delivery is at least once: a relay that dies after the broker confirmed but before the row was marked
//! leaves it to be published again. Every publish of a row carries the same event id, which is what
//! consumers deduplicate on (the SDK's idempotency store does).
//!
//! The builder and its settings, the run loop with its handle, and the stats the handle reports are
//! files of their own.

mod builder;
mod run;
mod stats;

pub use builder::{DEFAULT_POLICY, RelayBuilder, Retention};
pub use run::RelayHandle;
pub use stats::RelayStats;
