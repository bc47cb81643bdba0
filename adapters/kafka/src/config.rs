//! The adapter's settings: the delay ladder's shape, topic names, and what the adapter may create.
//!
//! For a source topic `orders`, consumer group `billing` and the defaults, the topology is:
//!
//! | topic | what it holds |
//! |---|---|
//! | `orders` | the events producers publish |
//! | `orders.retry.billing` | retries of group `billing`, due now; its consumers read it with `orders` |
//! | `orders.delay-100ms.00` … `.19` | the delay ladder: level *k* holds a record 100 ms × 2^*k* |
//! | `orders.dlq` | dead letters of every group, with the group that dead-lettered them |
//!
//! The ladder is shared by every group of the topic (a record names the retry topic it goes back to),
//! and its consumers form one group of their own, `orders.delay-100ms.ladder`.

use std::time::Duration;

use event_retry_core::adapter::{BeyondMax, DelayCapability};
use event_retry_core::error::{Error, Kind};
use event_retry_core::options::{Options, is_secret};
use event_retry_core::secret::Secret;
use event_retry_core::time::format_duration;

/// The adapter's settings.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    /// The ladder's step: level *k* holds a record `granularity × 2^k`, and a retry is never early and at
    /// most about one step late. Default 100 ms.
    pub granularity: Duration,
    /// The longest delay the ladder carries; a consumer whose policy asks for more refuses to start. It
    /// sets the number of levels: `granularity × (2^levels − 1) ≥ max_delay`. Default 1 day (20 levels).
    pub max_delay: Duration,
    /// Whether missing topics (the source, its retry, ladder and DLQ topics) are created. When false, a
    /// missing one is an error at subscription naming it. Default true.
    pub create_topics: bool,
    /// Partitions of a source topic the adapter creates; the topics it derives from a source get the
    /// source's partition count. Default 1.
    pub partitions: i32,
    /// The replication factor of the topics the adapter creates; `None` is the broker's default.
    pub replication_factor: Option<i32>,
    /// Infix of a group's retry topic: `<topic><retry_infix><group>`. Default `.retry.`.
    pub retry_infix: String,
    /// Infix of the ladder's topics: `<topic><delay_infix><granularity>.<level>`. Default `.delay-`.
    pub delay_infix: String,
    /// Suffix of the DLQ topic. Default `.dlq`.
    pub dlq_suffix: String,
    /// The consumer group whose committed offsets on a DLQ mark what was replayed or purged.
    /// Default `event-retry-dlq`.
    pub dlq_group: String,
    /// How long a consumer losing partitions in a rebalance waits for the work in flight on them to be
    /// settled (and committed) before it lets them go. Default 10 s.
    pub revoke_grace: Duration,
    /// Whether each hop is a Kafka transaction: a retry or DLQ copy is produced in the same
    /// transaction that commits the offset of the record it copies (the source record's, or the ladder
    /// record's it came from), and every consumer reads `read_committed`. A crash between the copy and
    /// the commit then leaves exactly one copy, where without it the record is consumed again and
    /// copied twice — except for a copy whose offset an earlier unsettled record held back for more
    /// than a second: it is committed without its offset, and a crash before the offset follows
    /// leaves two copies (see the adapter README). Costs a transaction per commit (see the adapter README for the figure). Default
    /// false.
    pub transactional_hops: bool,
    /// Extra librdkafka settings for every client (security, timeouts), e.g.
    /// `("security.protocol", "SASL_SSL")`. A secret belongs in `client_secrets`; one put here anyway is
    /// still hidden from `Debug` when its name says it is secret (`sasl.password`).
    pub client: Vec<(String, String)>,
    /// Secret librdkafka settings for every client (`sasl.password`, `ssl.key.password`, …): set after
    /// `client`, never shown.
    pub client_secrets: Vec<(String, Secret)>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let client: Vec<(&str, &str)> = self
            .client
            .iter()
            .map(|(k, v)| (k.as_str(), if is_secret(k) { "***" } else { v.as_str() }))
            .collect();
        f.debug_struct("KafkaConfig")
            .field("granularity", &self.granularity)
            .field("max_delay", &self.max_delay)
            .field("create_topics", &self.create_topics)
            .field("partitions", &self.partitions)
            .field("replication_factor", &self.replication_factor)
            .field("retry_infix", &self.retry_infix)
            .field("delay_infix", &self.delay_infix)
            .field("dlq_suffix", &self.dlq_suffix)
            .field("dlq_group", &self.dlq_group)
            .field("revoke_grace", &self.revoke_grace)
            .field("transactional_hops", &self.transactional_hops)
            .field("client", &client)
            .field("client_secrets", &self.client_secrets)
            .finish()
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            granularity: Duration::from_millis(100),
            max_delay: Duration::from_secs(86_400),
            create_topics: true,
            partitions: 1,
            replication_factor: None,
            retry_infix: ".retry.".to_string(),
            delay_infix: ".delay-".to_string(),
            dlq_suffix: ".dlq".to_string(),
            dlq_group: "event-retry-dlq".to_string(),
            revoke_grace: Duration::from_secs(10),
            transactional_hops: false,
            client: Vec::new(),
            client_secrets: Vec::new(),
        }
    }
}

