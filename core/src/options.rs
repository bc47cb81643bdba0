//! Adapter settings as text, so that moving a service between brokers is configuration only.
//!
//! The same settings reach an adapter three ways: URL query parameters
//! (`kafka://127.0.0.1:9092?granularity=100ms&partitions=4`), the `[broker]` section of the config file
//! ([`crate::config`]), and [`Options`] built in code for `connect_with`. Each adapter reads the keys it
//! knows with an [`OptionReader`], which refuses an unknown key (a typo must not be silently ignored) and a
//! value of the wrong type, naming the key, the adapter and what it expected.
//!
//! ```
//! use event_retry_core::options::Options;
//!
//! let (url, options) = Options::split_url("kafka://127.0.0.1:9092?granularity=250ms&declare=false")?;
//! assert_eq!(url, "kafka://127.0.0.1:9092");
//! let mut read = options.reader("Kafka");
//! assert_eq!(read.duration("granularity")?, Some(std::time::Duration::from_millis(250)));
//! assert_eq!(read.bool("declare")?, Some(false));
//! assert_eq!(read.number::<u32>("partitions")?, None);
//! read.finish()?;
//! # Ok::<(), event_retry_core::error::Error>(())
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Kind};
use crate::secret::Secret;

/// Adapter settings: keys and text values, later ones overriding earlier ones.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Options {
    entries: Vec<(String, String)>,
}

/// Words in a key that mark its value as secret; such values never appear in `Debug` output.
const SECRET_WORDS: [&str; 7] = [
    "password",
    "secret",
    "token",
    "credential",
    "private",
    "key.pem",
    "passphrase",
];

/// Whether a setting named `key` holds a secret (its name has `password`, `secret`, `token`,
/// `credential`, `private`, `key.pem` or `passphrase` in it), so its value is never shown.
///
/// ```
/// use event_retry_core::options::is_secret;
/// assert!(is_secret("sasl.password"));
/// assert!(is_secret("rdkafka.ssl.key.pem"));
/// assert!(!is_secret("sasl.username"));
/// ```
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| key.contains(w))
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (k, v) in &self.entries {
            if is_secret(k) {
                map.entry(k, &"***");
            } else {
                map.entry(k, v);
            }
        }
        map.finish()
    }
}

impl Options {
    /// No settings: every adapter default applies.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`, builder style.
    pub fn set(mut self, key: impl Into<String>, value: impl ToString) -> Self {
        self.insert(key, value);
        self
    }

    /// Sets `key` to `value` (a later value of the same key overrides an earlier one).
    pub fn insert(&mut self, key: impl Into<String>, value: impl ToString) {
        self.entries.push((key.into(), value.to_string()));
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every (key, value) in the order set, overridden ones included.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds `other`'s settings, which override these.
    pub fn extend(&mut self, other: Options) {
        self.entries.extend(other.entries);
    }

    /// Splits a URL's query off into options: `scheme://host?a=1&b=x%20y` gives `scheme://host` and
    /// `a=1, b="x y"`. A URL without a query gives no options.
    pub fn split_url(url: &str) -> Result<(String, Options), Error> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_string(), Options::new()));
        };
        let mut options = Options::new();
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            if key.is_empty() {
                return Err(Error::new(
                    Kind::Config,
                    format!("the URL query {query:?} has a parameter without a name"),
                ));
            }
            options.insert(key.into_owned(), value);
        }
        Ok((base.to_string(), options))
    }

    /// A reader of these options for `adapter` (its name appears in errors).
    pub fn reader(&self, adapter: &'static str) -> OptionReader<'_> {
        OptionReader {
            options: self,
            adapter,
            known: BTreeSet::new(),
            prefixes: BTreeSet::new(),
            renamed: Vec::new(),
        }
    }
}

