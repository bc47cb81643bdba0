//! Retry policies: the one-line DSL that configures them, its parser, its
//! canonical text, and the delays a policy asks for before each retry.
//!
//! # Why a DSL
//!
//! A retry policy is operational configuration: it is changed by whoever runs
//! the consumer, often under pressure, and it travels through environment
//! variables, config files, CLI flags and message metadata. One short string
//! (`5s x3, 10s x5` or `exp(500ms, 1m, 2, 6); jitter=full`) survives all of
//! those, reads the same in a log line as in a config file, and needs no code
//! change to adjust.
//!
//! # The grammar
//!
//! ```text
//! policy   := body (";" option)*
//! body     := steps
//!           | "exp(" initial "," cap "," factor ["," retries] ")"
//!           | "FixedDelayRetryPolicy(" steps ")"
//!           | "LimitedExponentialRetryPolicy(" initial "," cap "," factor "," retries ")"
//!           | "UnlimitedExponentialRetryPolicy(" initial "," cap "," factor ")"
//! steps    := step ("," step)*
//! step     := duration [("x" | "X") count]
//! option   := "jitter=" ("none" | "full" | "equal" | "decorrelated" | ["±" | "+-"] N "%")
//!           | "max-elapsed=" duration
//!           | "max-delay=" duration
//! duration := integer ["ms" | "s" | "m" | "h" | "d"]      (bare integer = milliseconds)
//! ```
//!
//! Whitespace is allowed between any two tokens. Counts, retries and jitter
//! percentages must be at least 1; a zero delay is allowed in steps (retry at
//! once) and as a budget, but not as the initial delay of an exponential
//! schedule, which must also not exceed the cap. The `…RetryPolicy` forms
//! exist so that teams coming from the well-known Java article can paste what
//! they already have; they parse to the same policies as the short forms and
//! print in the short forms.
//!
//! # Canonical text
//!
//! [`RetryPolicy`]'s `Display` prints the canonical form: every duration in the
//! largest unit that divides it exactly, counts of 1 without `x1`, options in a
//! fixed order and `jitter=none` left out. Parsing the canonical text gives back
//! an equal policy, which is why all durations are kept on a whole-millisecond
//! grid and the growth factor is printed with `f64`'s round-tripping `Display`.
//! Serde (de)serializes a policy as this text.
//!
//! # Delays and jitter
//!
//! [`RetryPolicy::nominal_delay`] is the delay the schedule asks for;
//! [`RetryPolicy::delay`] applies the jitter with a caller-supplied random
//! number generator, so a seeded generator gives reproducible delays in tests.
//! [`RetryPolicy::max_delay`] and [`RetryPolicy::longest_delay`] are sound
//! upper bounds of what `delay` can return, for checking a policy against a
//! broker's largest supported delay before any message is consumed. Jitter is
//! computed in whole milliseconds.
//!
//! # A delay the handler chooses
//!
//! A handler that knows when to come back (a 429 with `Retry-After: 30`, a
//! rate limit's reset) says so on its error
//! ([`HandlerError::retry_after`](crate::classify::HandlerError::retry_after)).
//! That retry still counts against the policy; its delay is the one asked for,
//! without jitter, bounded by `max-delay=` ([`RetryPolicy::chosen_delay`]) or,
//! when the policy states none, by its schedule's longest delay — so an
//! upstream that answers `Retry-After: 86400` cannot park an event for a day
//! unless the policy says it may. `longest_delay` includes the bound, so the
//! start-up check covers every delay a handler can choose.

pub(crate) mod duration;
mod error;
mod parse;
mod text;

pub use error::{PolicyError, PolicyParseError};

use std::time::Duration;

use rand::Rng;

use self::duration::{millis, whole_millis};

/// A policy per topic, with a default: what a consumer subscribed to several topics retries by.
pub use crate::decide::Policies;

/// A parsed or built retry policy: when to retry, how often, with what jitter
/// and within what total time budget.
///
/// Build one with [`RetryPolicy::parse`] (or `str::parse`),
/// [`RetryPolicy::steps`] or [`RetryPolicy::exponential`]. Its `Display` is the
/// canonical DSL text, which parses back to an equal policy.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    schedule: Schedule,
    jitter: Jitter,
    max_elapsed: Option<Duration>,
    max_chosen_delay: Option<Duration>,
}

