//! The delay ladder: its levels, and the path of a delayed record through them.
//!
//! The levels' topic names are the configuration's ([`crate::config::KafkaConfig::level_topic`]);
//! what moves a record from level to level, and into its retry topic once due, is [`mover`], kept
//! apart because it is a consumer with a thread of its own while this is arithmetic on times.
//!
//! Level *k* holds every record for `granularity × 2^k`, so within one partition of one level the records
//! become due in the order they arrived, and the level's consumer only ever waits for the head. A delay
//! is walked greedily from the largest level that fits the time still left (the binary digits of the
//! delay, largest first); each hop recomputes from the absolute due time, so the time spent producing and
//! consuming between levels is absorbed rather than added. What is left below one step waits in level 0
//! for exactly that remainder, which is why a retry is never early and at most about one step late.

pub(crate) mod mover;

use std::time::Duration;

use event_retry_core::time::Timestamp;

/// Where a delayed record goes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hop {
    /// Into ladder level `level`, which it may leave at `leave_at`.
    Level {
        /// The level.
        level: u32,
        /// When the record may leave it.
        leave_at: Timestamp,
    },
    /// It is due: to its destination.
    Due,
}

/// How long before its due time the ladder hands a retry over to its retry topic (without transactional
/// hops). Forwarding, the
/// producer's acknowledgement, the consumer's fetch and the hand-off to the runtime take milliseconds
/// each, and a burst of retries falling due together queues behind one another on the way; the
/// consumer then holds a record that
/// arrived before its `x-retry-due-at` until that time (see the subscription), so the retry starts on
/// time, never early.
pub(crate) const HANDOVER_LEAD: Duration = Duration::from_millis(100);

/// The next hop at `now` of a record due at `due`, on a ladder of `levels` levels of `step`.
pub(crate) fn next_hop(now: Timestamp, due: Timestamp, step: Duration, levels: u32) -> Hop {
    let (now_ms, due_ms) = (now.as_millis(), due.as_millis());
    if now_ms >= due_ms {
        return Hop::Due;
    }
    let left = due_ms - now_ms;
    let step_ms = u64::try_from(step.as_millis()).unwrap_or(u64::MAX).max(1);
    let steps = left / step_ms;
    if steps == 0 {
        return Hop::Level {
            level: 0,
            leave_at: due,
        };
    }
    let level = (63 - steps.leading_zeros()).min(levels.saturating_sub(1));
    Hop::Level {
        level,
        leave_at: Timestamp::from_millis(now_ms + (step_ms << level)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEP: Duration = Duration::from_millis(100);

    /// Walks a delay through the ladder with hops taking `overhead` each; returns the levels used and
    /// when it became due.
    fn walk(delay_ms: u64, overhead: u64, levels: u32) -> (Vec<u32>, u64) {
        let start = 1_000_000;
        let due = Timestamp::from_millis(start + delay_ms);
        let mut now = start;
        let mut path = Vec::new();
        loop {
            match next_hop(Timestamp::from_millis(now), due, STEP, levels) {
                Hop::Due => return (path, now),
                Hop::Level { level, leave_at } => {
                    path.push(level);
                    assert!(
                        leave_at.as_millis() <= due.as_millis(),
                        "a hop past the due time"
                    );
                    now = leave_at.as_millis() + overhead;
                }
            }
            assert!(path.len() < 64);
        }
    }

    #[test]
    fn a_delay_is_its_binary_digits_then_the_remainder() {
        // 59.85 s = 598 steps (512 + 64 + 16 + 4 + 2) + 50 ms.
        let (path, at) = walk(59_850, 0, 20);
        assert_eq!(path, vec![9, 6, 4, 2, 1, 0]);
        assert_eq!(at, 1_000_000 + 59_850);
        let (path, _) = walk(100, 0, 20);
        assert_eq!(path, vec![0]);
        assert_eq!(walk(0, 0, 20).0, Vec::<u32>::new());
    }

    #[test]
    fn never_early_and_overheads_are_absorbed() {
        for delay in [1, 99, 100, 101, 1_234, 30_000, 59_999] {
            let (_, at) = walk(delay, 7, 20);
            let due = 1_000_000 + delay;
            assert!(at >= due, "{delay}: early");
            assert!(at < due + 100 + 7, "{delay}: {} ms late", at - due);
        }
    }

    #[test]
    fn levels_are_capped() {
        let (path, _) = walk(10_000, 0, 3);
        assert!(path.iter().all(|&l| l <= 2));
    }
}
