//! The consumer thread's wait for the runtime to take a batch while the hand-off channels are full,
//! and the runtime's take that ends it.
//!
//! Kept apart from the thread's loop because it is a handshake between two threads — the consumer
//! thread marks where it waits, the subscription's take wakes it there — whose ordering (a mark, a
//! fence, a look at the channels; room made, a fence, a look at the mark) is the whole point.

use std::sync::atomic::{Ordering, fence};
use std::time::Duration;

use crate::consumer::context::{Command, Context, room_wait};
use crate::consumer::handoff::{self, Senders};

/// How long the consumer thread waits for the runtime to take a batch before it looks again; a batch
/// taken once at most half the source channel is queued ends the wait sooner ([`Context::room_made`]).
/// A wake the handshake misses (see [`Context::expect_room`]) costs at most this.
pub(super) const ROOM_WAIT: Duration = Duration::from_millis(1);

/// How many source batches may still wait in their channel when the runtime's take wakes the thread:
/// it then hands out several at once, not one per wake.
const ROOM_WAKE_AT: usize = handoff::SOURCE_BATCHES / 2;

impl Context {
    /// Marks the consumer thread as about to wait for room (`kind`: where it waits), unless the runtime
    /// took a batch since the thread found the channels full: returns whether to wait. The mark is set,
    /// then a fence, then the channels are looked at; [`Context::room_made`] frees room, fences, then
    /// reads the mark — so a batch taken in between is either seen here or wakes the wait.
    pub(super) fn expect_room(&self, out: &Senders, kind: u8) -> bool {
        self.room_wait.store(kind, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let room = {
            let state = self.lock();
            (!state.priority.is_empty() && out.retries.capacity() > 0)
                || (!state.pending.is_empty() && out.source.capacity() > 0)
        };
        if room {
            self.room_wait.store(room_wait::NONE, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Ends a wait marked by [`Context::expect_room`] (a wake that comes later ends the next wait early:
    /// one extra turn of the loop).
    pub(super) fn room_wait_over(&self) {
        self.room_wait.store(room_wait::NONE, Ordering::SeqCst);
    }

    /// Called by the subscription each time it takes a batch, `queued` source batches left: once half
    /// the source channel is free, ends the consumer thread's wait for room, if it waits for it, so the
    /// thread hands out more now rather than at its wait's timeout (and several batches per wake, not
    /// one). Costs a comparison per batch, and an atomic swap once half is free.
    pub(crate) fn room_made(&self, commands: &std::sync::mpsc::Sender<Command>, queued: usize) {
        if queued > ROOM_WAKE_AT {
            return;
        }
        // Pairs with the fence in `expect_room` (the channel's own counts are not sequentially
        // consistent).
        fence(Ordering::SeqCst);
        match self.room_wait.swap(room_wait::NONE, Ordering::SeqCst) {
            room_wait::COMMANDS => {
                // A closed channel means the thread has gone: nothing to wake.
                let _ = commands.send(Command::Room);
            }
            room_wait::SOURCE => {
                if let Some(waker) = self.waker.get() {
                    waker.wake();
                }
            }
            _ => {}
        }
    }
}
