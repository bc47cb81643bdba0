//! The outbox's one error type.
//!
//! Callers branch on the variant: a [`OutboxError::Forbidden`] transition is an operator mistake to show,
//! a [`OutboxError::Database`] error is the database's own (kept as the source), and
//! [`OutboxError::InvalidInput`] is what a caller handed in (a topic that is empty, a header in the SDK's
//! namespace), refused before anything was written.

use event_retry_core::error::Kind;

use crate::lifecycle::Forbidden;

/// An error from the outbox: its database, its input, or its lifecycle rules.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The database refused or failed the statement (`operation` says which).
    #[error("{operation}: {source}")]
    Database {
        /// What was being done.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// The input is not valid; nothing was written.
    #[error("{0}")]
    InvalidInput(String),
    /// The lifecycle does not allow this transition.
    #[error("{subject}: {forbidden}")]
    Forbidden {
        /// What was refused (`row 5`, `rows in state PENDING`).
        subject: String,
        /// The refused transition.
        #[source]
        forbidden: Forbidden,
    },
    /// No row has this id.
    #[error("no outbox row {0}")]
    NotFound(String),
    /// The settings or URL are wrong.
    #[error("{0}")]
    Config(String),
}

impl OutboxError {
    /// What kind of failure this is, in the SDK's terms: a database that does not trust us or that we
    /// do not trust (a certificate from another CA, a server without TLS when the URL asks for it,
    /// wrong credentials) is [`Kind::Security`] — never temporary; one that cannot be reached is
    /// [`Kind::Connection`].
    pub fn kind(&self) -> Kind {
        match self {
            OutboxError::Database { source, .. } => database_kind(source),
            OutboxError::InvalidInput(_) => Kind::InvalidInput,
            OutboxError::Forbidden { .. } => Kind::Rejected,
            OutboxError::NotFound(_) => Kind::NotFound,
            OutboxError::Config(_) => Kind::Config,
        }
    }

    /// A `map_err` helper for driver errors.
    pub(crate) fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> OutboxError {
        move |source| OutboxError::Database { operation, source }
    }
}

/// The kind of a driver error.
fn database_kind(error: &sqlx::Error) -> Kind {
    match error {
        sqlx::Error::Tls(_) => Kind::Security,
        sqlx::Error::Io(io) if tls_failed(io) => Kind::Security,
        sqlx::Error::Io(_) => Kind::Connection,
        sqlx::Error::Configuration(_) => Kind::Config,
        sqlx::Error::PoolTimedOut => Kind::Timeout,
        sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => Kind::Closed,
        sqlx::Error::RowNotFound => Kind::NotFound,
        sqlx::Error::Database(e) => match e.code().as_deref() {
            // invalid_authorization_specification (no pg_hba.conf entry, as for plaintext to a server
            // that requires TLS), invalid_password.
            Some("28000" | "28P01") => Kind::Security,
            Some(code) if code.starts_with("08") => Kind::Connection,
            Some("57P01" | "57P02" | "57P03" | "53300") => Kind::Connection,
            // Passing: a deadlock or serialization failure (class 40), a lock not available, a
            // statement cancelled by its timeout; SQLite's BUSY and LOCKED (5, 6 and their extended
            // codes, which keep the primary code in the low byte).
            Some(code) if code.starts_with("40") => Kind::Timeout,
            Some("55P03" | "57014") => Kind::Timeout,
            Some(code) if sqlite_busy(code) => Kind::Timeout,
            _ => Kind::Rejected,
        },
        _ => Kind::Other,
    }
}

/// Whether a SQLite result code is BUSY (5) or LOCKED (6), primary or extended.
fn sqlite_busy(code: &str) -> bool {
    code.parse::<u32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
}

/// Whether an I/O error is a TLS handshake's failure (rustls reports it as an I/O error carrying its
/// own: an untrusted certificate, a name that does not match, a protocol the server refused).
fn tls_failed(io: &std::io::Error) -> bool {
    #[cfg(feature = "postgres")]
    {
        io.get_ref()
            .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = io;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(source: sqlx::Error) -> OutboxError {
        OutboxError::Database {
            operation: "connect to the database",
            source,
        }
    }

    #[test]
    fn trust_and_reach_are_told_apart() {
        assert_eq!(
            db(sqlx::Error::Tls("server does not support TLS".into())).kind(),
            Kind::Security
        );
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(db(sqlx::Error::Io(refused)).kind(), Kind::Connection);
        #[cfg(feature = "postgres")]
        {
            let untrusted = std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
            );
            assert_eq!(db(sqlx::Error::Io(untrusted)).kind(), Kind::Security);
        }
        assert_eq!(db(sqlx::Error::PoolTimedOut).kind(), Kind::Timeout);
        assert!(sqlite_busy("5") && sqlite_busy("517") && sqlite_busy("262"));
        assert!(!sqlite_busy("2067") && !sqlite_busy("23505"));
        assert_eq!(OutboxError::Config("x".into()).kind(), Kind::Config);
    }
}
