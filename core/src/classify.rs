//! Error classification: what kind of failure a handler error is, and therefore what the SDK does with it.
//!
//! A retry policy alone cannot tell a malformed order (retrying is pointless) from a database that is down
//! (retrying this one event is pointless too, but so is consuming the next one) from a record that is not yet
//! replicated (only this event must wait). The four [`FailureKind`]s name those cases. A handler can state the
//! kind itself ([`HandlerError::non_retryable`] and friends); for everything else a [`Classifier`] walks the
//! error's `source()` chain, outermost first, and stops at the first error it recognises — by registered type
//! (a downcast) or by message pattern (one database error type, many meanings) — falling back to a default.

use std::error::Error as StdError;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use regex::Regex;
use serde::{Deserialize, Serialize};

/// A boxed error as handlers produce it.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What kind of failure an error is; decides between DLQ, in-place retry, pausing and deferred retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Will fail again (bad payload, a bug): dead-letter at once.
    NonRetryable,
    /// Heals within seconds: retry inside the consumer a few times, then fall through to deferred.
    Transient,
    /// The service itself is unhealthy (a dependency is down): hold the event and pause consumption until it
    /// heals; never dead-lettered.
    Blocking,
    /// Only this event cannot proceed now: schedule it through the broker's delay mechanism; DLQ when the
    /// policy is spent.
    Deferred,
}

impl FailureKind {
    /// Every kind, in a stable order.
    pub const ALL: [FailureKind; 4] = [
        FailureKind::NonRetryable,
        FailureKind::Transient,
        FailureKind::Blocking,
        FailureKind::Deferred,
    ];

    /// The stable lowercase name used in metadata, config files and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::NonRetryable => "non_retryable",
            FailureKind::Transient => "transient",
            FailureKind::Blocking => "blocking",
            FailureKind::Deferred => "deferred",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text did not name a [`FailureKind`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown error kind {0:?}: expected non_retryable, transient, blocking or deferred (or NRE, SLE, SBE, SNBE)"
)]
pub struct UnknownFailureKind(pub String);

impl FromStr for FailureKind {
    type Err = UnknownFailureKind;

    /// Parses the stable names, and the Java article's abbreviations (NRE, SLE, SBE, SNBE).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "non_retryable" | "NRE" => Ok(FailureKind::NonRetryable),
            "transient" | "SLE" => Ok(FailureKind::Transient),
            "blocking" | "SBE" => Ok(FailureKind::Blocking),
            "deferred" | "SNBE" => Ok(FailureKind::Deferred),
            other => Err(UnknownFailureKind(other.to_string())),
        }
    }
}

/// An error wrapped with the kind its producer states; the classifier honours it wherever it sits in a
/// `source()` chain (so a library can mark its own errors, and a handler can re-mark a wrapped one).
#[derive(Debug)]
pub struct Classified {
    kind: FailureKind,
    inner: BoxError,
}

impl Classified {
    /// Wraps `error` with the stated `kind`.
    pub fn new(kind: FailureKind, error: impl Into<BoxError>) -> Self {
        Self {
            kind,
            inner: error.into(),
        }
    }

    /// The stated kind.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }
}

impl fmt::Display for Classified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

impl StdError for Classified {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(self.inner.as_ref())
    }
}

/// An error wrapped with the delay its producer chose for the next retry (`Retry-After`, a rate
/// limit's reset); the runtime honours it wherever it sits in a `source()` chain, bounded by the
/// policy ([`RetryPolicy::chosen_delay`](crate::policy::RetryPolicy::chosen_delay)).
#[derive(Debug)]
pub struct ChosenDelay {
    delay: Duration,
    inner: BoxError,
}

impl ChosenDelay {
    /// Wraps `error` with the delay it asks for.
    pub fn new(delay: Duration, error: impl Into<BoxError>) -> Self {
        Self {
            delay,
            inner: error.into(),
        }
    }

    /// The delay asked for.
    pub fn delay(&self) -> Duration {
        self.delay
    }
}

impl fmt::Display for ChosenDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

