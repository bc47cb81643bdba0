//! The adapter's settings: topic names and how the broker's delayed delivery behaves.

use std::time::Duration;

use retry_core::transport::{BeyondMax, DelayCapability, TransportError};

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
    /// The broker's `delayedDeliveryMaxDelayInMillis`, if set: a consumer whose policy asks for a longer
    /// delay refuses to start (the broker would refuse the retry copy). Default none (Pulsar's default).
    pub max_delay: Option<Duration>,
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
            max_delay: None,
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

    /// How the broker honours delays: on its tick, up to `max_delay` when the broker has one.
    pub fn delay_capability(&self) -> DelayCapability {
        DelayCapability {
            granularity: self.tick,
            max_native: self.max_delay,
            beyond_max: BeyondMax::Refuse,
        }
    }

    /// The full name of `topic` (a short name is put in `namespace`).
    pub fn full_name(&self, topic: &str) -> String {
        if topic.contains("://") {
            topic.to_string()
        } else {
            format!("persistent://{}/{topic}", self.namespace)
        }
    }

    /// The retry topic of consumer group `group` on `topic` (each group retries on its own, as Pulsar's
    /// own clients name it).
    pub fn retry_topic(&self, topic: &str, group: &str) -> String {
        format!("{}-{group}{}", self.full_name(topic), self.retry_suffix)
    }

    /// The DLQ topic of `topic`.
    pub fn dlq_topic(&self, topic: &str) -> String {
        format!("{}{}", self.full_name(topic), self.dlq_suffix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use retry_core::transport::Honour;

    #[test]
    fn names() {
        let c = PulsarConfig::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.full_name("orders"), "persistent://public/default/orders");
        assert_eq!(c.full_name("persistent://t/n/x"), "persistent://t/n/x");
        assert_eq!(
            c.retry_topic("orders", "billing"),
            "persistent://public/default/orders-billing-RETRY"
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

    #[test]
    fn a_broker_maximum_refuses_longer_delays() {
        let unlimited = PulsarConfig::default().delay_capability();
        assert_eq!(
            unlimited.honour(Duration::from_secs(86_400 * 30)),
            Honour::Exact
        );
        let capped = PulsarConfig {
            max_delay: Some(Duration::from_secs(3_600)),
            ..PulsarConfig::default()
        }
        .delay_capability();
        assert!(matches!(
            capped.honour(Duration::from_secs(7_200)),
            Honour::Refused { .. }
        ));
        assert_eq!(
            capped.honour(Duration::from_millis(1_500)),
            Honour::Rounded {
                to: Duration::from_secs(2)
            }
        );
    }
}
