//! Configuring a relay: its settings, their defaults, and the check that runs before it may start.
//!
//! Separate from the run loop because the settings are the relay's public surface and their defaults
//! and limits are a contract of their own; the loop only reads them.

use std::time::Duration;

use event_retry_core::policy::RetryPolicy;
use event_retry_core::producer::Producer;

use crate::error::OutboxError;
use crate::store::Store;
use crate::wake::Wake;

/// What happens to published rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Delete a row as soon as the broker confirmed it.
    Delete,
    /// Keep published rows this long, then delete them (checked every minute).
    Keep(Duration),
}

/// Configures and starts a relay; from [`Outbox::relay`](crate::Outbox::relay).
#[derive(Clone, Debug)]
pub struct RelayBuilder {
    pub(super) store: Store,
    pub(super) wake: Wake,
    pub(super) producer: Producer,
    pub(super) config: RelayConfig,
}

/// A relay's settings, as the builder collected them.
#[derive(Clone, Debug)]
pub(super) struct RelayConfig {
    pub(super) name: String,
    pub(super) policy: RetryPolicy,
    pub(super) batch_size: usize,
    pub(super) in_flight: usize,
    pub(super) lease: Duration,
    pub(super) publish_timeout: Duration,
    pub(super) poll_interval: Duration,
    pub(super) ordered: bool,
    pub(super) notifications: bool,
    pub(super) retention: Retention,
    pub(super) backoff_initial: Duration,
    pub(super) backoff_max: Duration,
}

/// The default retry policy of failed publishes: exponential from 1 s to 5 min, 20 retries (about 1 h 20 m
/// of trying), then `DEAD`.
pub const DEFAULT_POLICY: &str = "exp(1s, 5m, 2, 20)";

impl RelayBuilder {
    pub(crate) fn new(store: Store, wake: Wake, producer: Producer) -> Self {
        #[allow(clippy::unwrap_used)] // a constant the unit tests parse
        let policy = RetryPolicy::parse(DEFAULT_POLICY).unwrap();
        Self {
            store,
            wake,
            producer,
            config: RelayConfig {
                name: format!("relay-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
                policy,
                batch_size: 100,
                in_flight: 100,
                lease: Duration::from_secs(30),
                publish_timeout: Duration::from_secs(10),
                poll_interval: Duration::from_secs(5),
                ordered: false,
                notifications: true,
                retention: Retention::Keep(Duration::from_secs(7 * 86_400)),
                backoff_initial: Duration::from_millis(250),
                backoff_max: Duration::from_secs(30),
            },
        }
    }

    /// The retry policy of failed publishes, in the SDK's DSL (default [`DEFAULT_POLICY`]).
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.config.policy = policy;
        self
    }

    /// Rows claimed at once (default 100).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.config.batch_size = n.max(1);
        self
    }

    /// Publishes awaiting the broker's confirmation at once (default 100).
    pub fn in_flight(mut self, n: usize) -> Self {
        self.config.in_flight = n.max(1);
        self
    }

    /// How long a claim holds its rows (default 30 s); at least twice the publish timeout.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How long one publish may wait for the broker (default 10 s); a timeout is a broker-down failure.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.config.publish_timeout = timeout;
        self
    }

    /// The fallback poll when no notification comes (default 5 s).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// Publishes each key's rows in id order: a key's next row waits until the one before it is
    /// published or dead. Rows without a key are not ordered.
    pub fn ordered_by_key(mut self, ordered: bool) -> Self {
        self.config.ordered = ordered;
        self
    }

    /// Listens for notifications (default on). Off, the relay finds new rows by polling alone — for
    /// comparing the two, and for databases where `LISTEN` is not allowed (some poolers).
    pub fn notifications(mut self, on: bool) -> Self {
        self.config.notifications = on;
        self
    }

    /// What happens to published rows (default: kept 7 days).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.config.retention = retention;
        self
    }

    /// The relay-wide backoff while the broker is down: first pause and longest pause (default 250 ms
    /// and 30 s, doubling, with jitter).
    pub fn broker_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.config.backoff_initial = initial;
        self.config.backoff_max = max.max(initial);
        self
    }

    /// The relay's name in claims and logs (default `relay-<random>`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = name.into();
        self
    }

    pub(super) fn check(&self) -> Result<(), OutboxError> {
        let c = &self.config;
        if c.lease < c.publish_timeout * 2 {
            return Err(OutboxError::Config(format!(
                "the lease ({:?}) must be at least twice the publish timeout ({:?}), so a publish never \
                 outlives its claim",
                c.lease, c.publish_timeout
            )));
        }
        if c.poll_interval.is_zero() {
            return Err(OutboxError::Config(
                "the poll interval must be above zero".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_default_policy_parses_and_ends() {
        let policy = RetryPolicy::parse(DEFAULT_POLICY).unwrap();
        assert_eq!(policy.max_retries(), Some(20));
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_lease_shorter_than_twice_the_publish_timeout_is_refused() {
        let outbox = crate::Outbox::connect_with("sqlite::memory:", 1)
            .await
            .unwrap();
        let producer =
            event_retry_core::broker::Broker::new(event_retry_core::memory::MemoryTransport::new())
                .producer();
        let relay = |lease_ms| {
            outbox
                .relay(producer.clone())
                .publish_timeout(Duration::from_secs(5))
                .lease(Duration::from_millis(lease_ms))
                .start()
        };
        match relay(9_999) {
            Err(OutboxError::Config(why)) => assert!(why.contains("twice"), "{why}"),
            other => panic!(
                "a 9.999 s lease with a 5 s publish timeout: {:?}",
                other.err()
            ),
        }
        relay(10_000).unwrap().shutdown().await.unwrap();
    }
}