impl StdError for ChosenDelay {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(self.inner.as_ref())
    }
}

/// The error a handler returns. Any error converts into it with `?` (unclassified: the [`Classifier`]
/// decides); the constructors state the kind explicitly.
pub struct HandlerError {
    error: BoxError,
}

impl HandlerError {
    /// An error of the stated kind.
    pub fn new(kind: FailureKind, error: impl Into<BoxError>) -> Self {
        Self {
            error: Box::new(Classified::new(kind, error)),
        }
    }

    /// Will fail again: dead-letter at once.
    pub fn non_retryable(error: impl Into<BoxError>) -> Self {
        Self::new(FailureKind::NonRetryable, error)
    }

    /// Heals within seconds: retry in place first.
    pub fn transient(error: impl Into<BoxError>) -> Self {
        Self::new(FailureKind::Transient, error)
    }

    /// A dependency is down: hold this event and pause consumption until it heals.
    pub fn blocking(error: impl Into<BoxError>) -> Self {
        Self::new(FailureKind::Blocking, error)
    }

    /// Only this event must wait: retry later through the broker.
    pub fn deferred(error: impl Into<BoxError>) -> Self {
        Self::new(FailureKind::Deferred, error)
    }

    /// The same error, asking that the next retry wait `delay` (a 429's `Retry-After`, a rate
    /// limit's reset, a downstream that names when to come back) instead of the policy's delay.
    ///
    /// The retry still counts against the policy's retries and goes through the broker's delay
    /// mechanism like any other (never early); the delay is bounded by the policy's `max-delay=`, or
    /// its longest delay when it states none. A deferred or transient error is retried through the
    /// broker after it (a transient one skips its in-place retries: waiting in place would stall the
    /// consumer); a blocking error holds for it; a non-retryable error ignores it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use event_retry_core::classify::HandlerError;
    /// let e = HandlerError::deferred("rate limited").retry_after(Duration::from_secs(30));
    /// assert_eq!(e.chosen_delay(), Some(Duration::from_secs(30)));
    /// ```
    pub fn retry_after(self, delay: Duration) -> Self {
        Self {
            error: Box::new(ChosenDelay::new(delay, self.error)),
        }
    }

    /// [`retry_after`](Self::retry_after) from an HTTP `Retry-After` value: delay-seconds (`120`)
    /// or an HTTP date (`Wed, 21 Oct 2026 07:28:00 GMT`, a date already past meaning now). A value
    /// that is neither leaves the error as it was, so the policy decides.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use event_retry_core::classify::HandlerError;
    /// let e = HandlerError::deferred("429 Too Many Requests").retry_after_header("30");
    /// assert_eq!(e.chosen_delay(), Some(Duration::from_secs(30)));
    /// let e = HandlerError::deferred("429 Too Many Requests").retry_after_header("soon");
    /// assert_eq!(e.chosen_delay(), None);
    /// ```
    pub fn retry_after_header(self, value: &str) -> Self {
        match parse_retry_after(value, SystemTime::now()) {
            Some(delay) => self.retry_after(delay),
            None => self,
        }
    }

    /// The delay the error asks for ([`retry_after`](Self::retry_after)), if any error in its chain
    /// asks for one (the outermost wins).
    pub fn chosen_delay(&self) -> Option<Duration> {
        chain(self.as_error()).find_map(|e| e.downcast_ref::<ChosenDelay>().map(ChosenDelay::delay))
    }

    /// An error whose kind the classifier decides.
    pub fn unclassified(error: impl Into<BoxError>) -> Self {
        Self {
            error: error.into(),
        }
    }

    /// The error as a boxed error, keeping its stated kind (for middleware that passes errors on, such
    /// as a `tower` layer); [`HandlerError::unclassified`] turns it back.
    pub fn into_boxed(self) -> BoxError {
        self.error
    }

    /// The error, for walking its `source()` chain.
    pub fn as_error(&self) -> &(dyn StdError + 'static) {
        self.error.as_ref()
    }

