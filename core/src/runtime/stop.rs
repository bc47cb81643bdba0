//! A consumer's shutdown signal, as its own tasks see it.
//!
//! Separate from the handle, which wraps it for the user, because the state the deliveries share holds
//! it too: neither should need the other to reach it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// A consumer's shutdown signal: a token its tasks wait on, and a flag the receive loop reads for every
/// delivery — without the lock the token takes to tell whether it is cancelled.
#[derive(Clone, Debug, Default)]
pub(crate) struct StopSignal {
    token: CancellationToken,
    asked: Arc<AtomicBool>,
}

impl StopSignal {
    /// Asks for the shutdown.
    pub(crate) fn trigger(&self) {
        self.asked.store(true, Ordering::Release);
        self.token.cancel();
    }

    /// Whether the shutdown was asked for.
    pub(crate) fn is_triggered(&self) -> bool {
        self.asked.load(Ordering::Acquire)
    }

    /// Completes once the shutdown is asked for.
    pub(crate) fn triggered(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }
}
