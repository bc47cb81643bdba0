//! Pausing and resuming the consumer's partitions: for the runtime's hold, for a backlog full too
//! long, and again where librdkafka dropped a resume.
//!
//! When the runtime holds consumption for a blocking error, or the backlog stays full for long, the
//! consumer thread pauses every assigned partition and polls on (librdkafka drops what it fetched
//! ahead and fetches again from the position after the last record read on resume).
//!
//! Kept apart from the thread's loop because librdkafka's pause costs what it fetched ahead: when to
//! pause (and when only to stop reading) is a decision of its own, and the resume made good again is
//! shared with the delay ladder's consumers.

use std::time::{Duration, Instant};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use tracing::warn;

use crate::consumer::context::Context;

/// The backlog of records read but not yet taken by the runtime at which the thread stops reading.
pub(super) const PENDING_HIGH: usize = 2_000;
/// The backlog below which a stalled consumer's partitions resume.
const PENDING_LOW: usize = 500;
/// How long the backlog may stay full before the partitions are paused, so the thread can poll again
/// (well within `max.poll.interval.ms`, 5 minutes by default).
const STALL_AFTER: Duration = Duration::from_secs(3);

/// How often the partitions that should be fetching are resumed again (the source's consumer, and the
/// ladder's: [`crate::ladder`]). librdkafka can drop an application's resume as outdated — when an
/// operation of its own on the partition (a library pause or a fetch start, around a rebalance) takes
/// a newer version in between — and still answer success; the partition then stays paused, and every
/// record after it waits for ever, nothing noticing. A resume of a partition librdkafka does not hold
/// paused returns at once without touching it, so asking again costs a call and nothing else.
pub(crate) const RESUME_AGAIN_EVERY: Duration = Duration::from_secs(5);

/// Resumes `partitions` — except, with the `failpoints` feature, while the failpoint named `failpoint`
/// is set to `return`: then the resume is left out and success answered, as librdkafka does with a
/// resume it drops as outdated (what the broker tests of [`RESUME_AGAIN_EVERY`] make happen).
pub(crate) fn resume<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &TopicPartitionList,
    failpoint: &str,
) -> KafkaResult<()> {
    #[cfg(feature = "failpoints")]
    failpoint!(failpoint, |_| Ok(()));
    let _ = failpoint;
    consumer.resume(partitions)
}

impl Context {
    /// Whether to read more now. A full backlog stops reading without pausing: a pause makes librdkafka
    /// drop everything it fetched ahead and fetch it again, which costs far more than waiting while the
    /// runtime catches up. Only a backlog full for `STALL_AFTER` pauses the partitions, so that polling
    /// (and the group membership) can go on.
    pub(super) fn may_read(&self) -> bool {
        let mut state = self.lock();
        let backlog = state.pending.len();
        if backlog < PENDING_HIGH {
            state.full_since = None;
            if backlog < PENDING_LOW {
                state.stalled = false;
            }
            return true;
        }
        let since = *state.full_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= STALL_AFTER {
            state.stalled = true;
        }
        state.stalled
    }

    /// Pauses or resumes every assigned partition as the runtime's hold and a stalled backlog say.
    pub(super) fn apply_pause(&self, consumer: &BaseConsumer<Context>) {
        let want = {
            let state = self.lock();
            let want = state.held_by_runtime || state.stalled;
            if want == state.paused {
                return;
            }
            want
        };
        let Ok(assignment) = consumer.assignment() else {
            return;
        };
        let result = if want {
            consumer.pause(&assignment)
        } else {
            resume(consumer, &assignment, "kafka-resume-discarded")
        };
        match result {
            Ok(()) => self.lock().paused = want,
            Err(e) => warn!(error = %e, "pausing or resuming the partitions failed"),
        }
    }

    /// Resumes every assigned partition again, at most once per [`RESUME_AGAIN_EVERY`] (`last` says
    /// when it last did), while none is meant to be paused: a resume librdkafka dropped is made good.
    pub(super) fn resume_again(&self, consumer: &BaseConsumer<Context>, last: &mut Instant) {
        if last.elapsed() < RESUME_AGAIN_EVERY {
            return;
        }
        *last = Instant::now();
        if self.lock().paused {
            return;
        }
        if let Ok(assignment) = consumer.assignment()
            && assignment.count() > 0
            && let Err(e) = consumer.resume(&assignment)
        {
            warn!(error = %e, "resuming the partitions again failed");
        }
    }
}
