//! Which offsets of each assigned partition may be committed.
//!
//! The runtime settles deliveries concurrently and out of order, while Kafka commits one position per
//! partition: everything before it is done. So a partition's commit point is its lowest offset still in
//! flight, or the offset after the last one received when none is. Every assignment of a partition gets
//! a new epoch; a settle from an earlier epoch (the partition was revoked meanwhile, maybe to come back)
//! is ignored, so a consumer never commits for a partition it lost.

use rustc_hash::FxHashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::consumer::in_flight::InFlight;

/// A topic and partition (the topic name shared, so a record's costs no allocation).
pub(crate) type Tp = (Arc<str>, i32);

#[derive(Debug)]
struct Partition {
    epoch: u64,
    in_flight: InFlight,
    /// The offset after the last one received.
    next: Option<i64>,
    /// The first offset received in this assignment.
    first: Option<i64>,
    /// The last position committed (or asked to be).
    committed: Option<i64>,
    /// Being revoked: the records of this epoch not yet handed to the runtime are given back, not
    /// handled (see [`Offsets::revoking`]).
    revoking: bool,
}

/// The change count of an assignment, read without the lock of its [`Offsets`].
#[derive(Debug, Clone)]
pub(crate) struct Generation(Arc<AtomicU64>);

impl Generation {
    /// The change count now: read under the offsets' lock, it dates the epochs read under it.
    pub(crate) fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Whether the assignment has not changed since it was `generation`: every epoch read then is still
    /// current.
    pub(crate) fn unchanged_since(&self, generation: u64) -> bool {
        self.0.load(Ordering::Acquire) == generation
    }
}

/// The offsets of the partitions assigned to one consumer.
#[derive(Debug, Default)]
pub(crate) struct Offsets {
    /// Looked up for every record read and every one settled: hashed with Fx (the keys are the
    /// assignment's own names).
    partitions: FxHashMap<Tp, Partition>,
    epochs: u64,
    /// Counts the changes of the assignment (every assign and revoke), readable without the lock that
    /// guards the rest: a record read while it was `g` is still its partition's current epoch's as long
    /// as it is `g` — the check the runtime makes for every record, without the lock.
    changes: Arc<AtomicU64>,
}

impl Offsets {
    /// `tp` was assigned: a new epoch starts for it.
    pub(crate) fn assigned(&mut self, tp: Tp) {
        self.changes.fetch_add(1, Ordering::Release);
        self.epochs += 1;
        self.partitions.insert(
            tp,
            Partition {
                epoch: self.epochs,
                in_flight: InFlight::default(),
                next: None,
                first: None,
                committed: None,
                revoking: false,
            },
        );
    }

    /// The shared name of `topic`, if one of its partitions is assigned.
    pub(crate) fn topic(&self, topic: &str) -> Option<Arc<str>> {
        self.partitions
            .keys()
            .find(|(t, _)| &**t == topic)
            .map(|(t, _)| t.clone())
    }

    /// `tp` was revoked: later settles for it are ignored.
    pub(crate) fn revoked(&mut self, tp: &Tp) {
        self.changes.fetch_add(1, Ordering::Release);
        self.partitions.remove(tp);
    }

    /// `tp` is being revoked: its records received but not yet handed to the runtime are no longer
    /// current ([`Offsets::is_current`]), so whoever holds them gives them back ([`Offsets::give_back`])
    /// instead of handling them, and the revocation waits only for the work already handed out.
    pub(crate) fn revoking(&mut self, tp: &Tp) {
        if let Some(p) = self.partitions.get_mut(tp) {
            self.changes.fetch_add(1, Ordering::Release);
            p.revoking = true;
        }
    }

    /// Offset `offset` of `tp`, received in `epoch` and not current any more, is given up unhandled:
    /// [`Offsets::unread`] if that epoch is still `tp`'s (the partition is being revoked); nothing if
    /// the epoch is over (its offsets were let go with it).
    pub(crate) fn give_back(&mut self, tp: &Tp, offset: i64, epoch: u64) {
        if self.partitions.get(tp).is_some_and(|p| p.epoch == epoch) {
            self.unread(tp, offset);
        }
    }