/// The nominal delays of a policy, before jitter.
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// Fixed delays: each step's delay is used for `count` consecutive retries,
    /// then the next step takes over; the policy is spent after the last step.
    Steps(Vec<Step>),
    /// Exponential backoff: the delay before retry `i` (0-based) is
    /// `min(cap, initial * factor^i)`, rounded to the nearest millisecond.
    Exponential {
        /// Delay before the first retry; greater than zero.
        initial: Duration,
        /// Largest nominal delay; at least `initial`.
        cap: Duration,
        /// Growth per retry; finite and at least 1.0.
        factor: f64,
        /// Number of retries, or `None` for no limit.
        retries: Option<u32>,
    },
}

/// One fixed-delay step: `count` retries, each preceded by `delay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The wait before each retry of this step (zero means retry at once).
    pub delay: Duration,
    /// How many retries use this delay; at least 1.
    pub count: u32,
}

/// How a nominal delay `d` is randomised, so that many consumers failing at
/// once do not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Jitter {
    /// No randomisation: the delay is `d`.
    #[default]
    None,
    /// Uniform in `[0, d]`.
    Full,
    /// `d/2` plus uniform in `[0, d/2]`, so always at least half of `d` (in
    /// whole milliseconds, rounded down) and at most `d`.
    Equal,
    /// AWS-style decorrelated jitter: uniform in `[base, max(base, 3 * previous)]`,
    /// capped. For exponential schedules `base` is `initial` and the cap is
    /// `cap` (the exponential curve itself is then not used, as in the AWS
    /// formulation); for steps `base` is the step's delay and the cap is three
    /// times the step's delay.
    Decorrelated,
    /// `d` plus or minus a uniform amount of up to `N`% of `d` (`0 < N <= 100`),
    /// never negative.
    Percent(u8),
}

/// One row of [`RetryPolicy::explain`]: a retry, its nominal delay and the
/// nominal time since the first failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleRow {
    /// The retry number, starting at 1.
    pub retry: u32,
    /// The delivery attempt this retry is (`retry + 1`: attempt 1 is the
    /// original delivery).
    pub attempt: u32,
    /// The nominal wait before this retry.
    pub delay: Duration,
    /// The sum of the nominal waits up to and including this retry.
    pub cumulative: Duration,
}

impl RetryPolicy {
    /// Parses a policy from its DSL text (see the [module docs](self)).
    pub fn parse(input: &str) -> Result<Self, PolicyParseError> {
        parse::parse_policy(input)
    }

    /// A fixed-delay policy from its steps.
    ///
    /// Fails if there are no steps, a count is zero, the counts add up to more
    /// than `u32::MAX` retries, or a delay is not a whole number of
    /// milliseconds.
    pub fn steps(steps: Vec<Step>) -> Result<Self, PolicyError> {
        if steps.is_empty() {
            return Err(PolicyError::NoSteps);
        }
        let mut total = 0u64;
        for (index, step) in steps.iter().enumerate() {
            if step.count == 0 {
                return Err(PolicyError::ZeroCount { index });
            }
            check_millis(step.delay)?;
            total += u64::from(step.count);
        }
        if total > u64::from(u32::MAX) {
            return Err(PolicyError::TooManyRetries { total });
        }
        Ok(Self::from_schedule(Schedule::Steps(steps)))
    }

    /// An exponential-backoff policy; `retries: None` retries without limit.
    ///
    /// Fails if `initial` is zero or exceeds `cap`, `factor` is not a finite
    /// number of at least 1.0, `retries` is `Some(0)`, or a duration is not a
    /// whole number of milliseconds.
    pub fn exponential(
        initial: Duration,
        cap: Duration,
        factor: f64,
        retries: Option<u32>,
    ) -> Result<Self, PolicyError> {
        check_millis(initial)?;
        check_millis(cap)?;
        if initial.is_zero() {
            return Err(PolicyError::ZeroInitial);
        }
        if initial > cap {
            return Err(PolicyError::InitialExceedsCap { initial, cap });
        }
        if !factor.is_finite() || factor < 1.0 {
            return Err(PolicyError::InvalidFactor(factor));
        }
        if retries == Some(0) {
            return Err(PolicyError::ZeroRetries);
        }
        Ok(Self::from_schedule(Schedule::Exponential {
            initial,
            cap,
            factor,
            retries,
        }))
    }

    pub(crate) fn from_schedule(schedule: Schedule) -> Self {
        Self {
            schedule,
            jitter: Jitter::None,
            max_elapsed: None,
            max_chosen_delay: None,
        }
    }