/// The most levels a ladder may have (2^40 steps is beyond any retention).
const MAX_LEVELS: u32 = 40;

impl KafkaConfig {
    /// The settings from text options (URL query parameters or the config file's `[broker]` section),
    /// starting from the defaults: `granularity`, `max_delay`, `revoke_grace` (durations such as `100ms`),
    /// `declare` (true/false; formerly `create_topics`), `partitions`, `replication_factor`, `retry_infix`, `delay_infix`,
    /// `dlq_suffix`, `dlq_group`, `transactional_hops` (true/false), `rdkafka.<property>` for any librdkafka client property
    /// (`rdkafka.fetch.queue.backoff.ms=10`), and librdkafka's TLS and SASL properties by their own
    /// names ([`crate::security::SECURITY_KEYS`]: `security.protocol`, `sasl.mechanism`,
    /// `sasl.username`, `ssl.ca.location`, …). The secrets among them ([`crate::security::SECRET_KEYS`]:
    /// `sasl.password`, `ssl.key.password`, …) may come from a variable (`sasl.password_env=NAME`) or a
    /// file (`sasl.password_file=/run/secrets/kafka`) instead. An unknown key is an error.
    pub fn from_options(options: &Options) -> Result<Self, Error> {
        let mut c = Self::default();
        let mut read = options.reader("Kafka");
        if let Some(v) = read.duration("granularity")? {
            c.granularity = v;
        }
        if let Some(v) = read.duration("max_delay")? {
            c.max_delay = v;
        }
        read.renamed("create_topics", "declare")?;
        if let Some(v) = read.bool("declare")? {
            c.create_topics = v;
        }
        if let Some(v) = read.number("partitions")? {
            c.partitions = v;
        }
        if let Some(v) = read.number("replication_factor")? {
            c.replication_factor = Some(v);
        }
        if let Some(v) = read.string("retry_infix") {
            c.retry_infix = v;
        }
        if let Some(v) = read.string("delay_infix") {
            c.delay_infix = v;
        }
        if let Some(v) = read.string("dlq_suffix") {
            c.dlq_suffix = v;
        }
        if let Some(v) = read.string("dlq_group") {
            c.dlq_group = v;
        }
        if let Some(v) = read.duration("revoke_grace")? {
            c.revoke_grace = v;
        }
        if let Some(v) = read.bool("transactional_hops")? {
            c.transactional_hops = v;
        }
        let (security, secrets) = crate::security::read(&mut read)?;
        c.client = security;
        // A secret passed through `rdkafka.` lands with the other secrets, hidden all the same.
        for (k, v) in read.prefixed("rdkafka.") {
            if is_secret(&k) {
                c.client_secrets.push((k, Secret::new(v)));
            } else {
                c.client.push((k, v));
            }
        }
        c.client_secrets.extend(secrets);
        read.finish()?;
        c.validate()?;
        Ok(c)
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: &str| Err(Error::new(Kind::Config, m.to_string()));
        if self.granularity < Duration::from_millis(1) {
            return bad("granularity must be at least 1 ms");
        }
        if self.max_delay < self.granularity {
            return bad("max_delay must be at least one granularity step");
        }
        if self.levels() > MAX_LEVELS {
            return bad("max_delay / granularity needs more than 40 ladder levels");
        }
        if self.partitions < 1 {
            return bad("partitions must be at least 1");
        }
        let names = [&self.retry_infix, &self.delay_infix, &self.dlq_suffix];
        if names.iter().any(|n| n.is_empty() || !valid_name(n)) {
            return bad("retry_infix, delay_infix and dlq_suffix must be non-empty [a-zA-Z0-9._-]");
        }
        if self.dlq_group.is_empty() {
            return bad("dlq_group must not be empty");
        }
        Ok(())
    }

    /// How many ladder levels carry `max_delay`.
    pub fn levels(&self) -> u32 {
        let steps = self
            .max_delay
            .as_millis()
            .div_ceil(self.granularity.as_millis().max(1));
        // The smallest L with 2^L − 1 ≥ steps.
        let mut levels = 1;
        while levels < 64 && (1u128 << levels) - 1 < steps {
            levels += 1;
        }
        levels
    }

