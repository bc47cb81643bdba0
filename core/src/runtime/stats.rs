//! Counters a running consumer keeps about itself, readable without a metrics exporter.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// A snapshot of a consumer's counters (read from a [`ConsumerHandle`](super::ConsumerHandle);
/// counters may be added, so it is not built outside the SDK).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Deliveries received.
    pub received: u64,
    /// Handler calls.
    pub attempts: u64,
    /// Events acknowledged after success.
    pub succeeded: u64,
    /// Events that succeeded after at least one failure.
    pub succeeded_after_retry: u64,
    /// Retries scheduled through the broker.
    pub retries_scheduled: u64,
    /// In-place retries.
    pub in_place_retries: u64,
    /// Waits while consumption was held: a blocking error's backoffs, and the waits between dead-letter
    /// writes a DLQ refused.
    pub holds: u64,
    /// Events dead-lettered.
    pub dead_lettered: u64,
    /// Parkings behind an earlier event of the same key (an event parked again counts again).
    pub parked: u64,
    /// Duplicates skipped through the idempotency store.
    pub duplicates_skipped: u64,
    /// Deliveries released unsettled (shutdown, or after a settle error).
    pub released: u64,
    /// Settle operations the broker did not accept (each refused dead-letter write counts).
    pub settle_errors: u64,
    /// Errors receiving from the broker.
    pub receive_errors: u64,
    /// Actions not taken because the event lifecycle refused their transition (a runtime bug when not
    /// zero; the delivery was given back to the broker instead).
    pub lifecycle_violations: u64,
    /// The last error seen, if any.
    pub last_error: Option<String>,
}

/// One receive lane's counts. Each lane counts on its own cache lines (the alignment), so lanes on
/// different cores never write to a line another is writing to; a snapshot sums them.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct LaneCounts {
    pub(crate) received: AtomicU64,
    pub(crate) attempts: AtomicU64,
    pub(crate) succeeded: AtomicU64,
    pub(crate) succeeded_after_retry: AtomicU64,
    pub(crate) retries_scheduled: AtomicU64,
    pub(crate) in_place_retries: AtomicU64,
    pub(crate) holds: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) parked: AtomicU64,
    pub(crate) duplicates_skipped: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) settle_errors: AtomicU64,
    pub(crate) receive_errors: AtomicU64,
    pub(crate) lifecycle_violations: AtomicU64,
}

/// The live counters of a consumer, one [`LaneCounts`] per receive lane; every change wakes whoever
/// waits for a condition on them, so waiting needs no polling. With nobody waiting (a service in
/// production) a change is one atomic add and one load: the wake-up, a lock on the waiters' list, is
/// paid only while a waiter is registered.
///
/// Why that is sound: a change adds to its counter and then reads `waiters`, a waiter adds to `waiters`
/// and then reads the counters, all sequentially consistent. Either the change sees the waiter (and wakes
/// it) or the waiter's check sees the change.
#[derive(Debug)]
pub(crate) struct Counters {
    lanes: Box<[LaneCounts]>,
    last_error: Mutex<Option<String>>,
    stopped: AtomicBool,
    changes: Notify,
    /// How many `wait_for` calls are running.
    waiters: AtomicUsize,
}

impl Default for Counters {
    fn default() -> Self {
        Self::new(1)
    }
}

/// One lane's view of its consumer's [`Counters`]: its fields are the lane's own counts, its changes
/// are announced to the consumer's waiters.
#[derive(Debug, Clone)]
pub(crate) struct LaneCounters {
    all: Arc<Counters>,
    lane: usize,
}

impl std::ops::Deref for LaneCounters {
    type Target = LaneCounts;

    fn deref(&self) -> &LaneCounts {
        &self.all.lanes[self.lane]
    }
}

impl LaneCounters {
    /// Adds one to `counter` (one of this lane's) and announces the change.
    pub(crate) fn bump(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::SeqCst);
        self.all.announce();
    }

    /// Counts an error and keeps its message as the consumer's last error.
    pub(crate) fn error(&self, counter: &AtomicU64, message: String) {
        *self
            .all
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(message);
        self.bump(counter);
    }
}

impl Counters {
    /// The counters of a consumer of `lanes` receive lanes (at least one).
    pub(crate) fn new(lanes: usize) -> Self {
        Self {
            lanes: (0..lanes.max(1)).map(|_| LaneCounts::default()).collect(),
            last_error: Mutex::new(None),
            stopped: AtomicBool::new(false),
            changes: Notify::new(),
            waiters: AtomicUsize::new(0),
        }
    }

    /// Lane `lane`'s counters (lanes past the last count on the last).
    pub(crate) fn lane(self: &Arc<Self>, lane: usize) -> LaneCounters {
        LaneCounters {
            all: self.clone(),
            lane: lane.min(self.lanes.len() - 1),
        }
    }

