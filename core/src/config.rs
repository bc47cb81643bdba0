//! Policies and classification from one config file, globally and per topic.
//!
//! ```toml
//! [default]
//! policy = "5s x3, 10s x5"            # deferred retries through the broker
//! in_place = "exp(100ms, 1s, 2, 3)"   # transient errors, inside the consumer
//! blocking = "exp(500ms, 30s, 2)"     # backoff while a dependency is down
//! default_kind = "deferred"           # kind of errors no rule recognises
//! rules = [
//!   { message = "statement timeout", kind = "blocking" },
//!   { message = "(?i)validation", kind = "non_retryable" },
//! ]
//!
//! [topics.payments]
//! policy = "exp(1s, 10m, 2, 12); jitter=full; max-elapsed=2h"
//!
//! [broker]                            # optional: which broker, and the adapter's settings
//! url = "kafka://127.0.0.1:9092"
//! options = { granularity = "100ms", partitions = 4 }
//! ```
//!
//! With a `[broker]` section, `event_retry::connect_config(&config)` connects, so moving a service from
//! one broker to another is a change of this file. The options are the adapter's (each adapter's README
//! lists them); the same keys work as URL query parameters.
//!
//! A topic section overrides the fields it sets; rules of a topic come before the default rules. Error
//! *types* cannot be named in a file (Rust has no reflection): register them in code with
//! [`Classifier::on_type`] and they apply before the file's message rules.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::classify::{Classifier, FailureKind, PatternError};
use crate::decide::Policies;
use crate::options::Options;
use crate::policy::RetryPolicy;

/// A message-pattern classification rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// A regular expression matched against each error message in the chain.
    pub message: String,
    /// The kind of matching errors (`non_retryable`, `transient`, `blocking`, `deferred`, or NRE/SLE/SBE/SNBE).
    #[serde(with = "kind_text")]
    pub kind: FailureKind,
}

/// Settings for one scope (the default, or one topic); unset fields fall back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeConfig {
    /// Deferred retry policy.
    pub policy: Option<RetryPolicy>,
    /// In-place retry policy for transient errors.
    pub in_place: Option<RetryPolicy>,
    /// Backoff while a blocking error holds consumption.
    pub blocking: Option<RetryPolicy>,
    /// The kind of errors no rule recognises.
    #[serde(default, with = "opt_kind_text")]
    pub default_kind: Option<FailureKind>,
    /// Message-pattern rules, tried in order.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
}

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Settings for every topic.
    #[serde(default)]
    pub default: ScopeConfig,
    /// Per-topic overrides.
    #[serde(default)]
    pub topics: BTreeMap<String, ScopeConfig>,
    /// Which broker to connect to, with the adapter's settings.
    #[serde(default)]
    pub broker: Option<BrokerConfig>,
}

/// The `[broker]` section: a broker URL and the adapter's settings.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// The broker URL (`kafka://…`, `amqp://…`, `sqs://…`, `pulsar://…`, `memory://…`).
    pub url: String,
    /// The adapter's settings; text, numbers and booleans.
    #[serde(default)]
    pub options: BTreeMap<String, OptionValue>,
}

impl std::fmt::Debug for BrokerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("url", &crate::options::redact_url(&self.url))
            .field("options", &self.to_options())
            .finish()
    }
}

impl BrokerConfig {
    /// The settings as adapter [`Options`].
    pub fn to_options(&self) -> Options {
        self.options
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect()
    }
}

/// One setting's value in the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OptionValue {
    /// Text (`"100ms"`).
    Text(String),
    /// A whole number.
    Integer(i64),
    /// A number with a fraction.
    Float(f64),
    /// A boolean.
    Bool(bool),
}

