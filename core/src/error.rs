//! The one error type of broker operations: connecting, publishing, consuming, settling, dead-letter
//! operations and administration.
//!
//! Code that reacts to an error branches on its [`Kind`] — never on its text — and asks
//! [`Error::is_temporary`] whether trying again can help. The message says what went wrong in words, the
//! operation says what was being attempted ("dead-letter to orders.dlq"), and the broker client's own
//! error stays reachable ([`Error::client_error`]), so nothing the client said is lost.
//!
//! Printed as a chain (`anyhow`'s `{:#}`, a tracing layer walking [`std::error::Error::source`]), each
//! text appears once: an error whose message quotes its client error's text hands out, as its source,
//! only what the message does not already say — the cause of the client error, or nothing when the
//! message quotes the client's whole chain.

use std::borrow::Cow;
use std::fmt;

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What kind of failure an [`Error`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// The broker could not be reached, or the connection broke.
    Connection,
    /// A topic, queue or entry does not exist.
    NotFound,
    /// The broker refused the operation or did not confirm it (an unwritable DLQ, a message too large).
    Rejected,
    /// The settings, URL or topology are wrong.
    Config,
    /// What was handed in is not valid (a payload that cannot be encoded, a header producers may not
    /// write).
    InvalidInput,
    /// The broker took longer than allowed to answer.
    Timeout,
    /// The transport or subscription was closed.
    Closed,
    /// The delivery was already settled.
    AlreadySettled,
    /// What was to be created exists already (a subscription, a topic).
    AlreadyExists,
    /// The broker or this adapter cannot do what was asked.
    Unsupported,
    /// The broker did not accept who we are or we did not trust it: wrong credentials, an untrusted or
    /// mismatched certificate, plaintext to a TLS port or TLS to a plaintext one. Never temporary: trying
    /// again with the same settings fails the same way.
    Security,
    /// Anything else the broker client reported.
    Other,
}

impl Kind {
    /// The kind's stable name (`connection`, `not_found`, …), for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Connection => "connection",
            Kind::NotFound => "not_found",
            Kind::Rejected => "rejected",
            Kind::Config => "config",
            Kind::InvalidInput => "invalid_input",
            Kind::Timeout => "timeout",
            Kind::Closed => "closed",
            Kind::AlreadySettled => "already_settled",
            Kind::AlreadyExists => "already_exists",
            Kind::Unsupported => "unsupported",
            Kind::Security => "security",
            Kind::Other => "other",
        }
    }

    /// Whether an error of this kind usually heals when tried again later.
    fn temporary_by_default(self) -> bool {
        matches!(self, Kind::Connection | Kind::Timeout)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error from a broker, its client, or the adapter's own checks.
///
/// ```
/// use event_retry_core::error::{Error, Kind};
///
/// let e = Error::new(Kind::Rejected, "the DLQ is not writable").with_operation("dead-letter to orders.dlq");
/// assert_eq!(e.kind(), Kind::Rejected);
/// assert!(!e.is_temporary());
/// assert_eq!(e.to_string(), "dead-letter to orders.dlq: the DLQ is not writable");
/// ```
pub struct Error {
    kind: Kind,
    message: Cow<'static, str>,
    operation: Option<Cow<'static, str>>,
    temporary: bool,
    source: Option<Source>,
    quoted: Quoted,
}

/// How much of the client error's chain the message already quotes; [`std::error::Error::source`] hands
/// out the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Quoted {
    /// Nothing: the source is the next link of the chain.
    Nothing,
    /// The client error's own text: its cause is the next link.
    Itself,
    /// The client error's text and every cause's: the chain ends here.
    Chain,
}