    /// The longest delay the ladder carries: `granularity × (2^levels − 1)`.
    pub fn ladder_max(&self) -> Duration {
        let steps = (1u64 << self.levels().min(MAX_LEVELS)) - 1;
        self.granularity
            .checked_mul(u32::try_from(steps).unwrap_or(u32::MAX))
            .unwrap_or(Duration::MAX)
            .max(self.max_delay)
    }

    /// How delays are honoured: at the ladder's granularity, up to `max_delay`, longer ones refused.
    pub fn delay_capability(&self) -> DelayCapability {
        DelayCapability::new(self.granularity).with_max_native(self.max_delay, BeyondMax::Refuse)
    }

    /// How long before its due time the ladder hands a retry over ([`crate::ladder::HANDOVER_LEAD`]);
    /// none with transactional hops. There a retry copy waits for the commit that passes its record, and
    /// a record held until its due time while later ones of its partition are handled holds back their
    /// commits: with every work slot taken by records whose copies wait, the held one could not be
    /// handed out until the copies' one-second bound lets them commit alone.
    pub(crate) fn handover_lead(&self) -> Duration {
        if self.transactional_hops {
            Duration::ZERO
        } else {
            crate::ladder::HANDOVER_LEAD
        }
    }

    /// The retry topic of consumer group `group` on `topic`.
    pub fn retry_topic(&self, topic: &str, group: &str) -> String {
        format!("{topic}{}{group}", self.retry_infix)
    }

    /// The DLQ topic of `topic`.
    pub fn dlq_topic(&self, topic: &str) -> String {
        format!("{topic}{}", self.dlq_suffix)
    }

    /// The ladder's common prefix for `topic` (the granularity is in the name, so ladders of different
    /// steps never mix).
    fn ladder_prefix(&self, topic: &str) -> String {
        let step = format_duration(self.granularity).replace(' ', "");
        format!("{topic}{}{step}", self.delay_infix)
    }

    /// The ladder's level `level` for `topic`.
    pub fn level_topic(&self, topic: &str, level: u32) -> String {
        format!("{}.{level:02}", self.ladder_prefix(topic))
    }

    /// Every level topic of `topic`'s ladder, level 0 first.
    pub fn level_topics(&self, topic: &str) -> Vec<String> {
        (0..self.levels())
            .map(|k| self.level_topic(topic, k))
            .collect()
    }

    /// The consumer group of `topic`'s ladder consumers.
    pub fn ladder_group(&self, topic: &str) -> String {
        format!("{}.ladder", self.ladder_prefix(topic))
    }

    /// The level `level` a ladder topic name of `topic` stands for, if it is one.
    pub fn level_of(&self, topic: &str, name: &str) -> Option<u32> {
        let prefix = format!("{}.", self.ladder_prefix(topic));
        name.strip_prefix(&prefix)?.parse().ok()
    }
}

