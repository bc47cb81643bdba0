//! Why a policy could not be made: built from code with a value it cannot hold ([`PolicyError`]), or
//! parsed from text that is not the DSL ([`PolicyParseError`], with where and what was expected).
//!
//! Separate from the policy because these are what a user reads when a policy is refused — at start-up,
//! in a config check, in `retryctl` — and their wording is a contract of its own.

use std::time::Duration;

/// Why a policy could not be built from code ([`RetryPolicy::steps`](super::RetryPolicy::steps),
/// [`RetryPolicy::exponential`](super::RetryPolicy::exponential)).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A step policy was given no steps.
    #[error("a step policy needs at least one step")]
    NoSteps,
    /// A step had a repeat count of zero.
    #[error("step {index} has a repeat count of 0; counts must be at least 1")]
    ZeroCount {
        /// The 0-based position of the step.
        index: usize,
    },
    /// A step policy's repeat counts add up to more retries than a `u32` counts.
    #[error("the steps allow {total} retries in all; at most 4294967295 are possible")]
    TooManyRetries {
        /// The sum of the steps' repeat counts.
        total: u64,
    },
    /// An exponential policy was given `Some(0)` retries.
    #[error("an exponential policy needs at least 1 retry (use None for no limit)")]
    ZeroRetries,
    /// An exponential policy's initial delay was zero.
    #[error("the initial delay of an exponential policy must be greater than 0")]
    ZeroInitial,
    /// An exponential policy's initial delay exceeded its cap.
    #[error("the initial delay ({initial:?}) must not exceed the cap ({cap:?})")]
    InitialExceedsCap {
        /// The initial delay given.
        initial: Duration,
        /// The cap given.
        cap: Duration,
    },
    /// The growth factor was below 1.0, infinite or NaN.
    #[error("the growth factor must be a finite number of at least 1.0, got {0}")]
    InvalidFactor(f64),
    /// A duration was not a whole number of milliseconds fitting in a `u64`.
    #[error("durations must be whole milliseconds (at most u64::MAX ms), got {0:?}")]
    NotWholeMillis(Duration),
}

/// Why a policy string did not parse: where, what was expected there and what
/// was found instead.
///
/// `Display` reads `column 6: expected a repeat count after 'x', found end of
/// input`; [`PolicyParseError::render`] adds the input and a caret under the
/// column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {column}: expected {expected}, found {found}")]
pub struct PolicyParseError {
    pub(super) input: String,
    pub(super) column: usize,
    pub(super) expected: String,
    pub(super) found: String,
}

impl PolicyParseError {
    /// The 1-based character column of the error in the input.
    pub fn column(&self) -> usize {
        self.column
    }

    /// What the parser expected at [`column`](Self::column), e.g.
    /// `a repeat count after 'x'`.
    pub fn expected(&self) -> &str {
        &self.expected
    }

    /// What was there instead: a quoted token or character, or `end of input`.
    pub fn found(&self) -> &str {
        &self.found
    }

    /// The input that failed to parse.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// A multi-line rendering for humans: the input, a caret under the
    /// offending column, then the message.
    ///
    /// ```text
    /// 5000x
    ///      ^
    /// column 6: expected a repeat count after 'x', found end of input
    /// ```
    pub fn render(&self) -> String {
        let line: String = self
            .input
            .chars()
            .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
            .collect();
        // Keep tabs in the caret line so the caret stays under the column.
        let pad: String = self
            .input
            .chars()
            .take(self.column.saturating_sub(1))
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        format!("{line}\n{pad}^\n{self}")
    }
}
