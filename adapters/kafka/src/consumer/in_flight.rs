//! The offsets of one partition still in flight, lowest first.
//!
//! Every record read is added and every settle removes one, on the consumer thread, so this is on the
//! hot path twice per record. Offsets come in ascending order and settle nearly in order, which a
//! sorted ring serves without an allocation per offset: a read is a push at the back, a settle marks
//! its entry (found at the front, or by binary search) and drops the settled entries that reached the
//! front. A `BTreeSet` did the same with a node allocation and a rebalance now and then, which showed in the
//! SDK's CPU per record.
//!
//! An offset settled behind one still in flight (a slow handler, a held retry) stays as a settled
//! entry until the front moves; once settled entries outnumber the unsettled ones by
//! [`InFlight::COMPACT_ABOVE`], they are dropped in one pass, so memory stays proportional to what is
//! really in flight.

use std::collections::VecDeque;

/// Offsets in flight, lowest first.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    /// Offsets, ascending, each with whether it is settled. The front entry is never settled.
    entries: VecDeque<(i64, bool)>,
    /// How many entries are not settled.
    unsettled: usize,
}

impl InFlight {
    /// Settled entries are dropped in one pass once all entries number more than twice the unsettled
    /// ones plus this (settled ones outnumber the unsettled by more than this).
    const COMPACT_ABOVE: usize = 1024;

    /// `offset` is in flight (again); nothing changes if it is already.
    pub(crate) fn insert(&mut self, offset: i64) {
        if self.entries.back().is_none_or(|&(last, _)| last < offset) {
            self.entries.push_back((offset, false));
            self.unsettled += 1;
            return;
        }
        match self.entries.binary_search_by_key(&offset, |&(o, _)| o) {
            Ok(i) => {
                if std::mem::replace(&mut self.entries[i].1, false) {
                    self.unsettled += 1;
                }
            }
            Err(i) => {
                self.entries.insert(i, (offset, false));
                self.unsettled += 1;
            }
        }
    }

    /// `offset` is no longer in flight; nothing changes if it was not.
    pub(crate) fn remove(&mut self, offset: i64) {
        let at = match self.entries.front() {
            Some(&(first, _)) if first == offset => 0,
            _ => match self.entries.binary_search_by_key(&offset, |&(o, _)| o) {
                Ok(i) => i,
                Err(_) => return,
            },
        };
        if std::mem::replace(&mut self.entries[at].1, true) {
            return;
        }
        self.unsettled -= 1;
        while self.entries.front().is_some_and(|&(_, settled)| settled) {
            self.entries.pop_front();
        }
        if self.entries.len() > 2 * self.unsettled + Self::COMPACT_ABOVE {
            self.entries.retain(|&(_, settled)| !settled);
        }
    }

    /// The lowest offset in flight.
    pub(crate) fn first(&self) -> Option<i64> {
        self.entries.front().map(|&(offset, _)| offset)
    }

    /// How many offsets are in flight.
    pub(crate) fn len(&self) -> usize {
        self.unsettled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The same operations on an `InFlight` and on a `BTreeSet`, checked against each other after each.
    struct Both {
        ring: InFlight,
        model: BTreeSet<i64>,
    }

    impl Both {
        fn new() -> Self {
            Self {
                ring: InFlight::default(),
                model: BTreeSet::new(),
            }
        }

        fn insert(&mut self, offset: i64) {
            self.ring.insert(offset);
            self.model.insert(offset);
            self.check();
        }

        fn remove(&mut self, offset: i64) {
            self.ring.remove(offset);
            self.model.remove(&offset);
            self.check();
        }

        fn check(&self) {
            assert_eq!(self.ring.first(), self.model.first().copied());
            assert_eq!(self.ring.len(), self.model.len());
            assert!(
                self.ring
                    .entries
                    .front()
                    .is_none_or(|&(_, settled)| !settled),
                "the front entry is never a settled one"
            );
        }
    }

    #[test]
    fn settles_out_of_order_keep_the_lowest_offset_in_flight_first() {
        let mut both = Both::new();
        for offset in 10..15 {
            both.insert(offset);
        }
        both.remove(12);
        both.remove(11);
        assert_eq!(both.ring.first(), Some(10));
        both.remove(10);
        assert_eq!(
            both.ring.first(),
            Some(13),
            "11 and 12 were settled already"
        );
        both.remove(13);
        both.remove(14);
        assert_eq!(both.ring.first(), None);
        assert!(both.ring.entries.is_empty());
    }

    #[test]
    fn an_offset_inserted_again_or_below_the_rest_takes_its_place() {
        let mut both = Both::new();
        for offset in [5, 6, 7] {
            both.insert(offset);
        }
        both.remove(6);
        both.insert(6);
        both.insert(3);
        both.insert(7);
        both.remove(9);
        assert_eq!(both.ring.first(), Some(3));
        assert_eq!(both.ring.len(), 4);
    }

    #[test]
    fn settled_entries_behind_one_in_flight_are_dropped_once_they_outnumber_it() {
        let mut ring = InFlight::default();
        ring.insert(0);
        let behind = 10 * InFlight::COMPACT_ABOVE as i64;
        for offset in 1..=behind {
            ring.insert(offset);
            ring.remove(offset);
        }
        assert_eq!(ring.first(), Some(0));
        assert_eq!(ring.len(), 1);
        assert!(
            ring.entries.len() <= 2 + InFlight::COMPACT_ABOVE + 1,
            "{} entries kept for one in flight",
            ring.entries.len()
        );
        ring.remove(0);
        assert_eq!((ring.first(), ring.len()), (None, 0));
    }

    #[test]
    fn any_mix_of_inserts_and_removes_agrees_with_an_ordered_set() {
        // A fixed pseudo-random walk: reads mostly ascending, settles anywhere in the window, now and
        // then an offset read again (an unsettle) or one given up unread.
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
        let mut both = Both::new();
        let mut read = 0i64;
        for _ in 0..200_000 {
            match next(10) {
                0..=4 => {
                    both.insert(read);
                    read += 1;
                }
                5..=8 => {
                    let window = u64::try_from(read.min(3_000)).unwrap_or(0).max(1);
                    both.remove(read - 1 - i64::try_from(next(window)).unwrap_or(0));
                }
                _ => both.insert(read - i64::try_from(next(50)).unwrap_or(0)),
            }
        }
    }
}
