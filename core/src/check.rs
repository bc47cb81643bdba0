//! The start-up check: how a transport will honour each delay of a policy.
//!
//! Brokers cap delays (SQS: 15 minutes per message, 12 hours of visibility), round them (a delay ladder's
//! granularity) or cannot carry them at all. Other SDKs find out at 3 a.m. by truncating silently; this one
//! finds out when the consumer starts: the report lists every distinct delay with how it will be honoured
//! (exact, rounded up, split into hops, refused) and a consumer refuses to start on a refused delay.

use std::fmt;
use std::time::Duration;

use crate::adapter::{DelayCapability, Honour};
use crate::policy::{RetryPolicy, Schedule};
use crate::time::format_duration;

/// One line of the report: a range of retries sharing one delay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelayRow {
    /// First retry (1-based) the row covers.
    pub first_retry: u32,
    /// Last retry it covers (`None`: every later retry, for unlimited policies).
    pub last_retry: Option<u32>,
    /// The nominal delay.
    pub delay: Duration,
    /// The longest delay jitter can produce.
    pub max_delay: Duration,
    /// How the transport honours it.
    pub honour: Honour,
}

/// How a transport honours every delay of a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelayReport {
    /// The policy, in canonical form.
    pub policy: String,
    /// One row per distinct delay.
    pub rows: Vec<DelayRow>,
    /// The policy's bound on a delay a handler chooses (`max-delay=`) and how the transport honours
    /// it, when the policy states one.
    pub chosen: Option<(Duration, Honour)>,
}

impl DelayReport {
    /// Checks `policy` against `capability`.
    pub fn new(policy: &RetryPolicy, capability: &DelayCapability) -> Self {
        let mut rows: Vec<DelayRow> = Vec::new();
        let mut push = |retry: u32, delay: Duration, max_delay: Duration| {
            let honour = match capability.honour(max_delay) {
                h @ (Honour::Refused { .. } | Honour::Split { .. }) => h,
                _ => capability.honour(delay),
            };
            match rows.last_mut() {
                Some(last) if last.delay == delay && last.max_delay == max_delay => {
                    last.last_retry = Some(retry);
                }
                _ => rows.push(DelayRow {
                    first_retry: retry,
                    last_retry: Some(retry),
                    delay,
                    max_delay,
                    honour,
                }),
            }
        };
        match policy.schedule() {
            Schedule::Steps(steps) => {
                let mut retry: u32 = 0;
                for step in steps {
                    let first = retry;
                    retry = retry.saturating_add(step.count);
                    let max = policy.max_delay(first).unwrap_or(step.delay);
                    push(first + 1, step.delay, max);
                    if step.count > 1 {
                        push(retry, step.delay, max);
                    }
                }
            }
            Schedule::Exponential { retries, cap, .. } => {
                let limit = retries.unwrap_or(u32::MAX);
                let mut retry = 0;
                while retry < limit {
                    let Some(delay) = policy.nominal_delay(retry) else {
                        break;
                    };
                    let max = policy.max_delay(retry).unwrap_or(delay);
                    push(retry + 1, delay, max);
                    if delay >= *cap {
                        if retries.is_none() {
                            if let Some(last) = rows.last_mut() {
                                last.last_retry = None;
                            }
                        } else if let Some(last) = rows.last_mut() {
                            last.last_retry = Some(limit);
                        }
                        break;
                    }
                    retry += 1;
                }
            }
        }
        let chosen = policy
            .max_chosen_delay()
            .map(|bound| (bound, capability.honour(bound)));
        Self {
            policy: policy.to_string(),
            rows,
            chosen,
        }
    }

    /// The rows whose delay is refused.
    pub fn refused(&self) -> impl Iterator<Item = &DelayRow> {
        self.rows
            .iter()
            .filter(|r| matches!(r.honour, Honour::Refused { .. }))
    }

    /// Whether every delay can be honoured (exactly, rounded or split), a handler-chosen one up to
    /// the policy's bound included.
    pub fn is_ok(&self) -> bool {
        self.refused().next().is_none() && !matches!(self.chosen, Some((_, Honour::Refused { .. })))
    }
}

