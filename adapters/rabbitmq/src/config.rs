//! How the adapter lays out its queues: granularity and depth of the delay ladder, queue type, names.
//!
//! The defaults suit most services: delays exact to a fraction of a second up to weeks (see
//! [`RabbitConfig::default`]), classic durable queues, topology declared on first use. Quorum queues (`queue_type=quorum`) replicate every queue over a cluster.
//! Everything the broker stores is named from these settings, so two services with the same settings
//! share one ladder and a service with different ones gets its own.

use std::time::Duration;

use event_retry_core::error::{Error, Kind};
use event_retry_core::options::Options;
use event_retry_core::time::format_duration;

pub use crate::security::RabbitSecurity;

/// The queue type for every queue the adapter declares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QueueType {
    /// Classic durable queues (the default): on one node; a broker crash redelivers what was
    /// acknowledged since a queue's index was last written (duplicates, never losses).
    #[default]
    Classic,
    /// Quorum queues: replicated over a cluster, acknowledgements journaled; work queues carry an
    /// explicit `x-delivery-limit` whose overflow goes to the DLQ, never dropped.
    Quorum,
}

impl QueueType {
    /// The name used in queue names and `x-queue-type`.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
        }
    }
}

/// The adapter's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RabbitConfig {
    /// The ladder's step: every delay is rounded up to a multiple of it (never early). Default 100 ms.
    pub granularity: Duration,
    /// How many binary delay levels (queues where a copy waits granularity × 2ᵏ, k < levels); the longest
    /// delay is granularity × (2^levels − 1). Default 24 (19.4 days at 100 ms).
    pub levels: u32,
    /// Queue type of the work queues, DLQs and delay levels. Default classic.
    pub queue_type: QueueType,
    /// `x-delivery-limit` of quorum work queues: deliveries (handler crashes, releases) after which the
    /// broker moves a message to the DLQ. Default 1,000: far above any retry policy's attempts, because a
    /// retry is a new copy and does not count.
    pub delivery_limit: u32,
    /// Prefix of the shared ladder's exchanges and queues. Default `event-retry`.
    pub prefix: String,
    /// Suffix of a topic's DLQ queue name. Default `.dlq`.
    pub dlq_suffix: String,
    /// Declare missing queues, exchanges and bindings (idempotently) on first use. Default true; when
    /// false, a missing queue is an error naming it.
    pub declare: bool,
    /// The password, CA and client certificate ([`RabbitSecurity`]).
    pub security: RabbitSecurity,
}

impl Default for RabbitConfig {
    fn default() -> Self {
        Self {
            granularity: Duration::from_millis(100),
            levels: 24,
            queue_type: QueueType::Classic,
            delivery_limit: 1_000,
            prefix: "event-retry".to_string(),
            dlq_suffix: ".dlq".to_string(),
            declare: true,
            security: RabbitSecurity::default(),
        }
    }
}

/// The longest wait of one delay level, 2³² − 1 ms (49.7 days): RabbitMQ's limit for a TTL, which the
/// ladder's levels had when the broker moved the copies, kept so that every setting valid then is valid
/// now and none beyond it.
const MAX_LEVEL_WAIT_MS: u128 = u32::MAX as u128;

/// `d` for a reader: in days or hours with a decimal when that long, else exact (`1500ms`).
fn about(d: Duration) -> String {
    const HOUR: f64 = 3_600.0;
    match d.as_secs_f64() {
        s if s >= 24.0 * HOUR => format!("{:.1} days", s / (24.0 * HOUR)),
        s if s >= HOUR => format!("{:.1} hours", s / HOUR),
        _ => format_duration(d),
    }
}

/// AMQP URI query parameters lapin itself reads; they pass through to the connection URL.
pub(crate) const URI_PARAMETERS: [&str; 5] = [
    "heartbeat",
    "connection_timeout",
    "channel_max",
    "frame_max",
    "auth_mechanism",
];