/// The URL with its secrets shown as `***`: the password of its user info (`amqp://app:***@host/`)
/// and the value of every query parameter whose name says it is secret ([`is_secret`]:
/// `?sasl.password=***`), for logs and messages.
///
/// ```
/// use event_retry_core::options::redact_url;
/// assert_eq!(redact_url("amqp://app:s3cret@mq:5672/%2f"), "amqp://app:***@mq:5672/%2f");
/// assert_eq!(
///     redact_url("kafka://h:9093?sasl.username=app&sasl.password=s3cret"),
///     "kafka://h:9093?sasl.username=app&sasl.password=***"
/// );
/// assert_eq!(redact_url("kafka://h:9092"), "kafka://h:9092");
/// ```
pub fn redact_url(url: &str) -> String {
    let (url, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut out = redact_user_info(url);
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if is_secret(&decoded(key)) => format!("{key}=***"),
                _ => pair.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

/// A query key with its percent-escapes decoded (a secret's name hidden behind `%70assword` is
/// still a secret's name).
fn decoded(key: &str) -> String {
    form_urlencoded::parse(key.as_bytes())
        .next()
        .map(|(k, _)| k.into_owned())
        .unwrap_or_default()
}

fn redact_user_info(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) => {
            let user = user_info.split_once(':').map_or(user_info, |(u, _)| u);
            let shown = if user_info.contains(':') {
                format!("{user}:***")
            } else {
                user.to_string()
            };
            format!("{scheme}://{shown}@{host}{tail}")
        }
        None => url.to_string(),
    }
}

impl<K: Into<String>, V: ToString> FromIterator<(K, V)> for Options {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut options = Options::new();
        for (k, v) in iter {
            options.insert(k, v);
        }
        options
    }
}

/// Reads an adapter's keys from [`Options`], typed; [`OptionReader::finish`] refuses the keys nobody read.
#[derive(Debug)]
pub struct OptionReader<'a> {
    options: &'a Options,
    adapter: &'static str,
    known: BTreeSet<String>,
    prefixes: BTreeSet<&'static str>,
    /// Old names still read for a key, as (key, old name): see [`OptionReader::renamed`].
    renamed: Vec<(&'static str, &'static str)>,
}