    /// The kind the error states for itself, if any error in its chain does.
    pub fn stated_kind(&self) -> Option<FailureKind> {
        chain(self.as_error()).find_map(|e| e.downcast_ref::<Classified>().map(Classified::kind))
    }

    /// The error message with its causes, `outer: inner: innermost`, skipping the wrapper that only states
    /// a kind.
    pub fn message(&self) -> String {
        let mut out = String::new();
        for e in chain(self.as_error()) {
            if e.is::<Classified>() || e.is::<ChosenDelay>() {
                continue;
            }
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&e.to_string());
        }
        out
    }
}

impl<E: Into<BoxError>> From<E> for HandlerError {
    fn from(error: E) -> Self {
        Self::unclassified(error)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("kind", &self.stated_kind())
            .field("message", &self.message())
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

/// A `Retry-After` value at `now`: delay-seconds or an HTTP date (RFC 9110, section 10.2.3).
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Delay-seconds; more digits than a u64 holds is "a very long time", bounded by the policy.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Iterates an error and its `source()` chain, outermost first (at most 64 levels, so a cyclic chain
/// cannot loop for ever).
pub fn chain<'a>(
    error: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(error), |e: &&'a (dyn StdError + 'static)| {
        (*e).source()
    })
    .take(64)
}

type TypeTest = fn(&(dyn StdError + 'static)) -> bool;

/// An error's message, rendered on first use into a buffer reused across classifications.
struct Message<'a> {
    buf: &'a mut String,
    rendered: bool,
}

impl Message<'_> {
    fn render(&mut self, e: &(dyn StdError + 'static)) -> &str {
        if !self.rendered {
            use std::fmt::Write as _;
            self.buf.clear();
            let _ = write!(self.buf, "{e}");
            self.rendered = true;
        }
        self.buf
    }
}

thread_local! {
    static MESSAGE_BUFFER: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

fn is_type<E: StdError + 'static>(e: &(dyn StdError + 'static)) -> bool {
    e.is::<E>()
}

#[derive(Clone)]
struct Rule {
    type_test: Option<(TypeTest, &'static str)>,
    message: Option<Regex>,
    kind: FailureKind,
}

impl Rule {
    /// Whether the rule matches `e`; `message` holds `e`'s text once rendered, so the rules tried on one
    /// error render it at most once (into a reused buffer).
    fn matches(&self, e: &(dyn StdError + 'static), message: &mut Message<'_>) -> bool {
        if self.type_test.is_some_and(|(test, _)| !test(e)) {
            return false;
        }
        match &self.message {
            None => true,
            Some(re) => re.is_match(message.render(e)),
        }
    }
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("type", &self.type_test.map(|(_, name)| name))
            .field("message", &self.message.as_ref().map(Regex::as_str))
            .field("kind", &self.kind)
            .finish()
    }
}

/// A message pattern that is not a valid regular expression.
#[derive(Debug, thiserror::Error)]
#[error("invalid message pattern {pattern:?}: {source}")]
pub struct PatternError {
    pattern: String,
    #[source]
    source: regex::Error,
}

/// Classifies handler errors into [`FailureKind`]s.
///
/// For each error in the chain, outermost first: a kind stated with [`Classified`] wins; otherwise the rules
/// are tried in the order they were added, and the first match decides. If nothing in the chain matches,
/// the default applies ([`FailureKind::Deferred`] unless set).
///
/// ```
/// use event_retry_core::classify::{Classifier, FailureKind, HandlerError};
///
/// let classifier = Classifier::new()
///     .on_type::<std::num::ParseIntError>(FailureKind::NonRetryable)
///     .on_message("(?i)connection refused", FailureKind::Blocking)?
///     .default_kind(FailureKind::Deferred);
///
/// let parse = "x".parse::<i32>().unwrap_err();
/// assert_eq!(classifier.classify(&HandlerError::from(parse)), FailureKind::NonRetryable);
/// let down = std::io::Error::other("Connection refused (os error 111)");
/// assert_eq!(classifier.classify(&HandlerError::from(down)), FailureKind::Blocking);
/// // A kind the handler states wins over every rule.
/// assert_eq!(classifier.classify(&HandlerError::transient("timeout")), FailureKind::Transient);
/// # Ok::<(), event_retry_core::classify::PatternError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Classifier {
    rules: Vec<Rule>,
    default: FailureKind,
}

