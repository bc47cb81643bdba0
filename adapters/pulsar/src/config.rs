//! The adapter's settings: topic names and how the broker's delayed delivery behaves.

use std::time::Duration;

use event_retry_core::adapter::{BeyondMax, DelayCapability};
use event_retry_core::error::{Error, Kind};
use event_retry_core::options::Options;

pub use crate::security::PulsarSecurity;

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
    /// Whether the broker has delayed delivery on (`delayedDeliveryEnabled`); off, it would hand a retry
    /// out at once, so every delay is refused at start. Default true (Pulsar's default).
    pub delayed_delivery: bool,
    /// The broker's admin REST API (`http://host:8080`). When given, [`crate::PulsarTransport::connect_with`]
    /// reads the delayed-delivery settings above from the broker and the namespace's policy instead of
    /// trusting the configured ones, so a policy the broker cannot honour is refused at start.
    pub admin_url: Option<String>,
    /// The token and TLS settings ([`PulsarSecurity`]).
    pub security: PulsarSecurity,
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
            delayed_delivery: true,
            admin_url: None,
            security: PulsarSecurity::default(),
        }
    }
}

impl PulsarConfig {
    /// The settings from text options (URL query parameters or the config file's `[broker]` section),
    /// starting from the defaults: `namespace`, `retry_suffix`, `dlq_suffix`, `dlq_group` (formerly `dlq_subscription`),
    /// `granularity` (formerly `tick`)
    /// and `max_delay` (durations such as `100ms`), `strict_deliver_at` (true/false), `admin_url`, and
    /// [`PulsarSecurity`]'s `token` (or `token_env`, `token_file`), `tls_ca` and
    /// `tls_hostname_verification`. An unknown key is an error.
    pub fn from_options(options: &Options) -> Result<Self, Error> {
        let mut c = Self::default();
        let mut read = options.reader("Apache Pulsar");
        if let Some(v) = read.string("namespace") {
            c.namespace = v;
        }
        if let Some(v) = read.string("retry_suffix") {
            c.retry_suffix = v;
        }
        if let Some(v) = read.string("dlq_suffix") {
            c.dlq_suffix = v;
        }
        read.renamed("dlq_subscription", "dlq_group")?;
        if let Some(v) = read.string("dlq_group") {
            c.dlq_subscription = v;
        }
        read.renamed("tick", "granularity")?;
        if let Some(v) = read.duration("granularity")? {
            c.tick = v;
        }
        if let Some(v) = read.bool("strict_deliver_at")? {
            c.strict_deliver_at = v;
        }
        if let Some(v) = read.duration("max_delay")? {
            c.max_delay = Some(v);
        }
        if let Some(v) = read.string("admin_url") {
            c.admin_url = Some(v);
        }
        c.security = PulsarSecurity::read(&mut read)?;
        read.finish()?;
        c.validate()?;
        Ok(c)
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Error> {
        if self.namespace.split('/').count() != 2 || self.namespace.split('/').any(str::is_empty) {
            return Err(Error::new(
                Kind::Config,
                format!(
                    "namespace must be tenant/namespace, got {:?}",
                    self.namespace
                ),
            ));
        }
        if self.retry_suffix.is_empty()
            || self.dlq_suffix.is_empty()
            || self.retry_suffix == self.dlq_suffix
        {
            return Err(Error::new(
                Kind::Config,
                "retry_suffix and dlq_suffix must be non-empty and different",
            ));
        }
        if self.tick.is_zero() {
            return Err(Error::new(
                Kind::Config,
                "granularity (the broker's tick) must be positive",
            ));
        }
        Ok(())
    }

    /// How the broker honours delays: on its tick, up to `max_delay` when the broker has one, and none
    /// at all when delayed delivery is off.
    pub fn delay_capability(&self) -> DelayCapability {
        let longest = if self.delayed_delivery {
            self.max_delay
        } else {
            Some(Duration::ZERO)
        };
        let capability = DelayCapability::new(self.tick);
        match longest {
            Some(max) => capability.with_max_native(max, BeyondMax::Refuse),
            None => capability,
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
    use event_retry_core::adapter::Honour;

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
    fn the_old_names_are_still_read() {
        let old = Options::new()
            .set("dlq_subscription", "ops")
            .set("tick", "250ms");
        let c = PulsarConfig::from_options(&old).unwrap_or_default();
        assert_eq!(c.dlq_subscription, "ops");
        assert_eq!(c.tick, Duration::from_millis(250));
    }

    #[test]
    fn options_set_every_field() {
        let options = Options::new()
            .set("namespace", "acme/prod")
            .set("retry_suffix", "-again")
            .set("dlq_suffix", "-dead")
            .set("dlq_group", "ops")
            .set("granularity", "1s")
            .set("strict_deliver_at", "true")
            .set("max_delay", "10d");
        let c = PulsarConfig::from_options(&options).unwrap_or_default();
        assert_eq!(c.dlq_topic("orders"), "persistent://acme/prod/orders-dead");
        assert_eq!(
            c.retry_topic("orders", "g"),
            "persistent://acme/prod/orders-g-again"
        );
        assert_eq!(c.dlq_subscription, "ops");
        assert_eq!(c.tick, Duration::from_secs(1));
        assert!(c.strict_deliver_at);
        assert_eq!(c.max_delay, Some(Duration::from_secs(864_000)));
        let typo = PulsarConfig::from_options(&Options::new().set("tik", "1s"));
        assert_eq!(typo.err().map(|e| e.kind()), Some(Kind::Config));
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