impl OptionReader<'_> {
    fn invalid(&self, key: &str, value: &str, expected: &str) -> Error {
        let shown = if is_secret(key) { "***" } else { value };
        Error::new(
            Kind::Config,
            format!(
                "option {key}={shown:?} of the {} adapter: expected {expected}",
                self.adapter
            ),
        )
    }

    /// Reads `old` as the key `new` from now on (an option this adapter once named differently), with a
    /// deprecation warning when it is used; giving both is an error. Call it before reading `new`.
    ///
    /// ```
    /// use event_retry_core::options::Options;
    ///
    /// let o = Options::new().set("tick", "250ms");
    /// let mut read = o.reader("Apache Pulsar");
    /// read.renamed("tick", "granularity")?;
    /// let step = read.duration("granularity")?;
    /// assert_eq!(step, Some(std::time::Duration::from_millis(250)));
    /// read.finish()?; // `tick` counts as read
    /// let both = Options::new().set("tick", "1s").set("granularity", "1s");
    /// assert!(both.reader("Apache Pulsar").renamed("tick", "granularity").is_err());
    /// # Ok::<(), event_retry_core::error::Error>(())
    /// ```
    pub fn renamed(&mut self, old: &'static str, new: &'static str) -> Result<(), Error> {
        if self.options.get(old).is_none() {
            return Ok(());
        }
        self.known.insert(old.to_string());
        if self.options.get(new).is_some() {
            return Err(Error::new(
                Kind::Config,
                format!(
                    "options {old} and {new} of the {} adapter are one setting ({old} is its old \
                     name): give only {new}",
                    self.adapter
                ),
            ));
        }
        tracing::warn!(
            adapter = self.adapter,
            "option {old} is deprecated: it is now called {new}"
        );
        self.renamed.push((new, old));
        Ok(())
    }

    /// The value given for `key`, under its name or an old one.
    fn value(&self, key: &str) -> Option<&str> {
        self.options.get(key).or_else(|| {
            self.renamed
                .iter()
                .find(|(new, _)| *new == key)
                .and_then(|(_, old)| self.options.get(old))
        })
    }

    fn parsed<T>(
        &mut self,
        key: &'static str,
        expected: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<Option<T>, Error> {
        self.known.insert(key.to_string());
        match self.value(key) {
            None => Ok(None),
            Some(text) => parse(text.trim())
                .map(Some)
                .ok_or_else(|| self.invalid(key, text, expected)),
        }
    }

    /// The text of `key`.
    pub fn string(&mut self, key: &'static str) -> Option<String> {
        self.known.insert(key.to_string());
        self.value(key).map(str::to_string)
    }

    /// `key` as a duration: `250ms`, `5s`, `2m`, `1h`, `1d`, or a bare number of milliseconds.
    pub fn duration(&mut self, key: &'static str) -> Result<Option<Duration>, Error> {
        self.parsed(
            key,
            "a duration such as 250ms, 5s, 2m, 1h or 1d",
            crate::time::parse_duration,
        )
    }

    /// `key` as a boolean: `true`/`false`, `yes`/`no`, `on`/`off` or `1`/`0`.
    pub fn bool(&mut self, key: &'static str) -> Result<Option<bool>, Error> {
        self.parsed(key, "true or false", |t| {
            match t.to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" | "1" => Some(true),
                "false" | "no" | "off" | "0" => Some(false),
                _ => None,
            }
        })
    }

    /// `key` as a number (or anything else parsed with `FromStr`).
    pub fn number<T: FromStr>(&mut self, key: &'static str) -> Result<Option<T>, Error> {
        self.parsed(key, "a number", |t| t.parse().ok())
    }

    /// `key` as one of `choices` (compared without regard to case); returns the choice's index.
    pub fn choice(&mut self, key: &'static str, choices: &[&str]) -> Result<Option<usize>, Error> {
        let expected = format!("one of {}", choices.join(", "));
        self.parsed(key, &expected, |t| {
            choices.iter().position(|c| c.eq_ignore_ascii_case(t))
        })
    }

    /// `key` as a secret, given in at most one of three ways: inline as `key`, as `key_env` (the name of
    /// an environment variable holding it) or as `key_file` (a file holding it, one trailing line break
    /// removed). A secret never has to be written into a URL or a config file.
    ///
    /// ```
    /// use event_retry_core::options::Options;
    ///
    /// let o = Options::new().set("password_env", "PATH");
    /// let password = o.reader("RabbitMQ").secret("password")?.expect("given");
    /// assert_eq!(password.expose(), std::env::var("PATH").unwrap_or_default());
    /// # Ok::<(), event_retry_core::error::Error>(())
    /// ```
    pub fn secret(&mut self, key: &'static str) -> Result<Option<Secret>, Error> {
        let env_key = format!("{key}_env");
        let file_key = format!("{key}_file");
        let inline = self.value(key).map(Secret::new);
        let from_env = self.options.get(&env_key).map(str::to_string);
        let from_file = self.options.get(&file_key).map(str::to_string);
        let given = [inline.is_some(), from_env.is_some(), from_file.is_some()];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(Error::new(
                Kind::Config,
                format!(
                    "the {} adapter's secret {key} is given more than one way: set one of {key}, \
                     {env_key} and {file_key}",
                    self.adapter
                ),
            ));
        }
        self.known.insert(key.to_string());
        self.known.insert(env_key.clone());
        self.known.insert(file_key.clone());
        let with_key = |e: Error| {
            Error::new(
                e.kind(),
                format!(
                    "option {} of the {} adapter: {}",
                    key,
                    self.adapter,
                    e.message()
                ),
            )
        };
        if let Some(name) = from_env {
            return Secret::from_env(name.trim()).map(Some).map_err(with_key);
        }
        if let Some(path) = from_file {
            return Secret::from_file(path.trim()).map(Some).map_err(with_key);
        }
        Ok(inline)
    }

    /// Every key starting with `prefix`, with the prefix removed (settings passed through to the broker's
    /// client, such as `rdkafka.fetch.queue.backoff.ms`).
    pub fn prefixed(&mut self, prefix: &'static str) -> Vec<(String, String)> {
        self.prefixes.insert(prefix);
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for (k, v) in self.options.entries.iter().rev() {
            if let Some(rest) = k.strip_prefix(prefix)
                && seen.insert(rest)
            {
                out.push((rest.to_string(), v.clone()));
            }
        }
        out.reverse();
        out
    }

    /// Fails on a key that none of the reads above asked for, listing the keys this adapter knows.
    pub fn finish(self) -> Result<(), Error> {
        let unknown: Vec<&str> = self
            .options
            .entries
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| !self.known.contains(*k) && !self.prefixes.iter().any(|p| k.starts_with(p)))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let mut known: Vec<String> = self.known.iter().cloned().collect();
        known.extend(self.prefixes.iter().map(|p| format!("{p}*")));
        Err(Error::new(
            Kind::Config,
            format!(
                "unknown option{} {} for the {} adapter; it knows: {}",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", "),
                self.adapter,
                known.join(", ")
            ),
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_query_becomes_options_and_later_values_win() {
        let (url, o) = Options::split_url("amqp://h:5672/%2f?a=1&b=x%20y&a=2").unwrap();
        assert_eq!(url, "amqp://h:5672/%2f");
        assert_eq!(o.get("a"), Some("2"));
        assert_eq!(o.get("b"), Some("x y"));
        assert!(Options::split_url("kafka://h?=1").is_err());
        let (url, o) = Options::split_url("memory://").unwrap();
        assert_eq!(url, "memory://");
        assert!(o.is_empty());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let o = Options::new().set("granularty", "1s");
        let mut r = o.reader("Kafka");
        assert_eq!(r.duration("granularity").unwrap(), None);
        let e = r.finish().unwrap_err();
        assert_eq!(e.kind(), Kind::Config);
        assert!(e.to_string().contains("granularty"), "{e}");
        assert!(e.to_string().contains("knows: granularity"), "{e}");

        let o = Options::new().set("partitions", "four");
        let e = o.reader("Kafka").number::<u32>("partitions").unwrap_err();
        assert!(e.to_string().contains("partitions=\"four\""), "{e}");
        assert!(e.to_string().contains("a number"), "{e}");
    }

    #[test]
    fn prefixed_keys_pass_through_and_secrets_stay_hidden() {
        let o = Options::new()
            .set("rdkafka.fetch.wait.max.ms", "10")
            .set("sasl.password", "hunter2");
        let mut r = o.reader("Kafka");
        assert_eq!(
            r.prefixed("rdkafka."),
            vec![("fetch.wait.max.ms".to_string(), "10".to_string())]
        );
        assert!(r.string("sasl.password").is_some());
        r.finish().unwrap();
        let shown = format!("{o:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let e = o.reader("Kafka").bool("sasl.password").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn a_secret_comes_inline_from_a_variable_or_from_a_file_but_one_way_only() {
        let o = Options::new().set("password", "inline");
        assert_eq!(
            o.reader("RabbitMQ")
                .secret("password")
                .unwrap()
                .unwrap()
                .expose(),
            "inline"
        );
        let dir = std::env::temp_dir().join(format!("options-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "from-file\n").unwrap();
        let o = Options::new().set("password_file", file.display());
        let mut r = o.reader("RabbitMQ");
        assert_eq!(r.secret("password").unwrap().unwrap().expose(), "from-file");
        r.finish().unwrap();
        let o = Options::new()
            .set("password", "inline")
            .set("password_file", file.display());
        let e = o.reader("RabbitMQ").secret("password").unwrap_err();
        assert!(e.to_string().contains("more than one way"), "{e}");
        assert!(!e.to_string().contains("inline"), "{e}");
        let o = Options::new().set("password_env", "EVENT_RETRY_SURELY_UNSET_VARIABLE");
        let e = o.reader("RabbitMQ").secret("password").unwrap_err();
        assert!(
            e.to_string()
                .contains("option password of the RabbitMQ adapter"),
            "{e}"
        );
        assert_eq!(
            Options::new()
                .reader("RabbitMQ")
                .secret("password")
                .unwrap(),
            None
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn urls_lose_their_secrets_and_keep_the_rest() {
        assert_eq!(
            redact_url("amqps://app:pw@mq:5671/%2f?password=x&tls_ca=/ca.pem&token_file=/t"),
            "amqps://app:***@mq:5671/%2f?password=***&tls_ca=/ca.pem&token_file=***"
        );
        assert_eq!(
            redact_url("pulsar+ssl://h:6651?%74oken=abc"),
            "pulsar+ssl://h:6651?%74oken=***"
        );
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn choices_and_booleans() {
        let o = Options::new()
            .set("queue_type", "Quorum")
            .set("declare", "no");
        let mut r = o.reader("RabbitMQ");
        assert_eq!(
            r.choice("queue_type", &["classic", "quorum"]).unwrap(),
            Some(1)
        );
        assert_eq!(r.bool("declare").unwrap(), Some(false));
        r.finish().unwrap();
    }
}