impl std::fmt::Display for OptionValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OptionValue::Text(s) => f.write_str(s),
            OptionValue::Integer(n) => write!(f, "{n}"),
            OptionValue::Float(x) => write!(f, "{x}"),
            OptionValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// A config file that could not be read or understood.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The TOML (or a policy in it) did not parse.
    #[error("{0}")]
    Parse(#[from] toml::de::Error),
    /// A message pattern is not a valid regular expression.
    #[error(transparent)]
    Pattern(#[from] PatternError),
}

impl RetryConfig {
    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Ok(toml::from_str(text)?)
    }

    /// Reads and parses a TOML file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// The policies for `topic`: the topic's, else the default's, else the built-in defaults.
    pub fn policies(&self, topic: &str) -> Policies {
        let builtin = Policies::default();
        let scope = self.topics.get(topic);
        let pick = |f: fn(&ScopeConfig) -> &Option<RetryPolicy>, fallback: RetryPolicy| {
            scope
                .and_then(|s| f(s).clone())
                .or_else(|| f(&self.default).clone())
                .unwrap_or(fallback)
        };
        Policies {
            deferred: pick(|s| &s.policy, builtin.deferred),
            in_place: pick(|s| &s.in_place, builtin.in_place),
            blocking: pick(|s| &s.blocking, builtin.blocking),
        }
    }

    /// Adds the file's rules for `topic` (topic rules first, then default rules) and its default kind to
    /// `base`, a classifier that may already hold type rules registered in code.
    pub fn classifier(&self, topic: &str, base: Classifier) -> Result<Classifier, ConfigError> {
        let scope = self.topics.get(topic);
        let mut classifier = base;
        for rule in scope
            .map(|s| s.rules.as_slice())
            .unwrap_or_default()
            .iter()
            .chain(&self.default.rules)
        {
            classifier = classifier.on_message(&rule.message, rule.kind)?;
        }
        if let Some(kind) = scope
            .and_then(|s| s.default_kind)
            .or(self.default.default_kind)
        {
            classifier = classifier.default_kind(kind);
        }
        Ok(classifier)
    }
}

mod kind_text {
    use super::FailureKind;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(kind: &FailureKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(kind.as_str())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FailureKind, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

mod opt_kind_text {
    use super::FailureKind;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        kind: &Option<FailureKind>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match kind {
            Some(k) => s.serialize_str(k.as_str()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<FailureKind>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| s.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::classify::HandlerError;

    const FILE: &str = r#"
        [default]
        policy = "5s x3, 10s x5"
        default_kind = "SLE"
        rules = [{ message = "statement timeout", kind = "blocking" }]

        [topics.payments]
        policy = "exp(1s, 10m, 2, 12); jitter=full"
        rules = [{ message = "card declined", kind = "NRE" }]
    "#;

    #[test]
    fn topic_overrides_default_which_overrides_builtin() {
        let c = RetryConfig::from_toml(FILE).unwrap();
        assert_eq!(c.policies("orders").deferred.to_string(), "5s x3, 10s x5");
        assert_eq!(c.policies("payments").deferred.max_retries(), Some(12));
        assert_eq!(c.policies("orders").blocking, Policies::default().blocking);
    }

    #[test]
    fn rules_apply_per_topic_then_default() {
        let c = RetryConfig::from_toml(FILE).unwrap();
        let payments = c.classifier("payments", Classifier::new()).unwrap();
        let orders = c.classifier("orders", Classifier::new()).unwrap();
        let declined = HandlerError::unclassified("card declined");
        let timeout = HandlerError::unclassified("canceling statement due to statement timeout");
        assert_eq!(payments.classify(&declined), FailureKind::NonRetryable);
        assert_eq!(
            orders.classify(&declined),
            FailureKind::Transient,
            "default kind SLE"
        );
        assert_eq!(payments.classify(&timeout), FailureKind::Blocking);
    }

    #[test]
    fn the_broker_section_gives_url_and_options() {
        let c = RetryConfig::from_toml(
            "[broker]\nurl = \"kafka://h:9092\"\noptions = { granularity = \"100ms\", partitions = 4, declare = false }",
        )
        .unwrap();
        let broker = c.broker.unwrap();
        assert_eq!(broker.url, "kafka://h:9092");
        let o = broker.to_options();
        assert_eq!(o.get("granularity"), Some("100ms"));
        assert_eq!(o.get("partitions"), Some("4"));
        assert_eq!(o.get("declare"), Some("false"));
        assert!(RetryConfig::from_toml("[broker]\nurl = \"x\"\nurls = 1").is_err());
    }

    #[test]
    fn errors_name_the_problem() {
        let bad_policy = RetryConfig::from_toml("[default]\npolicy = \"5000x\"").unwrap_err();
        assert!(bad_policy.to_string().contains("column 6"), "{bad_policy}");
        let bad_kind = RetryConfig::from_toml("[default]\ndefault_kind = \"fatal\"").unwrap_err();
        assert!(
            bad_kind.to_string().contains("unknown error kind"),
            "{bad_kind}"
        );
        let typo = RetryConfig::from_toml("[default]\npolcy = \"5s\"").unwrap_err();
        assert!(typo.to_string().contains("polcy"), "{typo}");
        let pattern =
            RetryConfig::from_toml("[default]\nrules = [{ message = \"(\", kind = \"blocking\" }]")
                .unwrap()
                .classifier("t", Classifier::new())
                .unwrap_err();
        assert!(pattern.to_string().contains("invalid message pattern"));
    }
}
