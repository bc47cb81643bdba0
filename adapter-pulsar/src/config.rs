//! The adapter's settings: topic names and how the broker's delayed delivery behaves.

use std::time::Duration;

use retry_core::transport::TransportError;

/// The adapter's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PulsarConfig {
    /// Where a short topic name lives: `orders` is `persistent://public/default/orders`.
    pub namespace: String,
    /// Suffix of the retry topic a consumer also reads. Default `-RETRY`.
    pub retry_suffix: String,
    /// Suffix of the DLQ topic. Default `-DLQ`.
    pub dlq_suffix: String,
    /// The subscription DLQ operations read the DLQ with (an entry is removed by acknowledging it there).
    pub dlq_subscription: String,
    /// The broker's `delayedDeliveryTickTimeMillis`: delayed messages are dispatched on this tick, so it is
    /// the delay granularity. Default 1 s (Pulsar's default).
    pub tick: Duration,
    /// Whether the broker runs with `isDelayedDeliveryDeliverAtTimeStrict=true`. Pulsar's default (false)
    /// may dispatch a message up to one tick before its `deliverAt`; then the adapter asks for one tick
    /// later, so no retry is ever early. Default false.
    pub strict_deliver_at: bool,
}

impl Default for PulsarConfig {
    fn default() -> Self {
        Self {
            namespace: "public/default".to_string(),
            retry_suffix: "-RETRY".to_string(),
            dlq_suffix: "-DLQ".to_string(),
            dlq_subscription: "event-retry-dlq".to_string(),
            tick: Duration::from_secs(1),
            strict_deliver_at: false,
        }
    }
}

impl PulsarConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), TransportError> {
        if self.namespace.split('/').count() != 2 || self.namespace.split('/').any(str::is_empty) {
            return Err(TransportError::Config(format!(
                "namespace must be tenant/namespace, got {:?}",
                self.namespace
            )));
        }
        if self.retry_suffix.is_empty()
            || self.dlq_suffix.is_empty()
            || self.retry_suffix == self.dlq_suffix
        {
            return Err(TransportError::Config(
                "retry_suffix and dlq_suffix must be non-empty and different".to_string(),
            ));
        }
        if self.tick.is_zero() {
            return Err(TransportError::Config("tick must be positive".to_string()));
        }
        Ok(())
    }

    /// The full name of `topic` (a short name is put in `namespace`).
    pub fn full_name(&self, topic: &str) -> String {
        if topic.contains("://") {
            topic.to_string()
        } else {
            format!("persistent://{}/{topic}", self.namespace)
        }
    }

    /// The retry topic of `topic`.
    pub fn retry_topic(&self, topic: &str) -> String {
        format!("{}{}", self.full_name(topic), self.retry_suffix)
    }

    /// The DLQ topic of `topic`.
    pub fn dlq_topic(&self, topic: &str) -> String {
        format!("{}{}", self.full_name(topic), self.dlq_suffix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let c = PulsarConfig::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.full_name("orders"), "persistent://public/default/orders");
        assert_eq!(c.full_name("persistent://t/n/x"), "persistent://t/n/x");
        assert_eq!(
            c.retry_topic("orders"),
            "persistent://public/default/orders-RETRY"
        );
        assert_eq!(
            c.dlq_topic("orders"),
            "persistent://public/default/orders-DLQ"
        );
        let bad = PulsarConfig {
            namespace: "nope".into(),
            ..PulsarConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
