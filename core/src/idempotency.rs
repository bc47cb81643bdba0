//! Idempotency: skip an event id the handler already handled.
//!
//! Every broker here delivers at least once, and retries add redeliveries of their own; a handler with side
//! effects (an email, a charge) must not repeat them. The runtime asks the store before calling the handler
//! and records success after it. The store distinguishes "done" from "in progress" so two deliveries of one
//! event that race (a redelivery while the first is still running) do not both run the handler.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;

/// The answer to "may I handle this event id?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Begin {
    /// Not seen: it is now marked in progress for the caller.
    Fresh,
    /// Already handled: skip it.
    Done,
    /// Another delivery is handling it right now: wait and ask again.
    InProgress,
}

/// An error from an idempotency store.
#[derive(Debug, thiserror::Error)]
#[error("idempotency store: {0}")]
pub struct StoreError(pub String);

/// Remembers which event ids were handled.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Claims `id` for handling, or tells why not.
    async fn begin(&self, id: &str) -> Result<Begin, StoreError>;
    /// Records that `id` was handled successfully.
    async fn complete(&self, id: &str) -> Result<(), StoreError>;
    /// Gives up a claim without success (the event will be retried or dead-lettered).
    async fn abandon(&self, id: &str) -> Result<(), StoreError>;
}

/// A shared store (one store for several consumers) is a store.
#[async_trait]
impl<S: IdempotencyStore + ?Sized> IdempotencyStore for std::sync::Arc<S> {
    async fn begin(&self, id: &str) -> Result<Begin, StoreError> {
        (**self).begin(id).await
    }
    async fn complete(&self, id: &str) -> Result<(), StoreError> {
        (**self).complete(id).await
    }
    async fn abandon(&self, id: &str) -> Result<(), StoreError> {
        (**self).abandon(id).await
    }
}

#[derive(Clone, Copy, Debug)]
enum Entry {
    InProgress { until: Instant },
    Done { until: Instant },
}

/// An in-process store with a time to live: ids handled more than `ttl` ago are forgotten, and an
/// in-progress claim older than `claim_ttl` (a crashed handler) is given up.
#[derive(Debug)]
pub struct InMemoryIdempotencyStore {
    ttl: Duration,
    claim_ttl: Duration,
    entries: Mutex<Entries>,
}

/// The remembered ids, and the size at which expired ones are next swept out.
#[derive(Debug)]
struct Entries {
    map: HashMap<String, Entry>,
    sweep_at: usize,
}

const FIRST_SWEEP: usize = 1024;

impl InMemoryIdempotencyStore {
    /// A store that remembers handled ids for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            claim_ttl: Duration::from_secs(300),
            entries: Mutex::new(Entries {
                map: HashMap::new(),
                sweep_at: FIRST_SWEEP,
            }),
        }
    }

    /// Sets how long an in-progress claim lasts without completion.
    pub fn with_claim_ttl(mut self, claim_ttl: Duration) -> Self {
        self.claim_ttl = claim_ttl;
        self
    }

    /// How many ids it currently remembers.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether it remembers none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl IdempotencyStore for InMemoryIdempotencyStore {
    async fn begin(&self, id: &str) -> Result<Begin, StoreError> {
        let now = Instant::now();
        let mut guard = self.lock();
        // Amortised expiry: sweep each time the map doubles past the last sweep, so memory stays bounded
        // by the ttl window and a sweep costs O(1) per insert on average.
        if guard.map.len() >= guard.sweep_at {
            guard.map.retain(|_, e| match e {
                Entry::InProgress { until } | Entry::Done { until } => *until > now,
            });
            guard.sweep_at = (guard.map.len() * 2).max(FIRST_SWEEP);
        }
        let entries = &mut guard.map;
        let answer = match entries.get(id) {
            Some(Entry::Done { until }) if *until > now => Begin::Done,
            Some(Entry::InProgress { until }) if *until > now => Begin::InProgress,
            _ => {
                entries.insert(
                    id.to_string(),
                    Entry::InProgress {
                        until: now + self.claim_ttl,
                    },
                );
                Begin::Fresh
            }
        };
        Ok(answer)
    }

    async fn complete(&self, id: &str) -> Result<(), StoreError> {
        let until = Instant::now() + self.ttl;
        self.lock()
            .map
            .insert(id.to_string(), Entry::Done { until });
        Ok(())
    }

    async fn abandon(&self, id: &str) -> Result<(), StoreError> {
        let mut guard = self.lock();
        if matches!(guard.map.get(id), Some(Entry::InProgress { .. })) {
            guard.map.remove(id);
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fresh_in_progress_done() {
        let s = InMemoryIdempotencyStore::new(Duration::from_secs(60));
        assert_eq!(s.begin("a").await.unwrap(), Begin::Fresh);
        assert_eq!(s.begin("a").await.unwrap(), Begin::InProgress);
        s.complete("a").await.unwrap();
        assert_eq!(s.begin("a").await.unwrap(), Begin::Done);
        s.abandon("a").await.unwrap();
        assert_eq!(
            s.begin("a").await.unwrap(),
            Begin::Done,
            "abandon never forgets a done id"
        );
    }

    #[tokio::test]
    async fn abandon_frees_a_claim() {
        let s = InMemoryIdempotencyStore::new(Duration::from_secs(60));
        assert_eq!(s.begin("b").await.unwrap(), Begin::Fresh);
        s.abandon("b").await.unwrap();
        assert_eq!(s.begin("b").await.unwrap(), Begin::Fresh);
    }

    #[tokio::test]
    async fn entries_expire() {
        let s = InMemoryIdempotencyStore::new(Duration::from_millis(20))
            .with_claim_ttl(Duration::from_millis(20));
        s.complete("c").await.unwrap();
        assert_eq!(s.begin("d").await.unwrap(), Begin::Fresh);
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(s.begin("c").await.unwrap(), Begin::Fresh, "done expired");
        assert_eq!(
            s.begin("d").await.unwrap(),
            Begin::Fresh,
            "stale claim expired"
        );
    }
}
