//! Lets a [`RetryPolicy`] drive `backoff::backoff::Backoff`, for code already written against the
//! `backoff` crate (opt-in feature `backoff`).
//!
//! The `backoff` crate is unmaintained (RUSTSEC-2025-0012, and its `instant` dependency RUSTSEC-2024-0384),
//! so it is never a default dependency; new in-process retry loops are better served by `backon`. The
//! policy keeps its own semantics: the same delays, the same jitter, and `None` once it is spent.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::policy::RetryPolicy;

/// A [`RetryPolicy`] walked as a `backoff::backoff::Backoff`.
#[derive(Debug, Clone)]
pub struct PolicyBackoff {
    policy: RetryPolicy,
    retry: u32,
    previous: Option<Duration>,
    rng: StdRng,
}

impl PolicyBackoff {
    /// Walks `policy` from its first retry, with jitter from a random seed.
    pub fn new(policy: RetryPolicy) -> Self {
        Self::seeded(policy, rand::random())
    }

    /// Walks `policy` with jitter from a fixed seed (reproducible).
    pub fn seeded(policy: RetryPolicy, seed: u64) -> Self {
        Self {
            policy,
            retry: 0,
            previous: None,
            rng: StdRng::seed_from_u64(seed),
        }
    }
}

impl backoff::backoff::Backoff for PolicyBackoff {
    fn next_backoff(&mut self) -> Option<Duration> {
        let delay = self
            .policy
            .delay(self.retry, self.previous, &mut self.rng)?;
        self.retry = self.retry.saturating_add(1);
        self.previous = Some(delay);
        Some(delay)
    }

    fn reset(&mut self) {
        self.retry = 0;
        self.previous = None;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use backoff::backoff::Backoff;

    #[test]
    fn walks_the_policy_then_stops_and_resets() {
        let mut b = PolicyBackoff::seeded(RetryPolicy::parse("1s x2, 5s").unwrap(), 1);
        let secs = |d: Option<Duration>| d.map(|d| d.as_secs());
        assert_eq!(secs(b.next_backoff()), Some(1));
        assert_eq!(secs(b.next_backoff()), Some(1));
        assert_eq!(secs(b.next_backoff()), Some(5));
        assert_eq!(b.next_backoff(), None);
        b.reset();
        assert_eq!(secs(b.next_backoff()), Some(1));
    }
}
