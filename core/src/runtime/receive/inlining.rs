//! Whether a delivery's first poll runs in the receive loop or it becomes a task at once.
//!
//! Separate from the loop because it is a policy the loop consults per delivery, with its own state
//! (a sample of first polls timed) and its own reasons (see the receive loop's module docs).

use std::time::Duration;

/// Decides, delivery by delivery, whether its first poll runs in the receive loop or it becomes a task at
/// once (see the module docs).
#[derive(Debug)]
pub(super) struct Inlining {
    /// A current-thread runtime: always inline.
    pub(super) single_thread: bool,
    /// Deliveries until the next timed first poll.
    until_sample: u32,
    /// The last timed first poll took longer than [`Inlining::SPREAD_ABOVE`]: spawn.
    spread: bool,
}

/// How a delivery starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// A task at once.
    Task,
    /// Polled once in the loop.
    Inline,
    /// Polled once in the loop, timed.
    InlineTimed,
}

impl Inlining {
    /// One first poll in this many is timed on a multi-threaded runtime.
    pub(super) const SAMPLE_EVERY: u32 = 64;
    /// A timed first poll longer than this makes the following deliveries tasks from the start.
    pub(super) const SPREAD_ABOVE: Duration = Duration::from_micros(50);

    pub(super) fn new(single_thread: bool) -> Self {
        Self {
            single_thread,
            until_sample: 0,
            spread: false,
        }
    }

    pub(super) fn next(&mut self) -> Start {
        if self.single_thread {
            return Start::Inline;
        }
        if self.until_sample == 0 {
            self.until_sample = Self::SAMPLE_EVERY - 1;
            return Start::InlineTimed;
        }
        self.until_sample -= 1;
        if self.spread {
            Start::Task
        } else {
            Start::Inline
        }
    }

    /// A timed first poll took `took`.
    pub(super) fn timed(&mut self, took: Duration) {
        self.spread = took > Self::SPREAD_ABOVE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_current_thread_runtime_always_polls_inline_untimed() {
        let mut inlining = Inlining::new(true);
        inlining.timed(Duration::from_secs(1));
        assert!((0..200).all(|_| inlining.next() == Start::Inline));
    }

    #[test]
    fn a_slow_timed_first_poll_spreads_the_next_deliveries_until_a_fast_one() {
        let mut inlining = Inlining::new(false);
        let every = Inlining::SAMPLE_EVERY as usize;
        assert_eq!(inlining.next(), Start::InlineTimed);
        assert!((1..every).all(|_| inlining.next() == Start::Inline));
        assert_eq!(inlining.next(), Start::InlineTimed);
        inlining.timed(Inlining::SPREAD_ABOVE * 2);
        assert!((1..every).all(|_| inlining.next() == Start::Task));
        assert_eq!(inlining.next(), Start::InlineTimed);
        inlining.timed(Duration::from_micros(1));
        assert_eq!(inlining.next(), Start::Inline);
    }
}
