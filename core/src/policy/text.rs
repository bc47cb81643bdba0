//! The canonical text of a policy: its `Display` (every duration in the largest unit that divides it,
//! options in a fixed order), `FromStr`, and serde as that text.
//!
//! Separate from the schedule's arithmetic because it is the other half of the DSL: what the parser
//! reads, this prints, and the two must round-trip.

use std::fmt;
use std::str::FromStr;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::duration::DurationLit;
use super::{Jitter, PolicyParseError, RetryPolicy, Schedule, Step};

impl FromStr for RetryPolicy {
    type Err = PolicyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", DurationLit::of(self.delay))?;
        if self.count != 1 {
            write!(f, " x{}", self.count)?;
        }
        Ok(())
    }
}

impl fmt::Display for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Jitter::None => f.write_str("none"),
            Jitter::Full => f.write_str("full"),
            Jitter::Equal => f.write_str("equal"),
            Jitter::Decorrelated => f.write_str("decorrelated"),
            Jitter::Percent(n) => write!(f, "{n}%"),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Steps(steps) => {
                for (i, step) in steps.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{step}")?;
                }
                Ok(())
            }
            Schedule::Exponential {
                initial,
                cap,
                factor,
                retries,
            } => {
                let (initial, cap) = (DurationLit::of(*initial), DurationLit::of(*cap));
                match retries {
                    Some(n) => write!(f, "exp({initial}, {cap}, {factor}, {n})"),
                    None => write!(f, "exp({initial}, {cap}, {factor})"),
                }
            }
        }
    }
}

impl fmt::Display for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.schedule)?;
        if self.jitter != Jitter::None {
            write!(f, "; jitter={}", self.jitter)?;
        }
        if let Some(budget) = self.max_elapsed {
            write!(f, "; max-elapsed={}", DurationLit::of(budget))?;
        }
        if let Some(bound) = self.max_chosen_delay {
            write!(f, "; max-delay={}", DurationLit::of(bound))?;
        }
        Ok(())
    }
}

impl Serialize for RetryPolicy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RetryPolicy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(D::Error::custom)
    }
}