impl RabbitConfig {
    /// The topology these settings declare, in one line (the consumer's start-up report names it):
    /// the queue type with each queue's delivery limit, and the delay ladder.
    pub fn topology(&self) -> String {
        let queues = match self.queue_type {
            QueueType::Classic => "classic durable queues".to_string(),
            QueueType::Quorum => format!(
                "quorum queues: work and retry queues with x-delivery-limit {} (then the DLQ), \
                 the DLQ and the ladder with x-delivery-limit {} (a message given back there is \
                 never dropped)",
                self.delivery_limit,
                crate::declare::HELD_DELIVERY_LIMIT
            ),
        };
        let checked = if self.declare {
            ""
        } else {
            " (declare=false: the queues as the broker has them, checked only to exist)"
        };
        format!(
            "{queues}; a delay ladder '{}' of {} levels of {} (delays up to {}, rounded up to {}); \
             DLQ queues named <topic>{}{checked}",
            self.prefix,
            self.levels,
            format_duration(self.granularity),
            about(self.max_delay()),
            format_duration(self.granularity),
            self.dlq_suffix
        )
    }

    /// The settings from text options (URL query parameters or the config file's `[broker]` section),
    /// starting from the defaults: `granularity` (a duration such as `100ms`), `levels`, `queue_type`
    /// (`classic` or `quorum`), `delivery_limit`, `prefix`, `dlq_suffix`, `declare` (true/false), and
    /// [`RabbitSecurity`]'s `password` (or `password_env`, `password_file`), `tls_ca`, `tls_cert` and
    /// `tls_key`. The
    /// AMQP URI's own parameters (`heartbeat`, `connection_timeout`, `channel_max`, `frame_max`,
    /// `auth_mechanism`) are returned apart, for the connection URL. An unknown key is an error.
    pub fn from_options(options: &Options) -> Result<(Self, Vec<(String, String)>), Error> {
        let mut c = Self::default();
        let mut read = options.reader("RabbitMQ");
        if let Some(v) = read.duration("granularity")? {
            c.granularity = v;
        }
        if let Some(v) = read.number("levels")? {
            c.levels = v;
        }
        if let Some(i) = read.choice("queue_type", &["classic", "quorum"])? {
            c.queue_type = [QueueType::Classic, QueueType::Quorum][i];
        }
        if let Some(v) = read.number("delivery_limit")? {
            c.delivery_limit = v;
        }
        if let Some(v) = read.string("prefix") {
            c.prefix = v;
        }
        if let Some(v) = read.string("dlq_suffix") {
            c.dlq_suffix = v;
        }
        if let Some(v) = read.bool("declare")? {
            c.declare = v;
        }
        c.security = RabbitSecurity::read(&mut read)?;
        let uri: Vec<(String, String)> = URI_PARAMETERS
            .iter()
            .filter_map(|k| read.string(k).map(|v| ((*k).to_string(), v)))
            .collect();
        read.finish()?;
        c.validate()?;
        Ok((c, uri))
    }

    /// The longest delay the ladder carries: granularity × (2^levels − 1).
    pub fn max_delay(&self) -> Duration {
        let units = (1u64 << self.levels.min(63)) - 1;
        self.granularity
            .checked_mul(u32::try_from(units).unwrap_or(u32::MAX))
            .unwrap_or(Duration::MAX)
    }