    /// The change count, shared: [`Generation::unchanged_since`] reads it without this struct's lock.
    pub(crate) fn changes(&self) -> Generation {
        Generation(self.changes.clone())
    }

    /// Whether `epoch` is the current assignment of `tp`, and `tp` is not being revoked.
    pub(crate) fn is_current(&self, tp: &Tp, epoch: u64) -> bool {
        self.partitions
            .get(tp)
            .is_some_and(|p| p.epoch == epoch && !p.revoking)
    }

    /// Offset `offset` of `tp` was received and is in flight; its epoch, or `None` if `tp` is not
    /// assigned (a record from a partition already revoked).
    pub(crate) fn received(&mut self, tp: &Tp, offset: i64) -> Option<u64> {
        let p = self.partitions.get_mut(tp)?;
        p.in_flight.insert(offset);
        p.next = Some(p.next.map_or(offset + 1, |n| n.max(offset + 1)));
        p.first = Some(p.first.map_or(offset, |f| f.min(offset)));
        Some(p.epoch)
    }

    /// Offset `offset` of `tp` was received but never handed out, and is given up (its partition is being
    /// revoked): it is no longer waited for, and the commit point does not pass it.
    pub(crate) fn unread(&mut self, tp: &Tp, offset: i64) {
        if let Some(p) = self.partitions.get_mut(tp) {
            p.in_flight.remove(offset);
            p.next = Some(p.next.map_or(offset, |n| n.min(offset)));
        }
    }

    /// Offset `offset` of `tp`, received in `epoch`, is settled; `false` when that epoch is over.
    pub(crate) fn settled(&mut self, tp: &Tp, offset: i64, epoch: u64) -> bool {
        match self.partitions.get_mut(tp) {
            Some(p) if p.epoch == epoch => {
                p.in_flight.remove(offset);
                true
            }
            _ => false,
        }
    }

    /// Offset `offset` of `tp`, settled in `epoch`, is in flight again: what settled it did not take
    /// effect (a copy whose transaction aborted for good). `false` when that epoch is over.
    pub(crate) fn unsettle(&mut self, tp: &Tp, offset: i64, epoch: u64) -> bool {
        match self.partitions.get_mut(tp) {
            Some(p) if p.epoch == epoch => {
                p.in_flight.insert(offset);
                true
            }
            _ => false,
        }
    }

    /// How many offsets of `tp` are in flight.
    pub(crate) fn in_flight(&self, tp: &Tp) -> usize {
        self.partitions.get(tp).map_or(0, |p| p.in_flight.len())
    }

    fn point(p: &Partition) -> Option<i64> {
        p.in_flight.first().or(p.next)
    }

    /// The positions to commit (those that moved since the last call, restricted to `only` if given),
    /// marked as committed.
    pub(crate) fn take_commits(&mut self, only: Option<&[Tp]>) -> Vec<(Tp, i64)> {
        self.commits(only, false)
    }

    /// Every commit point of the partitions in `only` (all, if `None`), also those already handed to an
    /// asynchronous commit: before a partition is let go (revoke, close) its position is committed
    /// synchronously whatever an asynchronous commit still in flight does, because if that one fails
    /// the partition is no longer ours to commit again, and its new owner would repeat what was done.
    pub(crate) fn final_commits(&mut self, only: Option<&[Tp]>) -> Vec<(Tp, i64)> {
        self.commits(only, true)
    }

    fn commits(&mut self, only: Option<&[Tp]>, again: bool) -> Vec<(Tp, i64)> {
        let mut out = Vec::new();
        for (tp, p) in &mut self.partitions {
            if only.is_some_and(|o| !o.contains(tp)) {
                continue;
            }
            if let Some(point) = Self::point(p)
                && (again || p.committed != Some(point))
            {
                p.committed = Some(point);
                out.push((tp.clone(), point));
            }
        }
        out
    }