impl Default for Classifier {
    fn default() -> Self {
        Self::new()
    }
}

impl Classifier {
    /// A classifier with no rules and the default kind [`FailureKind::Deferred`].
    pub fn new() -> Self {
        Self {
            rules: Vec::new(),
            default: FailureKind::Deferred,
        }
    }

    /// Sets the kind for errors nothing else recognises.
    pub fn default_kind(mut self, kind: FailureKind) -> Self {
        self.default = kind;
        self
    }

    /// Classifies errors of type `E` (found anywhere in the chain) as `kind`.
    pub fn on_type<E: StdError + 'static>(mut self, kind: FailureKind) -> Self {
        self.rules.push(Rule {
            type_test: Some((is_type::<E>, std::any::type_name::<E>())),
            message: None,
            kind,
        });
        self
    }

    /// Classifies errors of type `E` whose message matches `pattern` as `kind`.
    pub fn on_type_message<E: StdError + 'static>(
        mut self,
        pattern: &str,
        kind: FailureKind,
    ) -> Result<Self, PatternError> {
        self.rules.push(Rule {
            type_test: Some((is_type::<E>, std::any::type_name::<E>())),
            message: Some(compile(pattern)?),
            kind,
        });
        Ok(self)
    }

    /// Classifies errors of any type whose message matches `pattern` (a regular expression) as `kind`.
    pub fn on_message(mut self, pattern: &str, kind: FailureKind) -> Result<Self, PatternError> {
        self.rules.push(Rule {
            type_test: None,
            message: Some(compile(pattern)?),
            kind,
        });
        Ok(self)
    }

    /// The kind of a handler error.
    pub fn classify(&self, error: &HandlerError) -> FailureKind {
        self.classify_error(error.as_error())
    }

    /// The kind of any error, by the rules above.
    pub fn classify_error(&self, error: &(dyn StdError + 'static)) -> FailureKind {
        MESSAGE_BUFFER.with_borrow_mut(|buf| {
            for e in chain(error) {
                if let Some(c) = e.downcast_ref::<Classified>() {
                    return c.kind();
                }
                if e.is::<ChosenDelay>() {
                    continue;
                }
                let mut message = Message {
                    buf: &mut *buf,
                    rendered: false,
                };
                if let Some(rule) = self.rules.iter().find(|r| r.matches(e, &mut message)) {
                    return rule.kind;
                }
            }
            self.default
        })
    }
}