    /// Checks the settings, with the reason when they cannot work.
    pub fn validate(&self) -> Result<(), Error> {
        self.security.validate()?;
        let g = self.granularity.as_millis();
        if g == 0 || !self.granularity.as_nanos().is_multiple_of(1_000_000) {
            return Err(Error::new(
                Kind::Config,
                format!(
                    "granularity must be a whole number of milliseconds ≥ 1 ms, got {:?}",
                    self.granularity
                ),
            ));
        }
        if !(1..=32).contains(&self.levels) {
            return Err(Error::new(
                Kind::Config,
                format!("levels must be between 1 and 32, got {}", self.levels),
            ));
        }
        let top = g << (self.levels - 1);
        if top > MAX_LEVEL_WAIT_MS {
            return Err(Error::new(
                Kind::Config,
                format!(
                    "the top delay level would wait {top} ms, above the limit of {MAX_LEVEL_WAIT_MS} ms: \
                 lower levels or granularity"
                ),
            ));
        }
        if self.prefix.is_empty() || self.dlq_suffix.is_empty() {
            return Err(Error::new(
                Kind::Config,
                "prefix and dlq_suffix must not be empty",
            ));
        }
        if self.queue_type == QueueType::Quorum && self.delivery_limit == 0 {
            return Err(Error::new(
                Kind::Config,
                "a quorum work queue needs a delivery limit ≥ 1",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_topology_names_the_queue_type_the_limits_and_the_ladder() {
        let classic = RabbitConfig::default().topology();
        assert!(
            classic.starts_with(
                "classic durable queues; a delay ladder 'event-retry' of 24 levels of 100ms"
            ),
            "{classic}"
        );
        assert!(
            classic.contains("(delays up to 19.4 days, rounded up to 100ms)"),
            "{classic}"
        );
        assert!(
            classic.ends_with("DLQ queues named <topic>.dlq"),
            "{classic}"
        );
        let quorum = RabbitConfig {
            queue_type: QueueType::Quorum,
            delivery_limit: 50,
            ..RabbitConfig::default()
        }
        .topology();
        assert!(
            quorum.contains("x-delivery-limit 50 (then the DLQ)"),
            "{quorum}"
        );
        assert!(quorum.contains("x-delivery-limit 2147483647"), "{quorum}");
    }

    #[test]
    fn defaults_are_valid_and_reach_19_days() {
        let c = RabbitConfig::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.queue_type, QueueType::Classic);
        assert_eq!(c.max_delay(), Duration::from_millis(100 * ((1 << 24) - 1)));
    }

    #[test]
    fn options_set_every_field_and_pass_uri_parameters_through() {
        let options = Options::new()
            .set("granularity", "250ms")
            .set("levels", "10")
            .set("queue_type", "quorum")
            .set("delivery_limit", "50")
            .set("prefix", "svc")
            .set("dlq_suffix", ".dead")
            .set("declare", "false")
            .set("heartbeat", "10");
        let (c, uri) = RabbitConfig::from_options(&options).unwrap_or_default();
        assert_eq!(c.granularity, Duration::from_millis(250));
        assert_eq!((c.levels, c.delivery_limit), (10, 50));
        assert_eq!(c.queue_type, QueueType::Quorum);
        assert_eq!((c.prefix.as_str(), c.dlq_suffix.as_str()), ("svc", ".dead"));
        assert!(!c.declare);
        assert_eq!(uri, vec![("heartbeat".to_string(), "10".to_string())]);
        let typo = RabbitConfig::from_options(&Options::new().set("granularty", "1s"));
        assert_eq!(typo.err().map(|e| e.kind()), Some(Kind::Config));
        let bad = RabbitConfig::from_options(&Options::new().set("queue_type", "stream"));
        assert!(
            bad.err()
                .is_some_and(|e| e.to_string().contains("classic, quorum"))
        );
    }

    #[test]
    fn bad_settings_say_why() {
        let too_deep = RabbitConfig {
            granularity: Duration::from_secs(1),
            levels: 32,
            ..RabbitConfig::default()
        };
        let err = too_deep.validate().err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("above the limit")));
        let fractional = RabbitConfig {
            granularity: Duration::from_micros(1_500),
            ..RabbitConfig::default()
        };
        assert!(fractional.validate().is_err());
        let no_levels = RabbitConfig {
            levels: 0,
            ..RabbitConfig::default()
        };
        assert!(no_levels.validate().is_err());
    }
}
