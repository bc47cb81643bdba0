//! Waking relays when rows become due, so an idle relay neither polls an empty table every few
//! milliseconds nor leaves a new event waiting for the next poll.
//!
//! * **PostgreSQL:** `enqueue` and operator replays send `NOTIFY event_retry_outbox` inside the
//!   transaction; PostgreSQL delivers it only on commit, to every relay `LISTEN`ing, in any process.
//! * **SQLite:** there is no server to signal through, so the signal stays in the process: `enqueue` arms a
//!   commit hook on the caller's connection, and the commit (never a rollback) bumps a counter every relay of
//!   that database in this process watches. A relay in another process finds the row by its fallback poll.
//!
//! Either way polling remains, but only as the fallback: a relay also sleeps until the next row's
//! `available_at`, and otherwise checks every `poll_interval` (seconds, not milliseconds).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use tokio::sync::watch;

/// The in-process wake signal of one database.
#[derive(Clone, Debug)]
pub(crate) struct Wake {
    tx: watch::Sender<u64>,
}

impl Wake {
    /// The signal shared by every outbox handle of one database (its `identity`) in this process.
    pub(crate) fn for_database(identity: &str) -> Wake {
        static REGISTRY: OnceLock<Mutex<HashMap<String, Wake>>> = OnceLock::new();
        let mut registry = REGISTRY
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        registry
            .entry(identity.to_string())
            .or_insert_with(|| Wake {
                tx: watch::channel(0).0,
            })
            .clone()
    }

    /// Wakes every relay watching.
    pub(crate) fn bump(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that sees every later bump.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn handles_of_one_database_share_the_signal() {
        let a = Wake::for_database("sqlite:wake-test-a.db");
        let b = Wake::for_database("sqlite:wake-test-a.db");
        let other = Wake::for_database("sqlite:wake-test-b.db");
        let mut seen = a.subscribe();
        let mut unrelated = other.subscribe();
        b.bump();
        assert!(seen.has_changed().unwrap());
        assert!(!unrelated.has_changed().unwrap());
        seen.mark_unchanged();
        unrelated.mark_unchanged();
    }
}