    /// The same policy with the given jitter.
    ///
    /// A `Percent` outside `1..=100` is clamped into that range, so that the
    /// policy stays printable and parseable.
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = match jitter {
            Jitter::Percent(n) => Jitter::Percent(n.clamp(1, 100)),
            other => other,
        };
        self
    }

    /// The same policy with a total time budget, measured from the event's
    /// first failure (first seen). The policy only stores it; the runtime
    /// enforces it.
    ///
    /// The budget is truncated to whole milliseconds (saturating at
    /// `u64::MAX` ms) so that it prints exactly.
    pub fn with_max_elapsed(mut self, budget: Duration) -> Self {
        self.max_elapsed = Some(Duration::from_millis(millis(budget)));
        self
    }

    /// The same policy with a bound on the delay a handler's error may choose
    /// ([`HandlerError::retry_after`](crate::classify::HandlerError::retry_after)),
    /// `max-delay=` in the DSL. Without one, a chosen delay is bounded by the
    /// schedule's [`longest_delay`](Self::longest_delay).
    ///
    /// Truncated to whole milliseconds (saturating at `u64::MAX` ms) so that it
    /// prints exactly.
    pub fn with_max_chosen_delay(mut self, bound: Duration) -> Self {
        self.max_chosen_delay = Some(Duration::from_millis(millis(bound)));
        self
    }

    /// The stated bound on a handler-chosen delay (`max-delay=`), if any.
    pub fn max_chosen_delay(&self) -> Option<Duration> {
        self.max_chosen_delay
    }

    /// The delay a retry waits when the handler's error asked for `requested`:
    /// `requested`, bounded by [`max_chosen_delay`](Self::max_chosen_delay) or,
    /// without one, by the schedule's longest delay. No jitter is applied: the
    /// handler named a time, and the retry is never earlier than it (up to the
    /// bound).
    pub fn chosen_delay(&self, requested: Duration) -> Duration {
        let bound = self
            .max_chosen_delay
            .unwrap_or_else(|| self.schedule_longest_delay());
        requested.min(bound)
    }

    /// The nominal schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The jitter applied by [`delay`](Self::delay).
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The total time budget, if any.
    pub fn max_elapsed(&self) -> Option<Duration> {
        self.max_elapsed
    }

    /// How many retries the policy allows; `None` means no limit. A step
    /// policy's counts add up to at most `u32::MAX` (longer ones are refused
    /// when built or parsed).
    pub fn max_retries(&self) -> Option<u32> {
        match &self.schedule {
            Schedule::Steps(steps) => Some(
                steps
                    .iter()
                    .fold(0u32, |sum, step| sum.saturating_add(step.count)),
            ),
            Schedule::Exponential { retries, .. } => *retries,
        }
    }

    /// How many delivery attempts the policy allows (the first delivery plus
    /// the retries); `None` means no limit. Saturates at `u32::MAX`.
    pub fn max_attempts(&self) -> Option<u32> {
        self.max_retries().map(|retries| retries.saturating_add(1))
    }

    /// The delay before the 0-based retry `retry`, without jitter, or `None`
    /// when the policy is spent.
    ///
    /// Runs in time proportional to the number of steps, whatever the counts.
    pub fn nominal_delay(&self, retry: u32) -> Option<Duration> {
        self.nominal_millis(retry).map(Duration::from_millis)
    }

    /// The delay before the 0-based retry `retry` with jitter applied, or
    /// `None` when the policy is spent.
    ///
    /// `previous` is the delay actually used before the previous retry; only
    /// [`Jitter::Decorrelated`] uses it, and takes the base delay when it is
    /// `None`. The result is deterministic for a seeded `rng`, and never
    /// exceeds [`max_delay`](Self::max_delay).
    pub fn delay(
        &self,
        retry: u32,
        previous: Option<Duration>,
        rng: &mut dyn rand::RngCore,
    ) -> Option<Duration> {
        let d = self.nominal_millis(retry)?;
        let ms = match self.jitter {
            Jitter::None => d,
            Jitter::Full => rng.random_range(0..=d),
            Jitter::Equal => d / 2 + rng.random_range(0..=d - d / 2),
            Jitter::Percent(n) => {
                let spread = percent_of(d, n);
                rng.random_range(d - spread..=d.saturating_add(spread))
            }
            Jitter::Decorrelated => {
                let (base, cap) = self.decorrelated_bounds(d);
                let previous = previous.map_or(base, millis);
                let high = base.max(previous.saturating_mul(3));
                rng.random_range(base..=high).min(cap)
            }
        };
        Some(Duration::from_millis(ms))
    }

    /// An upper bound of [`delay`](Self::delay) for the 0-based retry `retry`,
    /// whatever the random draw and `previous`; `None` when the policy is
    /// spent.
    ///
    /// This is the nominal delay, plus `N`% for `Percent(N)`, or the
    /// decorrelated cap (see [`Jitter::Decorrelated`]).
    pub fn max_delay(&self, retry: u32) -> Option<Duration> {
        self.nominal_millis(retry)
            .map(|d| Duration::from_millis(self.jitter_upper(d)))
    }

    /// An upper bound of every delay the policy can produce — [`delay`](Self::delay)
    /// over every retry, jitter included, and a handler-chosen delay up to
    /// [`max_chosen_delay`](Self::max_chosen_delay): the largest delay a
    /// transport must be able to schedule.
    pub fn longest_delay(&self) -> Duration {
        let schedule = self.schedule_longest_delay();
        self.max_chosen_delay
            .map_or(schedule, |bound| bound.max(schedule))
    }

    /// The largest delay of the schedule, jitter included.
    fn schedule_longest_delay(&self) -> Duration {
        let ms = match &self.schedule {
            Schedule::Steps(steps) => steps
                .iter()
                .map(|step| self.jitter_upper(millis(step.delay)))
                .max()
                .unwrap_or(0),
            Schedule::Exponential {
                initial,
                cap,
                factor,
                retries,
            } => {
                // Nominal delays never decrease, so the last one is the largest;
                // without a limit they reach the cap unless the factor is 1.
                let largest = match retries {
                    Some(n) => {
                        exp_millis(millis(*initial), millis(*cap), *factor, n.saturating_sub(1))
                    }
                    None if *factor == 1.0 => millis(*initial),
                    None => millis(*cap),
                };
                self.jitter_upper(largest)
            }
        };
        Duration::from_millis(ms)
    }

    /// The nominal schedule of the first `min(limit, max_retries)` retries,
    /// for showing to a human (CLI, docs, logs).
    pub fn explain(&self, limit: u32) -> Vec<ScheduleRow> {
        let rows = self.max_retries().map_or(limit, |max| max.min(limit));
        let mut cumulative = Duration::ZERO;
        (0..rows)
            .map_while(|i| {
                let delay = self.nominal_delay(i)?;
                cumulative = cumulative.saturating_add(delay);
                Some(ScheduleRow {
                    retry: i + 1,
                    attempt: i.saturating_add(2),
                    delay,
                    cumulative,
                })
            })
            .collect()
    }

    fn nominal_millis(&self, retry: u32) -> Option<u64> {
        match &self.schedule {
            Schedule::Steps(steps) => {
                let mut remaining = retry;
                for step in steps {
                    if remaining < step.count {
                        return Some(millis(step.delay));
                    }
                    remaining -= step.count;
                }
                None
            }
            Schedule::Exponential {
                initial,
                cap,
                factor,
                retries,
            } => {
                if retries.is_some_and(|n| retry >= n) {
                    return None;
                }
                Some(exp_millis(millis(*initial), millis(*cap), *factor, retry))
            }
        }
    }

    /// `(base, cap)` of decorrelated jitter for a retry whose nominal delay is
    /// `nominal` milliseconds.
    fn decorrelated_bounds(&self, nominal: u64) -> (u64, u64) {
        match &self.schedule {
            Schedule::Steps(_) => (nominal, nominal.saturating_mul(3)),
            Schedule::Exponential { initial, cap, .. } => (millis(*initial), millis(*cap)),
        }
    }

    /// The largest delay jitter can turn a nominal delay of `nominal` ms into.
    fn jitter_upper(&self, nominal: u64) -> u64 {
        match self.jitter {
            Jitter::None | Jitter::Full | Jitter::Equal => nominal,
            Jitter::Percent(n) => nominal.saturating_add(percent_of(nominal, n)),
            Jitter::Decorrelated => self.decorrelated_bounds(nominal).1,
        }
    }
}

