//! Why a consumer could not be built, started, or stopped cleanly.
//!
//! Separate from the builder because every stage of a consumer's life returns it — the builder's
//! checks, the start, the receive loop and the handle that waits for the end — and none of them should
//! need another to name its error.

use std::time::Duration;

use crate::check::DelayReport;
use crate::config::ConfigError;
use crate::error::Error;

/// Why a consumer could not be built, started, or stopped cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The broker cannot honour a delay of the policy.
    #[error("the {transport} transport cannot honour this retry policy:\n{report}")]
    PolicyRefused {
        /// The broker's name.
        transport: &'static str,
        /// The full report.
        report: DelayReport,
    },
    /// The broker cannot do what the consumer asks for (per-key order on a broker without it).
    #[error("the {transport} transport cannot {what}")]
    Unsupported {
        /// The broker's name.
        transport: &'static str,
        /// What it cannot do.
        what: &'static str,
    },
    /// A setting is invalid (an empty topic name).
    #[error("invalid consumer settings: {0}")]
    Invalid(String),
    /// The config file could not be applied.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The broker failed.
    #[error(transparent)]
    Broker(#[from] Error),
    /// Receiving failed again and again with an error trying again cannot heal (wrong credentials, a
    /// deleted queue): the consumer stopped instead of retrying for ever.
    #[error("receiving failed {failures} times in a row over {}s with a permanent error; the consumer stopped: {last}", .over.as_secs())]
    ReceiveFailed {
        /// Failures in a row.
        failures: u32,
        /// The time from the first of them to the last.
        over: Duration,
        /// The last error.
        #[source]
        last: Error,
    },
    /// The consumer's task ended abnormally (it panicked, or its runtime shut down).
    #[error("the consumer task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}