/// Whether `name` uses only the characters Kafka allows in topic and group names.
pub(crate) fn valid_name(name: &str) -> bool {
    name.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Checks a topic or group name the adapter derives names from.
pub(crate) fn check_name(what: &str, name: &str) -> Result<(), Error> {
    if name.is_empty() || !valid_name(name) || name.len() > 200 {
        return Err(Error::new(
            Kind::Config,
            format!(
                "{what} {name:?} is not a usable Kafka name: 1–200 characters of [a-zA-Z0-9._-]"
            ),
        ));
    }
    Ok(())
}

impl std::fmt::Display for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ladder of {} levels of {} up to {}{}",
            self.levels(),
            format_duration(self.granularity),
            format_duration(self.max_delay),
            if self.transactional_hops {
                ", transactional hops"
            } else {
                ""
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_handed_over_early_unless_hops_are_transactional() {
        assert_eq!(
            KafkaConfig::default().handover_lead(),
            crate::ladder::HANDOVER_LEAD
        );
        let transactional = KafkaConfig {
            transactional_hops: true,
            ..KafkaConfig::default()
        };
        assert_eq!(transactional.handover_lead(), Duration::ZERO);
    }
    use event_retry_core::adapter::Honour;

    #[test]
    fn levels_cover_the_maximum() {
        let c = KafkaConfig::default();
        assert!(c.validate().is_ok());
        // 1 day / 100 ms = 864,000 steps; 2^20 − 1 = 1,048,575.
        assert_eq!(c.levels(), 20);
        let small = KafkaConfig {
            max_delay: Duration::from_millis(700),
            ..KafkaConfig::default()
        };
        assert_eq!(small.levels(), 3);
        let one = KafkaConfig {
            max_delay: Duration::from_millis(100),
            ..KafkaConfig::default()
        };
        assert_eq!(one.levels(), 1);
    }

    #[test]
    fn names() {
        let c = KafkaConfig::default();
        assert_eq!(c.retry_topic("orders", "billing"), "orders.retry.billing");
        assert_eq!(c.dlq_topic("orders"), "orders.dlq");
        assert_eq!(c.level_topic("orders", 7), "orders.delay-100ms.07");
        assert_eq!(c.level_of("orders", "orders.delay-100ms.07"), Some(7));
        assert_eq!(c.level_of("orders", "orders.dlq"), None);
        assert_eq!(c.ladder_group("orders"), "orders.delay-100ms.ladder");
        assert_eq!(c.level_topics("orders").len(), 20);
        assert!(check_name("topic", "orders").is_ok());
        assert!(check_name("topic", "ord ers").is_err());
    }

    #[test]
    fn the_old_name_of_declare_is_still_read() {
        let old = KafkaConfig::from_options(&Options::new().set("create_topics", "false"));
        assert!(!old.unwrap_or_default().create_topics);
        let both = Options::new()
            .set("create_topics", "false")
            .set("declare", "false");
        assert_eq!(
            KafkaConfig::from_options(&both).err().map(|e| e.kind()),
            Some(Kind::Config)
        );
    }

    #[test]
    fn options_set_every_field_and_refuse_unknown_keys() {
        let options = Options::new()
            .set("granularity", "250ms")
            .set("max_delay", "1h")
            .set("declare", "false")
            .set("partitions", "4")
            .set("replication_factor", "3")
            .set("dlq_suffix", ".dead")
            .set("revoke_grace", "3s")
            .set("transactional_hops", "true")
            .set("rdkafka.fetch.queue.backoff.ms", "10");
        let c = KafkaConfig::from_options(&options).unwrap_or_default();
        assert!(c.transactional_hops);
        assert_eq!(c.granularity, Duration::from_millis(250));
        assert_eq!(c.max_delay, Duration::from_secs(3600));
        assert!(!c.create_topics);
        assert_eq!((c.partitions, c.replication_factor), (4, Some(3)));
        assert_eq!(c.dlq_topic("orders"), "orders.dead");
        assert_eq!(c.revoke_grace, Duration::from_secs(3));
        assert_eq!(
            c.client,
            vec![("fetch.queue.backoff.ms".to_string(), "10".to_string())]
        );
        let typo = KafkaConfig::from_options(&Options::new().set("granularty", "1s"));
        assert_eq!(typo.err().map(|e| e.kind()), Some(Kind::Config));
        let invalid = KafkaConfig::from_options(&Options::new().set("partitions", "0"));
        assert_eq!(invalid.err().map(|e| e.kind()), Some(Kind::Config));
    }

    #[test]
    fn security_settings_by_their_own_names_and_secrets_never_shown() {
        let options = Options::new()
            .set("security.protocol", "SASL_SSL")
            .set("sasl.mechanism", "SCRAM-SHA-512")
            .set("sasl.username", "app")
            .set("sasl.password", "hunter2-kafka")
            .set("rdkafka.ssl.key.password", "hunter3-kafka");
        let c = KafkaConfig::from_options(&options).unwrap_or_default();
        assert!(
            c.client
                .contains(&("security.protocol".into(), "SASL_SSL".into()))
        );
        assert!(c.client.contains(&("sasl.username".into(), "app".into())));
        let secrets: Vec<(&str, &str)> = c
            .client_secrets
            .iter()
            .map(|(k, v)| (k.as_str(), v.expose()))
            .collect();
        assert!(
            secrets.contains(&("sasl.password", "hunter2-kafka")),
            "{secrets:?}"
        );
        assert!(
            secrets.contains(&("ssl.key.password", "hunter3-kafka")),
            "{secrets:?}"
        );
        let shown = format!("{c:?} {options:?}");
        assert!(!shown.contains("hunter"), "{shown}");
        // Even a secret put among the plain settings in code stays hidden.
        let by_hand = KafkaConfig {
            client: vec![("sasl.password".into(), "hunter4-kafka".into())],
            ..KafkaConfig::default()
        };
        assert!(!format!("{by_hand:?}").contains("hunter4"));
    }

    #[test]
    fn longer_than_the_ladder_is_refused() {
        let c = KafkaConfig {
            max_delay: Duration::from_secs(600),
            ..KafkaConfig::default()
        };
        let cap = c.delay_capability();
        assert_eq!(cap.honour(Duration::from_secs(60)), Honour::Exact);
        assert!(matches!(
            cap.honour(Duration::from_secs(601)),
            Honour::Refused { .. }
        ));
        assert!(
            KafkaConfig {
                granularity: Duration::ZERO,
                ..KafkaConfig::default()
            }
            .validate()
            .is_err()
        );
    }
}
