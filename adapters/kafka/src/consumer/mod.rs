//! The consumer pipeline of a subscription: the thread that owns a member of the consumer group on a
//! source topic and its group's retry topic, and what it is built from.
//!
//! It is kept apart from the subscription (what the runtime sees) because it runs on a thread of its
//! own, on librdkafka's terms. That thread ([`worker`]) polls the consumer all the time, reads the
//! source's partitions through a queue of its own ([`feed`]) and hands records to the subscription
//! through bounded channels ([`handoff`]), waiting for room there when the runtime is behind
//! (`room`) and pausing the partitions when it must ([`pause`]). What it shares with its rebalance
//! callbacks (`rebalance`) and with the receipts is the consumer's [`context`]: which offsets are read,
//! in flight and settled per partition ([`offsets`], `in_flight`), of which it commits each
//! partition's settled prefix (`commit`) — in a transaction with the retry and DLQ copies when the
//! hops are transactional ([`txn`]). [`start`] names where a newly assigned partition starts.
//!
//! The delay ladder's consumers ([`crate::ladder::mover`]) use [`start`], [`pause`], [`txn`] and
//! [`offsets`] too.

mod commit;
pub(crate) mod context;
mod feed;
pub(crate) mod handoff;
mod in_flight;
pub(crate) mod offsets;
pub(crate) mod pause;
mod rebalance;
mod room;
pub(crate) mod start;
pub(crate) mod txn;
pub(crate) mod worker;