impl fmt::Display for DelayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "policy {}", self.policy)?;
        for row in &self.rows {
            let retries = match row.last_retry {
                Some(last) if last == row.first_retry => format!("retry {}", row.first_retry),
                Some(last) => format!("retries {}-{}", row.first_retry, last),
                None => format!("retries {}-", row.first_retry),
            };
            let jitter = if row.max_delay > row.delay {
                format!(" (up to {} with jitter)", format_duration(row.max_delay))
            } else {
                String::new()
            };
            writeln!(
                f,
                "  {retries}: {}{jitter} -> {}",
                format_duration(row.delay),
                row.honour
            )?;
        }
        if let Some((bound, honour)) = &self.chosen {
            writeln!(
                f,
                "  a delay the handler chooses, up to {}: {honour}",
                format_duration(*bound)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::adapter::BeyondMax;

    fn cap(granularity_ms: u64, max_s: Option<u64>, beyond: BeyondMax) -> DelayCapability {
        DelayCapability {
            granularity: Duration::from_millis(granularity_ms),
            max_native: max_s.map(Duration::from_secs),
            beyond_max: beyond,
        }
    }

    #[test]
    fn steps_report_one_row_per_step() {
        let p = RetryPolicy::parse("5000x3,10000x5").unwrap();
        let r = DelayReport::new(&p, &DelayCapability::EXACT);
        assert!(r.is_ok());
        assert_eq!(r.rows.len(), 2);
        assert_eq!((r.rows[0].first_retry, r.rows[0].last_retry), (1, Some(3)));
        assert_eq!((r.rows[1].first_retry, r.rows[1].last_retry), (4, Some(8)));
        assert!(r.to_string().contains("retries 4-8: 10s -> exact"), "{r}");
    }

    #[test]
    fn rounding_splitting_and_refusal_are_reported() {
        let p = RetryPolicy::parse("1500ms, 20m, 13h").unwrap();
        let sqs_like = DelayReport::new(&p, &cap(1_000, Some(900), BeyondMax::Split));
        let honours: Vec<_> = sqs_like.rows.iter().map(|r| r.honour.clone()).collect();
        assert_eq!(
            honours,
            [
                Honour::Rounded {
                    to: Duration::from_secs(2)
                },
                Honour::Split { hops: 2 },
                Honour::Split { hops: 52 }
            ]
        );
        let ladder = DelayReport::new(&p, &cap(1_000, Some(3_600), BeyondMax::Refuse));
        assert!(!ladder.is_ok());
        assert_eq!(ladder.refused().count(), 1);
        assert!(ladder.to_string().contains("refused"), "{ladder}");
    }

    #[test]
    fn the_bound_on_a_chosen_delay_is_checked_too() {
        let p = RetryPolicy::parse("1s x3; max-delay=2h").unwrap();
        let r = DelayReport::new(&p, &cap(1_000, Some(3_600), BeyondMax::Refuse));
        assert_eq!(r.refused().count(), 0, "every scheduled delay fits");
        assert!(!r.is_ok(), "but a chosen delay of up to 2h does not");
        assert!(
            r.to_string()
                .contains("a delay the handler chooses, up to 2h: refused"),
            "{r}"
        );
        let r = DelayReport::new(&p, &DelayCapability::EXACT);
        assert!(r.is_ok());
    }

    #[test]
    fn unlimited_exponential_ends_with_an_open_row() {
        let p = RetryPolicy::parse("exp(1s, 8s, 2)").unwrap();
        let r = DelayReport::new(&p, &DelayCapability::EXACT);
        let delays: Vec<_> = r.rows.iter().map(|r| r.delay.as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8]);
        assert_eq!(r.rows.last().unwrap().last_retry, None);
        assert!(r.to_string().contains("retries 4-: 8s"), "{r}");
    }

    #[test]
    fn jitter_upper_bound_decides_refusal() {
        let p = RetryPolicy::parse("10s; jitter=50%").unwrap();
        let r = DelayReport::new(&p, &cap(1_000, Some(12), BeyondMax::Refuse));
        assert!(!r.is_ok(), "10s + 50% may exceed a 12s maximum: {r}");
    }
}
