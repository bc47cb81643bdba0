//! Counters a running consumer keeps about itself, readable without a metrics exporter.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a consumer's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Deliveries received.
    pub received: u64,
    /// Handler calls.
    pub attempts: u64,
    /// Events acknowledged after success.
    pub succeeded: u64,
    /// Events that succeeded after at least one failure.
    pub succeeded_after_retry: u64,
    /// Retries scheduled through the broker.
    pub retries_scheduled: u64,
    /// In-place retries.
    pub in_place_retries: u64,
    /// Blocking holds.
    pub holds: u64,
    /// Events dead-lettered.
    pub dead_lettered: u64,
    /// Parkings behind an earlier event of the same key (an event parked again counts again).
    pub parked: u64,
    /// Duplicates skipped through the idempotency store.
    pub duplicates_skipped: u64,
    /// Deliveries released unsettled (shutdown, or after a settle error).
    pub released: u64,
    /// Settle operations the broker did not accept.
    pub settle_errors: u64,
    /// Errors receiving from the broker.
    pub receive_errors: u64,
    /// The last error seen, if any.
    pub last_error: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) received: AtomicU64,
    pub(crate) attempts: AtomicU64,
    pub(crate) succeeded: AtomicU64,
    pub(crate) succeeded_after_retry: AtomicU64,
    pub(crate) retries_scheduled: AtomicU64,
    pub(crate) in_place_retries: AtomicU64,
    pub(crate) holds: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) parked: AtomicU64,
    pub(crate) duplicates_skipped: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) settle_errors: AtomicU64,
    pub(crate) receive_errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn error(&self, counter: &AtomicU64, message: String) {
        bump(counter);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(message);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            received: get(&self.received),
            attempts: get(&self.attempts),
            succeeded: get(&self.succeeded),
            succeeded_after_retry: get(&self.succeeded_after_retry),
            retries_scheduled: get(&self.retries_scheduled),
            in_place_retries: get(&self.in_place_retries),
            holds: get(&self.holds),
            dead_lettered: get(&self.dead_lettered),
            parked: get(&self.parked),
            duplicates_skipped: get(&self.duplicates_skipped),
            released: get(&self.released),
            settle_errors: get(&self.settle_errors),
            receive_errors: get(&self.receive_errors),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }
}
