//! What a transport can do, and how it honours a delay.
//!
//! The start-up check ([`crate::check`]) and the conformance suite read these; the suite adapts its
//! expectations to them, never the reverse, so an adapter states the truth here.

use std::time::Duration;

/// How a broker honours a delay.
///
/// Built with [`DelayCapability::new`] and [`DelayCapability::with_max_native`], so that a field added
/// later does not break adapters written before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DelayCapability {
    /// The smallest step of delay the broker distinguishes; delays are rounded *up* to it (never early).
    pub granularity: Duration,
    /// The longest delay one native hop carries, if limited.
    pub max_native: Option<Duration>,
    /// What happens to a delay longer than `max_native`.
    pub beyond_max: BeyondMax,
}

impl DelayCapability {
    /// Delays rounded up to `granularity`, with no longest native delay.
    pub const fn new(granularity: Duration) -> Self {
        Self {
            granularity,
            max_native: None,
            beyond_max: BeyondMax::Refuse,
        }
    }

    /// One native hop carries at most `max`; a longer delay is refused or split, as `beyond` says.
    pub const fn with_max_native(mut self, max: Duration, beyond: BeyondMax) -> Self {
        self.max_native = Some(max);
        self.beyond_max = beyond;
        self
    }
}

/// What a transport does with a delay longer than its native maximum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BeyondMax {
    /// It refuses the policy at start-up.
    Refuse,
    /// It carries the delay in several hops of at most the native maximum.
    Split,
}

/// What a transport can do.
///
/// Built with [`Capabilities::new`] and the setters, so that a capability added later does not break
/// adapters written before it (it starts out `false`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// How delays are honoured.
    pub delay: DelayCapability,
    /// Per-key ordering of retries (parking) can be kept.
    pub per_key_order: bool,
    /// Consumption can be paused while a blocking error holds an event.
    pub blocking_pause: bool,
    /// DLQ entries can be replayed.
    pub replay: bool,
    /// Several consumers can share a subscription (a consumer group) and take over each other's work.
    pub shared_subscription: bool,
    /// Work of a consumer that dies without settling is delivered again.
    pub crash_redelivery: bool,
    /// Each consumer group of a topic receives every event published to it, and retries on its own.
    pub fan_out: bool,
    /// The broker itself hands out a key's events one at a time, in order (SQS FIFO message groups): a
    /// key's later events wait in the broker while one is in flight or waits for its retry, rather than
    /// being parked by the runtime.
    pub broker_orders_keys: bool,
}

impl Capabilities {
    /// A transport that honours delays as `delay` says and can do nothing else yet.
    pub const fn new(delay: DelayCapability) -> Self {
        Self {
            delay,
            per_key_order: false,
            blocking_pause: false,
            replay: false,
            shared_subscription: false,
            crash_redelivery: false,
            fan_out: false,
            broker_orders_keys: false,
        }
    }

    /// Sets whether per-key ordering can be kept.
    pub const fn per_key_order(mut self, yes: bool) -> Self {
        self.per_key_order = yes;
        self
    }

    /// Sets whether consumption can be paused.
    pub const fn blocking_pause(mut self, yes: bool) -> Self {
        self.blocking_pause = yes;
        self
    }

    /// Sets whether DLQ entries can be replayed.
    pub const fn replay(mut self, yes: bool) -> Self {
        self.replay = yes;
        self
    }

    /// Sets whether consumers of one group share the work.
    pub const fn shared_subscription(mut self, yes: bool) -> Self {
        self.shared_subscription = yes;
        self
    }

    /// Sets whether work of a crashed consumer is delivered again.
    pub const fn crash_redelivery(mut self, yes: bool) -> Self {
        self.crash_redelivery = yes;
        self
    }

    /// Sets whether every consumer group receives every event.
    pub const fn fan_out(mut self, yes: bool) -> Self {
        self.fan_out = yes;
        self
    }

    /// Sets whether the broker itself hands out a key's events one at a time, in order.
    pub const fn broker_orders_keys(mut self, yes: bool) -> Self {
        self.broker_orders_keys = yes;
        self
    }
}

impl Capabilities {
    /// The capabilities as a Markdown checklist, one line each, for an adapter's README: the adapters'
    /// unit tests check that their README carries the checklist of their default settings, so the page
    /// cannot claim what the code does not state.
    pub fn checklist(&self) -> String {
        let delay = &self.delay;
        let longest = match (delay.max_native, delay.beyond_max) {
            (None, _) => "any length".to_string(),
            (Some(max), _) if max.is_zero() => "none: delayed delivery is off".to_string(),
            (Some(max), BeyondMax::Refuse) => format!(
                "up to {} in one hop; a policy asking for more is refused at start-up",
                readable(max)
            ),
            (Some(max), BeyondMax::Split) => format!(
                "up to {} in one hop; longer ones carried in several hops",
                readable(max)
            ),
        };
        let mut lines = vec![
            format!(
                "- delays rounded up to {}, never early",
                crate::time::format_duration(delay.granularity)
            ),
            format!("- longest delay: {longest}"),
        ];
        let flags = [
            (
                self.per_key_order,
                "per-key order of retries (`ordered_by_key`)",
            ),
            (
                self.broker_orders_keys,
                "the broker itself hands out a key's events one at a time",
            ),
            (
                self.blocking_pause,
                "consumption paused while a blocking error holds an event",
            ),
            (self.replay, "DLQ replay"),
            (
                self.shared_subscription,
                "consumers of one group share its work",
            ),
            (
                self.crash_redelivery,
                "a crashed consumer's work delivered again",
            ),
            (
                self.fan_out,
                "every consumer group gets every event (fan-out)",
            ),
        ];
        for (yes, what) in flags {
            lines.push(format!("- [{}] {what}", if yes { "x" } else { " " }));
        }
        lines.join("\n")
    }

