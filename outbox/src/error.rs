//! The outbox's one error type.
//!
//! Callers branch on the variant: a [`OutboxError::Forbidden`] transition is an operator mistake to show,
//! a [`OutboxError::Database`] error is the database's own (kept as the source), and
//! [`OutboxError::InvalidInput`] is what a caller handed in (a topic that is empty, a header in the SDK's
//! namespace), refused before anything was written.

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
    /// A `map_err` helper for driver errors.
    pub(crate) fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> OutboxError {
        move |source| OutboxError::Database { operation, source }
    }
}
