//! The wall clock as the handling reads it: a call's time, and the reading handed from one delivery's
//! end to the next one's start.
//!
//! Separate because reading the clock is a cost of its own on the path every event takes: keeping the
//! readings in one place keeps their count, and the reason for it, in view.

use std::time::{Duration, SystemTime};

/// How long since `started`, read on the wall clock: the first call's time starts with the clock
/// reading taken when its delivery was (one reading fewer per event than a monotonic clock of its own).
/// A clock set back meanwhile gives zero.
pub(super) fn elapsed_since(started: SystemTime) -> Duration {
    SystemTime::now()
        .duration_since(started)
        .unwrap_or_default()
}

/// A wall-clock reading the receive loop hands from one delivery's end to the next one's start, so that
/// a stream of deliveries settled in the loop's own poll reads the clock once per event where it read it
/// twice: the reading that ends a handler's call (its time, for the attempt metric) is the next
/// delivery's time of taking, when the loop takes that one without waiting in between. What lies between
/// the two is the loop's own work: the acknowledgement of the one, the taking (on Kafka, the decoding)
/// of the next — so that delivery's call time includes its own taking, as it included its decoding
/// before. A reading is cheap but not free: taken twice per event, it shows in the SDK's CPU per event.
/// The loop forgets it whenever it waits or may yield ([`Reading::forget`], and by not keeping it), so a
/// reading never stands for a time after a wait. On a current-thread runtime, where the loop spends its
/// cooperative budget after every delivery, it is never carried: two readings per event there.
#[derive(Debug, Default)]
pub(in crate::runtime) struct Reading(pub(super) Option<SystemTime>);

impl Reading {
    /// The reading left by the previous delivery, or the clock now.
    pub(super) fn take_or_now(&mut self) -> SystemTime {
        self.0.take().unwrap_or_else(SystemTime::now)
    }

    /// Drops the reading: the loop waited (or may have) since it was taken.
    pub(in crate::runtime) fn forget(&mut self) {
        self.0 = None;
    }
}