    /// Checks that `page` (an adapter's README) carries this [`Capabilities::checklist`]; the error
    /// says what the page should read. Each adapter's unit tests call it with its default settings.
    pub fn check_listed_in(&self, page: &str) -> Result<(), String> {
        let list = self.checklist();
        if page.contains(&list) {
            Ok(())
        } else {
            Err(format!(
                "the README's capability checklist should read:\n{list}"
            ))
        }
    }
}

/// `d` in the policy DSL's notation where a unit of a second or more divides it (`1d`, `715m`), otherwise
/// in days or hours to a tenth (`about 19.4 days`).
fn readable(d: Duration) -> String {
    let exact = crate::time::format_duration(d);
    if d < Duration::from_secs(1) || !exact.ends_with("ms") {
        return exact;
    }
    let hours = d.as_secs_f64() / 3600.0;
    if hours >= 24.0 {
        format!("about {:.1} days", hours / 24.0)
    } else {
        format!("about {hours:.1} hours")
    }
}

/// How one delay will be honoured.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Honour {
    /// Exactly as asked.
    Exact,
    /// Rounded up to the broker's granularity.
    Rounded {
        /// The delay that will apply.
        to: Duration,
    },
    /// Carried in several hops.
    Split {
        /// How many hops.
        hops: u32,
    },
    /// Cannot be honoured.
    Refused {
        /// Why.
        reason: String,
    },
}

impl std::fmt::Display for Honour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Honour::Exact => f.write_str("exact"),
            Honour::Rounded { to } => {
                write!(f, "rounded up to {}", crate::time::format_duration(*to))
            }
            Honour::Split { hops } => write!(f, "split into {hops} hops"),
            Honour::Refused { reason } => write!(f, "refused: {reason}"),
        }
    }
}

impl DelayCapability {
    /// Delays of any length, to the millisecond (the in-memory transport).
    pub const EXACT: DelayCapability = DelayCapability {
        granularity: Duration::from_millis(1),
        max_native: None,
        beyond_max: BeyondMax::Refuse,
    };

    /// How `delay` will be honoured.
    pub fn honour(&self, delay: Duration) -> Honour {
        if let Some(max) = self.max_native
            && delay > max
        {
            return match self.beyond_max {
                BeyondMax::Refuse => Honour::Refused {
                    reason: format!(
                        "longer than the broker's maximum of {}",
                        crate::time::format_duration(max)
                    ),
                },
                BeyondMax::Split => {
                    let hops = delay.as_millis().div_ceil(max.as_millis().max(1));
                    Honour::Split {
                        hops: u32::try_from(hops).unwrap_or(u32::MAX),
                    }
                }
            };
        }
        let g = self.granularity.as_millis().max(1);
        let ms = delay.as_millis();
        if ms.is_multiple_of(g) {
            Honour::Exact
        } else {
            let up = ms.div_ceil(g) * g;
            Honour::Rounded {
                to: Duration::from_millis(u64::try_from(up).unwrap_or(u64::MAX)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checklist_says_every_capability_and_the_delays() {
        let caps = Capabilities::new(
            DelayCapability::new(Duration::from_millis(100))
                .with_max_native(Duration::from_secs(86_400), BeyondMax::Refuse),
        )
        .per_key_order(true)
        .replay(true);
        let list = caps.checklist();
        assert!(
            list.contains("- delays rounded up to 100ms, never early"),
            "{list}"
        );
        assert!(
            list.contains("up to 1d in one hop; a policy asking for more is refused"),
            "{list}"
        );
        assert!(list.contains("- [x] per-key order of retries"), "{list}");
        assert!(list.contains("- [x] DLQ replay"), "{list}");
        assert!(
            list.contains("- [ ] every consumer group gets every event"),
            "{list}"
        );
        assert_eq!(list.lines().count(), 9, "{list}");
        assert_eq!(
            readable(Duration::from_millis(1_677_721_500)),
            "about 19.4 days"
        );
        assert_eq!(readable(Duration::from_secs(42_900)), "715m");
        assert!(caps.check_listed_in(&format!("# A\n\n{list}\n")).is_ok());
        let wrong = list.replace("- [x] DLQ replay", "- [ ] DLQ replay");
        assert!(caps.check_listed_in(&wrong).is_err());
    }

    #[test]
    fn honour_rounds_up_splits_and_refuses() {
        let second = DelayCapability {
            granularity: Duration::from_secs(1),
            max_native: Some(Duration::from_secs(900)),
            beyond_max: BeyondMax::Split,
        };
        assert_eq!(second.honour(Duration::from_secs(5)), Honour::Exact);
        assert_eq!(
            second.honour(Duration::from_millis(1_500)),
            Honour::Rounded {
                to: Duration::from_secs(2)
            }
        );
        assert_eq!(
            second.honour(Duration::from_secs(3_600)),
            Honour::Split { hops: 4 }
        );
        let refuse = DelayCapability {
            beyond_max: BeyondMax::Refuse,
            ..second
        };
        assert!(matches!(
            refuse.honour(Duration::from_secs(901)),
            Honour::Refused { .. }
        ));
        assert_eq!(
            DelayCapability::EXACT.honour(Duration::from_millis(1_234)),
            Honour::Exact
        );
    }

    #[test]
    fn new_capabilities_start_false() {
        let c = Capabilities::new(DelayCapability::EXACT).replay(true);
        assert!(c.replay && !c.per_key_order && !c.blocking_pause);
        assert!(!c.shared_subscription && !c.crash_redelivery);
    }
}