fn compile(pattern: &str) -> Result<Regex, PatternError> {
    Regex::new(pattern).map_err(|source| PatternError {
        pattern: pattern.to_string(),
        source,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connection refused")]
    struct ConnectError;

    #[derive(Debug, thiserror::Error)]
    #[error("db error: {0}")]
    struct DbError(String);

    #[derive(Debug, thiserror::Error)]
    #[error("could not save order")]
    struct SaveError(#[source] BoxError);

    fn classifier() -> Classifier {
        Classifier::new()
            .on_type::<ConnectError>(FailureKind::Blocking)
            .on_type_message::<DbError>("statement timeout", FailureKind::Blocking)
            .unwrap()
            .on_type::<DbError>(FailureKind::NonRetryable)
            .on_message("(?i)not yet replicated", FailureKind::Deferred)
            .unwrap()
            .default_kind(FailureKind::Transient)
    }

    #[test]
    fn a_chosen_delay_keeps_the_kind_and_the_message() {
        let e = HandlerError::transient(DbError("busy".into())).retry_after(Duration::from_secs(7));
        assert_eq!(e.chosen_delay(), Some(Duration::from_secs(7)));
        assert_eq!(e.stated_kind(), Some(FailureKind::Transient));
        assert_eq!(e.message(), "db error: busy");
        assert_eq!(Classifier::new().classify(&e), FailureKind::Transient);
        // Through a middleware that boxes the error and back.
        let back = HandlerError::unclassified(e.into_boxed());
        assert_eq!(back.chosen_delay(), Some(Duration::from_secs(7)));
        // The outermost choice wins.
        let again = back.retry_after(Duration::from_secs(1));
        assert_eq!(again.chosen_delay(), Some(Duration::from_secs(1)));
        // Unstated: the classifier still decides, its rules still see the message.
        let e = HandlerError::unclassified(DbError("deadlock".into())).retry_after(Duration::ZERO);
        let c = Classifier::new()
            .on_message("deadlock", FailureKind::Transient)
            .unwrap();
        assert_eq!(c.classify(&e), FailureKind::Transient);
        assert_eq!(HandlerError::deferred("x").chosen_delay(), None);
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2026 07:28:00 GMT").unwrap();
        let at = |v| parse_retry_after(v, now);
        assert_eq!(at("120"), Some(Duration::from_secs(120)));
        assert_eq!(at(" 0 "), Some(Duration::ZERO));
        assert_eq!(
            at("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            at("Wed, 21 Oct 2026 07:28:30 GMT"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            at("Wed, 21 Oct 2026 07:00:00 GMT"),
            Some(Duration::ZERO),
            "a past date is now"
        );
        for bad in ["", "-5", "1.5", "soon", "30s", "Wed, 21 Oct 2026"] {
            assert_eq!(at(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn stated_kind_wins_over_rules() {
        let e = HandlerError::deferred(ConnectError);
        assert_eq!(e.stated_kind(), Some(FailureKind::Deferred));
        assert_eq!(classifier().classify(&e), FailureKind::Deferred);
        assert_eq!(e.message(), "connection refused");
    }

    #[test]
    fn walks_the_source_chain_by_type() {
        let e: HandlerError = SaveError(Box::new(ConnectError)).into();
        assert_eq!(e.stated_kind(), None);
        assert_eq!(classifier().classify(&e), FailureKind::Blocking);
        assert_eq!(e.message(), "could not save order: connection refused");
    }

    #[test]
    fn same_type_different_messages() {
        let c = classifier();
        let timeout: HandlerError =
            DbError("canceling statement due to statement timeout".into()).into();
        let constraint: HandlerError = DbError("duplicate key".into()).into();
        assert_eq!(c.classify(&timeout), FailureKind::Blocking);
        assert_eq!(c.classify(&constraint), FailureKind::NonRetryable);
    }

    #[test]
    fn message_pattern_and_default() {
        let c = classifier();
        let e = HandlerError::unclassified("row Not Yet Replicated");
        assert_eq!(c.classify(&e), FailureKind::Deferred);
        let other = HandlerError::unclassified("something else");
        assert_eq!(c.classify(&other), FailureKind::Transient);
        assert_eq!(
            Classifier::new().classify(&other),
            FailureKind::Deferred,
            "the default default is deferred"
        );
    }

    #[test]
    fn a_wrapped_classified_error_is_found_in_the_chain() {
        let inner = Classified::new(FailureKind::NonRetryable, DbError("bad".into()));
        let e: HandlerError = SaveError(Box::new(inner)).into();
        assert_eq!(classifier().classify(&e), FailureKind::NonRetryable);
    }

    #[test]
    fn bad_pattern_is_an_error() {
        let err = Classifier::new()
            .on_message("(unclosed", FailureKind::Blocking)
            .unwrap_err();
        assert!(err.to_string().contains("(unclosed"));
    }

    #[test]
    fn kinds_parse_by_name_and_abbreviation() {
        for kind in FailureKind::ALL {
            assert_eq!(kind.as_str().parse::<FailureKind>().unwrap(), kind);
        }
        assert_eq!("SBE".parse::<FailureKind>().unwrap(), FailureKind::Blocking);
        assert_eq!(
            "SNBE".parse::<FailureKind>().unwrap(),
            FailureKind::Deferred
        );
        assert!("fatal".parse::<FailureKind>().is_err());
    }
}