impl Error {
    /// An error of `kind` with a message in words.
    pub fn new(kind: Kind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            message: message.into(),
            operation: None,
            temporary: kind.temporary_by_default(),
            source: None,
            quoted: Quoted::Nothing,
        }
    }

    /// An error of `kind` caused by a client error: the message is the client's text, and the client
    /// error stays reachable ([`Error::client_error`]); the chain goes on with the client error's cause.
    pub fn from_source(kind: Kind, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::new(kind, source.to_string()).with_quoted_source(source)
    }

    /// Names what was being attempted (shown before the message).
    pub fn with_operation(mut self, operation: impl Into<Cow<'static, str>>) -> Self {
        self.operation = Some(operation.into());
        self
    }

    /// Keeps the client's error as the source: the next link of the chain, for a message that does not
    /// quote it.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self.quoted = Quoted::Nothing;
        self
    }

    /// Keeps the client's error, for a message that quotes its text: the chain goes on with the client
    /// error's cause, so no text is printed twice.
    pub fn with_quoted_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        self.source = Some(Box::new(source));
        self.quoted = Quoted::Itself;
        self
    }

    /// Keeps the client's error, for a message that quotes its whole chain (the client error's text and
    /// every cause's): the chain ends with this error.
    pub fn with_quoted_chain(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        self.source = Some(Box::new(source));
        self.quoted = Quoted::Chain;
        self
    }

    /// Overrides whether trying again later can help (by default: for connection and timeout errors).
    pub fn temporary(mut self, temporary: bool) -> Self {
        self.temporary = temporary;
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// What was being attempted, if known.
    pub fn operation(&self) -> Option<&str> {
        self.operation.as_deref()
    }

    /// The message, without the operation.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The broker client's own error, if there was one (to downcast to the client's type), whether or
    /// not the message quotes it.
    pub fn client_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }

    /// Whether trying the operation again later can help.
    pub fn is_temporary(&self) -> bool {
        self.temporary
    }

    /// The delivery was already settled.
    pub fn already_settled() -> Self {
        Self::new(Kind::AlreadySettled, "the delivery was already settled")
    }

    /// The transport or subscription is closed.
    pub fn closed() -> Self {
        Self::new(Kind::Closed, "the transport is closed")
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.operation {
            Some(op) => write!(f, "{op}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind);
        if let Some(op) = &self.operation {
            d.field("operation", op);
        }
        d.field("message", &self.message)
            .field("temporary", &self.temporary);
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let client = self.source.as_deref()?;
        match self.quoted {
            Quoted::Nothing => Some(client as &(dyn std::error::Error + 'static)),
            Quoted::Itself => client.source(),
            Quoted::Chain => None,
        }
    }
}

/// A `map_err` helper: turns a client error into an [`Error`] of `kind` for `operation`.
///
/// ```
/// use event_retry_core::error::{Kind, wrap};
///
/// let io = std::io::Error::other("broken pipe");
/// let e = Err::<(), _>(io).map_err(wrap(Kind::Connection, "publish to orders")).unwrap_err();
/// assert_eq!(e.to_string(), "publish to orders: broken pipe");
/// assert!(e.is_temporary());
/// ```
pub fn wrap<E>(kind: Kind, operation: impl Into<Cow<'static, str>>) -> impl FnOnce(E) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    let operation = operation.into();
    move |e| Error::from_source(kind, e).with_operation(operation)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// A client error with a cause, as broker clients nest them (an I/O error inside a protocol error).
    #[derive(Debug)]
    struct ClientError(std::io::Error);

    impl fmt::Display for ClientError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("protocol error")
        }
    }

    impl std::error::Error for ClientError {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn printed_chain(e: &Error) -> String {
        crate::classify::chain(e)
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" | ")
    }

    #[test]
    fn the_client_error_is_kept_and_temporary_follows_the_kind() {
        let e = Error::from_source(Kind::Connection, std::io::Error::other("reset"))
            .with_operation("consume orders");
        assert_eq!(e.to_string(), "consume orders: reset");
        assert!(e.is_temporary());
        assert_eq!(e.client_error().unwrap().to_string(), "reset");
        assert!(
            e.client_error()
                .unwrap()
                .downcast_ref::<std::io::Error>()
                .is_some()
        );
        let e = Error::new(Kind::NotFound, "no such queue");
        assert!(!e.is_temporary());
        assert!(e.source().is_none() && e.client_error().is_none());
        assert!(
            Error::new(Kind::Rejected, "x")
                .temporary(true)
                .is_temporary()
        );
    }

    #[test]
    fn a_printed_chain_shows_each_text_once() {
        let client = || ClientError(std::io::Error::other("connection reset"));
        let quoted = Error::from_source(Kind::Connection, client()).with_operation("publish to a");
        assert_eq!(
            printed_chain(&quoted),
            "publish to a: protocol error | connection reset"
        );
        let cause =
            Error::new(Kind::Security, "the broker refused the login").with_source(client());
        assert_eq!(
            printed_chain(&cause),
            "the broker refused the login | protocol error | connection reset"
        );
        let whole = Error::new(Kind::Rejected, "protocol error: connection reset")
            .with_quoted_chain(client());
        assert_eq!(printed_chain(&whole), "protocol error: connection reset");
        assert!(whole.client_error().unwrap().is::<ClientError>());
        // Wrapped again, the outer error quotes the inner one's text and goes on with its chain.
        let outer = Error::from_source(Kind::Connection, quoted).with_operation("retry");
        assert_eq!(
            printed_chain(&outer),
            "retry: publish to a: protocol error | connection reset"
        );
    }

    #[test]
    fn kinds_have_stable_names() {
        assert_eq!(Kind::NotFound.to_string(), "not_found");
        assert_eq!(Error::already_settled().kind(), Kind::AlreadySettled);
        assert_eq!(Error::closed().kind(), Kind::Closed);
    }
}