/// `n`% of `ms`, rounded down.
fn percent_of(ms: u64, n: u8) -> u64 {
    let spread = u128::from(ms) * u128::from(n.min(100)) / 100;
    u64::try_from(spread).unwrap_or(u64::MAX)
}

/// `min(cap, initial * factor^retry)` in milliseconds, rounded to the nearest
/// millisecond.
fn exp_millis(initial: u64, cap: u64, factor: f64, retry: u32) -> u64 {
    if retry == 0 || factor == 1.0 {
        return initial.min(cap);
    }
    let exact = initial as f64 * factor.powf(f64::from(retry));
    if exact < cap as f64 {
        // In range for u64 because it is below `cap`.
        (exact.round() as u64).min(cap)
    } else {
        cap
    }
}

fn check_millis(duration: Duration) -> Result<(), PolicyError> {
    whole_millis(duration)
        .map(drop)
        .ok_or(PolicyError::NotWholeMillis(duration))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn step(delay: Duration, count: u32) -> Step {
        Step { delay, count }
    }

    #[test]
    fn fixed_steps() {
        let p = RetryPolicy::parse("5000x3,10000x5").unwrap();
        assert_eq!(
            p.schedule(),
            &Schedule::Steps(vec![step(secs(5), 3), step(secs(10), 5)])
        );
        assert_eq!(p.max_retries(), Some(8));
        assert_eq!(p.max_attempts(), Some(9));
        assert_eq!(p.to_string(), "5s x3, 10s x5");
        let rows = p.explain(100);
        let cumulative: Vec<u64> = rows.iter().map(|r| r.cumulative.as_secs()).collect();
        assert_eq!(cumulative, [5, 10, 15, 25, 35, 45, 55, 65]);
        assert_eq!(rows[0].retry, 1);
        assert_eq!(rows[0].attempt, 2);
        assert_eq!(rows[7].retry, 8);
        assert_eq!(rows[7].attempt, 9);
        assert_eq!(p.explain(2).len(), 2);
        assert_eq!(p.nominal_delay(2), Some(secs(5)));
        assert_eq!(p.nominal_delay(3), Some(secs(10)));
        assert_eq!(p.nominal_delay(8), None);
    }

    #[test]
    fn units_whitespace_and_single_steps() {
        let p = RetryPolicy::parse("  5m x2, 30m X 3 ,1h  ").unwrap();
        assert_eq!(
            p.schedule(),
            &Schedule::Steps(vec![
                step(secs(300), 2),
                step(secs(1800), 3),
                step(secs(3600), 1)
            ])
        );
        assert_eq!(p.to_string(), "5m x2, 30m x3, 1h");
        assert_eq!(p.max_retries(), Some(6));
        let p = RetryPolicy::parse("0, 1d, 250ms, 2s").unwrap();
        assert_eq!(p.to_string(), "0ms, 1d, 250ms, 2s");
    }

    #[test]
    fn exponential_forms() {
        let p = RetryPolicy::parse("exp(500ms, 60s, 2, 6)").unwrap();
        assert_eq!(
            p.schedule(),
            &Schedule::Exponential {
                initial: Duration::from_millis(500),
                cap: secs(60),
                factor: 2.0,
                retries: Some(6)
            }
        );
        let delays: Vec<u64> = p
            .explain(100)
            .iter()
            .map(|r| r.delay.as_millis() as u64)
            .collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 16000]);
        assert_eq!(p.to_string(), "exp(500ms, 1m, 2, 6)");

        let p = RetryPolicy::parse("exp(500ms, 1m, 2); jitter=full; max-elapsed=1h").unwrap();
        assert_eq!(p.max_retries(), None);
        assert_eq!(p.max_attempts(), None);
        assert_eq!(p.jitter(), Jitter::Full);
        assert_eq!(p.max_elapsed(), Some(secs(3600)));
        assert_eq!(p.nominal_delay(7), Some(secs(60)));
        assert_eq!(p.nominal_delay(u32::MAX), Some(secs(60)));
        assert_eq!(p.explain(3).len(), 3);
        assert_eq!(
            p.to_string(),
            "exp(500ms, 1m, 2); jitter=full; max-elapsed=1h"
        );

        let p = RetryPolicy::parse("exp(1s, 1h, 1.5, 3)").unwrap();
        assert_eq!(p.nominal_delay(2), Some(Duration::from_millis(2250)));
        assert_eq!(p.to_string(), "exp(1s, 1h, 1.5, 3)");
    }

    #[test]
    fn java_article_forms() {
        let fixed = RetryPolicy::parse("FixedDelayRetryPolicy(5000x3, 15000x5)").unwrap();
        assert_eq!(fixed, RetryPolicy::parse("5s x3, 15s x5").unwrap());
        let limited =
            RetryPolicy::parse("LimitedExponentialRetryPolicy(1000, 60000, 2, 5); jitter=equal")
                .unwrap();
        assert_eq!(
            limited,
            RetryPolicy::parse("exp(1s, 1m, 2, 5); jitter=equal").unwrap()
        );
        let unlimited =
            RetryPolicy::parse("UnlimitedExponentialRetryPolicy(1000, 60000, 2)").unwrap();
        assert_eq!(unlimited, RetryPolicy::parse("exp(1s,1m,2)").unwrap());
        assert!(RetryPolicy::parse("LimitedExponentialRetryPolicy(1000, 60000, 2)").is_err());
        assert!(RetryPolicy::parse("UnlimitedExponentialRetryPolicy(1000, 60000, 2, 3)").is_err());
        assert!(RetryPolicy::parse("Exp(1s, 1m, 2)").is_err());
    }

    #[test]
    fn jitter_options() {
        for (text, jitter) in [
            ("none", Jitter::None),
            ("full", Jitter::Full),
            ("equal", Jitter::Equal),
            ("decorrelated", Jitter::Decorrelated),
            ("20%", Jitter::Percent(20)),
            ("±20%", Jitter::Percent(20)),
            ("+-100%", Jitter::Percent(100)),
        ] {
            let p = RetryPolicy::parse(&format!("1s; jitter = {text}")).unwrap();
            assert_eq!(p.jitter(), jitter, "{text}");
        }
        assert_eq!(
            RetryPolicy::parse("1s; max-elapsed=90m; jitter=±10%")
                .unwrap()
                .to_string(),
            "1s; jitter=10%; max-elapsed=90m"
        );
        assert_eq!(
            RetryPolicy::parse("1s; jitter=none").unwrap().to_string(),
            "1s"
        );
    }

    #[test]
    fn builders_validate() {
        assert_eq!(RetryPolicy::steps(vec![]), Err(PolicyError::NoSteps));
        assert_eq!(
            RetryPolicy::steps(vec![step(secs(1), 1), step(secs(1), 0)]),
            Err(PolicyError::ZeroCount { index: 1 })
        );
        assert!(matches!(
            RetryPolicy::steps(vec![step(Duration::from_micros(1500), 1)]),
            Err(PolicyError::NotWholeMillis(_))
        ));
        assert!(matches!(
            RetryPolicy::exponential(secs(2), secs(1), 2.0, None),
            Err(PolicyError::InitialExceedsCap { .. })
        ));
        assert_eq!(
            RetryPolicy::exponential(Duration::ZERO, secs(1), 2.0, None),
            Err(PolicyError::ZeroInitial)
        );
        assert!(matches!(
            RetryPolicy::exponential(secs(1), secs(2), 0.5, None),
            Err(PolicyError::InvalidFactor(_))
        ));
        assert!(matches!(
            RetryPolicy::exponential(secs(1), secs(2), f64::NAN, None),
            Err(PolicyError::InvalidFactor(_))
        ));
        assert_eq!(
            RetryPolicy::exponential(secs(1), secs(2), 2.0, Some(0)),
            Err(PolicyError::ZeroRetries)
        );
        let built = RetryPolicy::exponential(Duration::from_millis(500), secs(60), 2.0, Some(6))
            .unwrap()
            .with_jitter(Jitter::Full)
            .with_max_elapsed(secs(3600));
        assert_eq!(
            built,
            RetryPolicy::parse("exp(500ms, 1m, 2, 6); jitter=full; max-elapsed=1h").unwrap()
        );
        assert_eq!(
            RetryPolicy::steps(vec![step(secs(1), 1)])
                .unwrap()
                .with_jitter(Jitter::Percent(0))
                .jitter(),
            Jitter::Percent(1)
        );
    }

    #[test]
    fn huge_counts_are_cheap() {
        let p = RetryPolicy::steps(vec![step(secs(1), u32::MAX - 1), step(secs(2), 1)]).unwrap();
        assert_eq!(p.max_retries(), Some(u32::MAX));
        assert_eq!(p.max_attempts(), Some(u32::MAX));
        assert_eq!(p.nominal_delay(u32::MAX - 2), Some(secs(1)));
        assert_eq!(p.nominal_delay(u32::MAX - 1), Some(secs(2)));
        assert_eq!(p.nominal_delay(u32::MAX), None);
        let p = RetryPolicy::steps(vec![step(secs(1), u32::MAX)]).unwrap();
        assert_eq!(p.nominal_delay(u32::MAX), None);
    }

    #[test]
    fn a_chosen_delay_is_bounded_by_max_delay_or_the_longest_delay() {
        let p = RetryPolicy::parse("1s x3, 10s; jitter=full").unwrap();
        assert_eq!(p.max_chosen_delay(), None);
        assert_eq!(p.chosen_delay(secs(3)), secs(3));
        assert_eq!(p.chosen_delay(secs(60)), secs(10));
        assert_eq!(p.longest_delay(), secs(10));
        let p = RetryPolicy::parse("1s x3; max-delay=5m; jitter=full").unwrap();
        assert_eq!(p.to_string(), "1s x3; jitter=full; max-delay=5m");
        assert_eq!(p.max_chosen_delay(), Some(secs(300)));
        assert_eq!(p.chosen_delay(secs(30)), secs(30));
        assert_eq!(p.chosen_delay(secs(86_400)), secs(300));
        assert_eq!(
            p.longest_delay(),
            secs(300),
            "the start-up check covers the bound"
        );
        // A bound below the schedule's delays bounds only what a handler chooses.
        let p = RetryPolicy::parse("1m; max-delay=5s").unwrap();
        assert_eq!(p.chosen_delay(secs(30)), secs(5));
        assert_eq!(p.longest_delay(), secs(60));
        assert_eq!(p.nominal_delay(0), Some(secs(60)));
        assert_eq!(
            RetryPolicy::parse("1s x3")
                .unwrap()
                .with_max_chosen_delay(Duration::from_micros(2_500_900))
                .to_string(),
            "1s x3; max-delay=2500ms"
        );
    }

    #[test]
    fn counts_past_u32_are_refused() {
        // A policy whose counts add up past u32::MAX would report u32::MAX retries (saturated)
        // while still having a delay for retry u32::MAX: the limit and the schedule disagreed.
        assert_eq!(
            RetryPolicy::steps(vec![step(secs(1), u32::MAX), step(secs(2), 1)]),
            Err(PolicyError::TooManyRetries {
                total: u64::from(u32::MAX) + 1
            })
        );
        let text = "1d x009,31d X4224090928, 5s x100000000";
        let err = RetryPolicy::parse(text).unwrap_err();
        assert_eq!(err.column(), 30, "{}", err.render());
        assert!(
            err.expected().contains("at most 4294967295 retries"),
            "{err}"
        );
    }

    #[test]
    fn upper_bounds() {
        let p = RetryPolicy::parse("1s x2, 10s; jitter=50%").unwrap();
        assert_eq!(p.max_delay(0), Some(Duration::from_millis(1500)));
        assert_eq!(p.max_delay(3), None);
        assert_eq!(p.longest_delay(), secs(15));
        let p = RetryPolicy::parse("1s x2, 10s; jitter=decorrelated").unwrap();
        assert_eq!(p.max_delay(2), Some(secs(30)));
        assert_eq!(p.longest_delay(), secs(30));
        let p = RetryPolicy::parse("exp(1s, 1h, 2, 3); jitter=full").unwrap();
        assert_eq!(p.longest_delay(), secs(4));
        let p = RetryPolicy::parse("exp(1s, 1h, 2, 3); jitter=decorrelated").unwrap();
        assert_eq!(p.longest_delay(), secs(3600));
        let p = RetryPolicy::parse("exp(1s, 1h, 1)").unwrap();
        assert_eq!(p.longest_delay(), secs(1));
        let p = RetryPolicy::parse("exp(1s, 1h, 1.01)").unwrap();
        assert_eq!(p.longest_delay(), secs(3600));
    }

    #[test]
    fn decorrelated_follows_previous() {
        let p = RetryPolicy::parse("exp(1s, 10s, 2); jitter=decorrelated").unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let mut previous = None;
        for retry in 0..50 {
            let d = p.delay(retry, previous, &mut rng).unwrap();
            assert!(d >= secs(1) && d <= secs(10), "{d:?}");
            if let Some(prev) = previous {
                assert!(d <= (prev * 3).max(secs(1)));
            }
            previous = Some(d);
        }
    }

    #[test]
    fn serde_round_trip() {
        let p = RetryPolicy::parse("exp(500ms, 1m, 2.5, 6); jitter=±15%; max-elapsed=2d").unwrap();
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(
            json,
            "\"exp(500ms, 1m, 2.5, 6); jitter=15%; max-elapsed=2d\""
        );
        let back: RetryPolicy = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
        let err = serde_json::from_str::<RetryPolicy>("\"5000x\"").unwrap_err();
        assert!(
            err.to_string()
                .contains("column 6: expected a repeat count after 'x', found end of input"),
            "{err}"
        );
    }

    /// A duration in whole milliseconds up to about ten days, biased towards
    /// values that print in larger units.
    fn any_millis(min: u64) -> impl Strategy<Value = u64> {
        let unit = prop::sample::select(vec![1u64, 1_000, 60_000, 3_600_000, 86_400_000]);
        (unit, 0u64..=864_000_000)
            .prop_map(|(unit, ms)| ms / unit * unit)
            .prop_filter("at least min", move |ms| *ms >= min)
    }

    fn any_jitter() -> impl Strategy<Value = Jitter> {
        prop_oneof![
            Just(Jitter::None),
            Just(Jitter::Full),
            Just(Jitter::Equal),
            Just(Jitter::Decorrelated),
            (1u8..=100).prop_map(Jitter::Percent),
        ]
    }

    fn any_schedule() -> impl Strategy<Value = Schedule> {
        let steps = prop::collection::vec(
            (
                any_millis(0),
                // At most 5 steps of at most u32::MAX / 5: the total fits, as it must.
                prop_oneof![1u32..10, 1u32..=u32::MAX / 5],
            ),
            1..6,
        )
        .prop_map(|steps| {
            Schedule::Steps(
                steps
                    .into_iter()
                    .map(|(ms, count)| step(Duration::from_millis(ms), count))
                    .collect(),
            )
        });
        let exp = (
            any_millis(1),
            any_millis(0),
            prop_oneof![Just(1.0), Just(2.0), 1.0f64..100.0],
            prop::option::of(1u32..=u32::MAX),
        )
            .prop_map(|(a, b, factor, retries)| Schedule::Exponential {
                initial: Duration::from_millis(a.min(b.max(1))),
                cap: Duration::from_millis(a.max(b)),
                factor,
                retries,
            });
        prop_oneof![steps, exp]
    }

    fn any_policy() -> impl Strategy<Value = RetryPolicy> {
        (
            any_schedule(),
            any_jitter(),
            prop::option::of(any_millis(0)),
            prop::option::of(any_millis(0)),
        )
            .prop_map(|(schedule, jitter, budget, bound)| RetryPolicy {
                schedule,
                jitter,
                max_elapsed: budget.map(Duration::from_millis),
                max_chosen_delay: bound.map(Duration::from_millis),
            })
    }

    proptest! {
        #[test]
        fn display_parses_back(p in any_policy()) {
            let text = p.to_string();
            prop_assert_eq!(RetryPolicy::parse(&text), Ok(p), "{}", text);
        }

        #[test]
        fn delay_within_bounds(p in any_policy(), seed: u64, prev in prop::option::of(0u64..3_000_000_000)) {
            let mut rng = StdRng::seed_from_u64(seed);
            let previous = prev.map(Duration::from_millis);
            for retry in [0, 1, 2, 5, 17, 1_000, u32::MAX - 1] {
                let (Some(d), Some(max), Some(nominal)) = (
                    p.delay(retry, previous, &mut rng),
                    p.max_delay(retry),
                    p.nominal_delay(retry),
                ) else {
                    prop_assert_eq!(p.nominal_delay(retry), None);
                    prop_assert_eq!(p.max_delay(retry), None);
                    continue;
                };
                prop_assert!(d <= max, "{:?} > {:?}", d, max);
                prop_assert!(max <= p.longest_delay());
                match p.jitter() {
                    Jitter::None => prop_assert_eq!(d, nominal),
                    Jitter::Full => prop_assert!(d <= nominal),
                    Jitter::Equal => {
                        let (d, nominal) = (d.as_millis(), nominal.as_millis());
                        prop_assert!(d >= nominal / 2 && d <= nominal);
                    }
                    Jitter::Percent(n) => {
                        let (d, nominal) = (d.as_millis(), nominal.as_millis());
                        prop_assert!(d.abs_diff(nominal) * 100 <= nominal * u128::from(n));
                    }
                    Jitter::Decorrelated => {}
                }
            }
        }

        #[test]
        fn same_seed_same_delays(p in any_policy(), seed: u64) {
            let run = |seed| {
                let mut rng = StdRng::seed_from_u64(seed);
                let mut previous = None;
                (0..20)
                    .map(|retry| {
                        let d = p.delay(retry, previous, &mut rng);
                        previous = d.or(previous);
                        d
                    })
                    .collect::<Vec<_>>()
            };
            prop_assert_eq!(run(seed), run(seed));
        }
    }
}