    /// Marks the consumer stopped and announces it.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.announce();
    }

    /// Whether the consumer has stopped.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Waits until `done` holds, checking it now and after every change.
    pub(crate) async fn wait_for(&self, mut done: impl FnMut() -> bool) {
        let _waiting = Waiting::register(&self.waiters);
        loop {
            // Created before the check, the future receives every announcement made after it, even
            // before it is first polled: a change between the check and the wait is not missed.
            let changed = self.changes.notified();
            if done() {
                return;
            }
            changed.await;
        }
    }

    fn announce(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.changes.notify_waiters();
        }
    }

    /// The counts of every lane, summed, and the last error.
    pub(crate) fn snapshot(&self) -> Stats {
        let sum = |counter: fn(&LaneCounts) -> &AtomicU64| {
            self.lanes
                .iter()
                .map(|lane| counter(lane).load(Ordering::SeqCst))
                .sum()
        };
        Stats {
            received: sum(|c| &c.received),
            attempts: sum(|c| &c.attempts),
            succeeded: sum(|c| &c.succeeded),
            succeeded_after_retry: sum(|c| &c.succeeded_after_retry),
            retries_scheduled: sum(|c| &c.retries_scheduled),
            in_place_retries: sum(|c| &c.in_place_retries),
            holds: sum(|c| &c.holds),
            dead_lettered: sum(|c| &c.dead_lettered),
            parked: sum(|c| &c.parked),
            duplicates_skipped: sum(|c| &c.duplicates_skipped),
            released: sum(|c| &c.released),
            settle_errors: sum(|c| &c.settle_errors),
            receive_errors: sum(|c| &c.receive_errors),
            lifecycle_violations: sum(|c| &c.lifecycle_violations),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }
}

/// One running `wait_for`, counted in `waiters` for as long as it runs (also when it is dropped unfinished).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn register(waiters: &'a AtomicUsize) -> Self {
        waiters.fetch_add(1, Ordering::SeqCst);
        Self(waiters)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A waiter on another thread sees the last of many changes made as fast as possible: no change
    /// slips between its check and its wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_wakes_for_the_change_it_waits_for() {
        for target in [1_u64, 10, 10_000] {
            let counters = Arc::new(Counters::new(2));
            let waiter = tokio::spawn({
                let counters = counters.clone();
                async move {
                    counters
                        .wait_for(|| counters.snapshot().succeeded >= target)
                        .await
                }
            });
            // Half the changes on each lane: the waiter is woken by either.
            let lanes = [counters.lane(0), counters.lane(1)];
            for i in 0..target {
                let lane = &lanes[usize::from(i % 2 == 1)];
                lane.bump(&lane.succeeded);
            }
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("the waiter missed the change it waited for")
                .expect("the waiter panicked");
        }
    }

    #[tokio::test]
    async fn stopping_wakes_a_waiter() {
        let counters = Arc::new(Counters::default());
        let waiter = tokio::spawn({
            let counters = counters.clone();
            async move { counters.wait_for(|| counters.is_stopped()).await }
        });
        tokio::task::yield_now().await;
        counters.stop();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("stopping did not wake the waiter")
            .expect("the waiter panicked");
    }

    /// With nobody waiting a change wakes nothing (no lock on the waiters' list); once a waiter runs, a
    /// change wakes it, and after it returns changes are silent again.
    #[tokio::test]
    async fn a_change_announces_itself_only_while_somebody_waits() {
        use futures::FutureExt;
        let counters = Arc::new(Counters::default());
        let lane = counters.lane(0);
        let mut unregistered = std::pin::pin!(counters.changes.notified());
        unregistered.as_mut().enable();
        lane.bump(&lane.succeeded);
        assert!(
            unregistered.as_mut().now_or_never().is_none(),
            "a change with nobody waiting announced itself"
        );
        {
            let _waiting = Waiting::register(&counters.waiters);
            lane.bump(&lane.succeeded);
        }
        assert!(
            unregistered.as_mut().now_or_never().is_some(),
            "a change while somebody waits did not announce itself"
        );
        assert_eq!(counters.waiters.load(Ordering::SeqCst), 0);
    }

    /// A snapshot sums every lane's counts; an error on any lane is the consumer's last error.
    #[test]
    fn a_snapshot_sums_the_lanes_and_keeps_the_last_error_of_any() {
        let counters = Arc::new(Counters::new(3));
        let (a, b, c) = (counters.lane(0), counters.lane(1), counters.lane(2));
        a.bump(&a.received);
        b.bump(&b.received);
        b.bump(&b.succeeded);
        c.error(&c.settle_errors, "refused".into());
        let stats = counters.snapshot();
        assert_eq!(
            (stats.received, stats.succeeded, stats.settle_errors),
            (2, 1, 1)
        );
        assert_eq!(stats.last_error.as_deref(), Some("refused"));
        // Each lane counts on its own lines.
        assert_ne!(
            std::ptr::from_ref::<LaneCounts>(&*a) as usize / 128,
            std::ptr::from_ref::<LaneCounts>(&*b) as usize / 128
        );
    }
}