    /// Whether one of `commits` moves its partition past a record settled in this assignment (and not
    /// only to the first record it received, which settles nothing). The broker tests' crash point
    /// "settled, not committed" is reached only then.
    #[cfg(feature = "failpoints")]
    pub(crate) fn passes_settled(&self, commits: &[(Tp, i64)]) -> bool {
        commits.iter().any(|(tp, point)| {
            self.partitions
                .get(tp)
                .and_then(|p| p.first)
                .is_some_and(|first| *point > first)
        })
    }

    /// Forgets that the positions in `failed` were committed, so they are tried again.
    pub(crate) fn commit_failed(&mut self, failed: &[(Tp, i64)]) {
        for (tp, point) in failed {
            if let Some(p) = self.partitions.get_mut(tp)
                && p.committed == Some(*point)
            {
                p.committed = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> Tp {
        (Arc::from("t"), p)
    }

    #[test]
    fn the_generation_moves_with_every_assign_and_revoke_only() {
        let mut o = Offsets::default();
        let changes = o.changes();
        o.assigned(tp(0));
        let g = changes.now();
        assert!(changes.unchanged_since(g));
        let e = o.received(&tp(0), 1).unwrap_or_default();
        o.settled(&tp(0), 1, e);
        o.take_commits(None);
        assert!(
            changes.unchanged_since(g),
            "reads, settles and commits change no epoch"
        );
        o.revoked(&tp(0));
        assert!(
            !changes.unchanged_since(g),
            "a revoke ends the epoch read at g"
        );
        let g = changes.now();
        o.assigned(tp(0));
        assert!(!changes.unchanged_since(g), "an assign starts a new epoch");
    }

    #[test]
    fn records_of_a_partition_being_revoked_are_given_back_and_not_waited_for() {
        let mut o = Offsets::default();
        let changes = o.changes();
        o.assigned(tp(0));
        o.assigned(tp(1));
        let e0 = o.received(&tp(0), 10).unwrap_or_default();
        for offset in 11..=13 {
            o.received(&tp(0), offset);
        }
        let e1 = o.received(&tp(1), 5).unwrap_or_default();
        let g = changes.now();
        o.revoking(&tp(0));
        assert!(!changes.unchanged_since(g), "holders of records look again");
        assert!(!o.is_current(&tp(0), e0), "tp 0's records are given back");
        assert!(o.is_current(&tp(1), e1), "tp 1 stays");
        // 10 was handed out and settles; 11 settles; 12 and 13 were still waiting: given back.
        assert!(o.settled(&tp(0), 10, e0), "work handed out still settles");
        o.settled(&tp(0), 11, e0);
        o.give_back(&tp(0), 13, e0);
        o.give_back(&tp(0), 12, e0);
        assert_eq!(o.in_flight(&tp(0)), 0, "nothing left to wait for");
        assert_eq!(
            o.final_commits(Some(&[tp(0)])),
            vec![(tp(0), 12)],
            "the new owner starts at the first record given back"
        );
        // A record of an epoch already over is given back to nobody.
        o.revoked(&tp(0));
        o.assigned(tp(0));
        let again = o.received(&tp(0), 20).unwrap_or_default();
        o.give_back(&tp(0), 14, e0);
        assert_eq!(o.in_flight(&tp(0)), 1);
        assert!(o.is_current(&tp(0), again));
    }

    #[test]
    fn commits_stop_at_the_lowest_offset_in_flight() {
        let mut o = Offsets::default();
        o.assigned(tp(0));
        let e = o.received(&tp(0), 10).unwrap_or_default();
        o.received(&tp(0), 11);
        o.received(&tp(0), 12);
        assert_eq!(o.take_commits(None), vec![(tp(0), 10)]);
        assert!(o.settled(&tp(0), 11, e));
        assert!(o.take_commits(None).is_empty(), "10 is still in flight");
        o.settled(&tp(0), 10, e);
        assert_eq!(o.take_commits(None), vec![(tp(0), 12)]);
        o.settled(&tp(0), 12, e);
        assert_eq!(o.take_commits(None), vec![(tp(0), 13)]);
        assert_eq!(o.in_flight(&tp(0)), 0);
    }

    #[test]
    fn an_unsettled_offset_holds_the_commit_point_again() {
        let mut o = Offsets::default();
        o.assigned(tp(0));
        let e = o.received(&tp(0), 3).unwrap_or_default();
        o.received(&tp(0), 4);
        o.settled(&tp(0), 3, e);
        o.settled(&tp(0), 4, e);
        let failed = o.take_commits(None);
        assert_eq!(failed, vec![(tp(0), 5)]);
        // The transaction carrying 4's copy aborted for good: 4 is in flight again.
        o.commit_failed(&failed);
        assert!(o.unsettle(&tp(0), 4, e));
        assert_eq!(o.take_commits(None), vec![(tp(0), 4)]);
        assert_eq!(o.in_flight(&tp(0)), 1);
        o.revoked(&tp(0));
        assert!(!o.unsettle(&tp(0), 4, e), "not this member's any more");
    }

    #[test]
    fn settles_of_a_revoked_epoch_are_ignored() {
        let mut o = Offsets::default();
        o.assigned(tp(1));
        let old = o.received(&tp(1), 5).unwrap_or_default();
        o.revoked(&tp(1));
        assert!(!o.settled(&tp(1), 5, old));
        assert_eq!(o.received(&tp(1), 6), None, "not assigned");
        o.assigned(tp(1));
        assert!(!o.is_current(&tp(1), old));
        assert!(!o.settled(&tp(1), 5, old));
        assert!(o.take_commits(None).is_empty());
    }

    #[test]
    fn records_given_up_unread_hold_the_commit_point() {
        let mut o = Offsets::default();
        o.assigned(tp(0));
        let e = o.received(&tp(0), 7).unwrap_or_default();
        o.received(&tp(0), 8);
        o.received(&tp(0), 9);
        // 8 and 9 were never handed out; 7 was, and is settled.
        o.unread(&tp(0), 9);
        o.unread(&tp(0), 8);
        assert_eq!(o.in_flight(&tp(0)), 1);
        o.settled(&tp(0), 7, e);
        assert_eq!(o.in_flight(&tp(0)), 0);
        assert_eq!(o.take_commits(None), vec![(tp(0), 8)]);
    }

    #[test]
    fn failed_commits_are_tried_again() {
        let mut o = Offsets::default();
        o.assigned(tp(0));
        o.assigned(tp(1));
        o.received(&tp(0), 1);
        o.received(&tp(1), 1);
        let only = [tp(1)];
        let c = o.take_commits(Some(&only));
        assert_eq!(c, vec![(tp(1), 1)]);
        o.commit_failed(&c);
        assert_eq!(o.take_commits(Some(&only)), vec![(tp(1), 1)]);
        assert!(
            o.take_commits(Some(&only)).is_empty(),
            "already handed to a commit"
        );
        assert_eq!(
            o.final_commits(Some(&only)),
            vec![(tp(1), 1)],
            "a partition let go commits its position again"
        );
    }

    #[cfg(feature = "failpoints")]
    #[test]
    fn a_commit_of_the_first_record_received_passes_nothing_settled() {
        let tp: Tp = (Arc::from("t"), 0);
        let mut o = Offsets::default();
        o.assigned(tp.clone());
        let epoch = o.received(&tp, 7).unwrap_or_default();
        o.received(&tp, 8);
        let commits = o.take_commits(None);
        assert_eq!(commits, vec![(tp.clone(), 7)]);
        assert!(!o.passes_settled(&commits), "nothing is settled yet");
        assert!(o.settled(&tp, 7, epoch));
        let commits = o.take_commits(None);
        assert_eq!(commits, vec![(tp.clone(), 8)]);
        assert!(o.passes_settled(&commits));
    }
}
