//! Committing the settled offsets: plainly, or in one transaction with the retry and DLQ copies of the
//! records they pass, and letting partitions go.
//!
//! Receipts report settled offsets into the shared state (no wake-up per settle); the thread commits
//! each partition's contiguous settled prefix (see [`crate::consumer::offsets`]). With transactional
//! hops a retry or DLQ copy is handed to the thread with its settle, and a commit that passes a record
//! with a copy is one transaction carrying both (see [`crate::consumer::txn`]); the receipt returns once
//! it is committed. A copy whose offset a commit cannot reach within [`STRANDED_AFTER`] is committed
//! without it. Kept apart from the thread's loop, which only says when to commit, because what a
//! commit carries and what a failed one leaves behind is where a record could be lost or copied twice.

use std::time::{Duration, Instant};

use event_retry_core::error::Error;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, warn};

use crate::consumer::context::Context;
use crate::consumer::offsets::Tp;
use crate::consumer::txn::{PendingCopy, SharedTxnProducer, StagedCopy};

/// Transactions that may fail in a row before their copies are answered with the error.
const TRANSACTION_TRIES: u32 = 3;

/// How long commits carrying copies wait after a transaction failed before the next try.
const TRANSACTION_BACKOFF: Duration = Duration::from_secs(1);

/// How long a copy waits for a commit that passes its record before it goes in a transaction without
/// that offset. An earlier record of the partition can stay unsettled until this copy's settle returns
/// — the runtime holding consumption for an unwritable DLQ hands out the records it gave back only
/// once the DLQ copy is accepted — so waiting for the offset without bound can wait forever. Such a
/// copy is committed alone; a crash before its offset follows copies the record again (never loses it).
const STRANDED_AFTER: Duration = Duration::from_secs(1);

impl Context {
    /// A receipt settled `offset` of `tp`, read in `epoch`, with `copy` to be produced in the transaction
    /// that commits past it; the answer comes once that transaction committed, or failed for good: the
    /// broker refused the copy itself (the record is then unsettled again, for the runtime to release),
    /// or the partition moved to another member (which consumes the record again) or the consumer
    /// closed.
    pub(crate) fn settled_with_copy(
        &self,
        tp: &Tp,
        offset: i64,
        epoch: u64,
        copy: StagedCopy,
    ) -> tokio::sync::oneshot::Receiver<Result<(), Error>> {
        let (done, outcome) = tokio::sync::oneshot::channel();
        let mut state = self.lock();
        if state.offsets.settled(tp, offset, epoch) {
            state.copies.push(PendingCopy {
                tp: tp.clone(),
                offset,
                epoch,
                since: Instant::now(),
                copy,
                done,
            });
            drop(state);
            // The thread's wait ends for the transaction to start now, not at its next look.
            if let Some(waker) = self.waker.get() {
                waker.wake();
            }
        } else {
            let _ = done.send(Err(moved(tp)));
        }
        outcome
    }

    /// Commits the settled prefixes (of `only`, if given) not committed yet, without waiting.
    pub(super) fn commit(
        &self,
        consumer: &BaseConsumer<Context>,
        only: Option<&[Tp]>,
        mode: CommitMode,
    ) {
        let commits = self.lock().offsets.take_commits(only);
        self.send_commits(consumer, commits, mode);
    }

    /// Commits the settled prefixes of partitions being let go (of `only`, if given) and waits for the
    /// broker, also where an asynchronous commit of the same position is still in flight.
    pub(super) fn commit_before_letting_go(
        &self,
        consumer: &BaseConsumer<Context>,
        only: Option<&[Tp]>,
    ) {
        let commits = self.lock().offsets.final_commits(only);
        self.send_commits(consumer, commits, CommitMode::Sync);
    }

    pub(super) fn send_commits(
        &self,
        consumer: &BaseConsumer<Context>,
        mut commits: Vec<(Tp, i64)>,
        mode: CommitMode,
    ) {
        if let Some(txn) = &self.txn {
            let copies = self.copies_due(&commits);
            if !copies.is_empty() {
                // The partitions with copies commit in the transaction; the others go on plainly,
                // whatever becomes of it.
                let (with, without): (Vec<Commit>, Vec<Commit>) = commits
                    .into_iter()
                    .partition(|(tp, _)| copies.iter().any(|c| c.tp == *tp));
                self.commit_in_transaction(txn, consumer, &with, copies);
                commits = without;
            }
        }
        if commits.is_empty() {
            return;
        }
        // A process that dies here has settled (and copied) records and not committed them; a commit of
        // the first record received settles nothing, and is not that crash point.
        #[cfg(feature = "failpoints")]
        if self.lock().offsets.passes_settled(&commits) {
            failpoint!("kafka-before-commit", |_| std::process::abort());
        }
        if let Err(e) = consumer.commit(&offset_list(&commits), mode) {
            debug!(error = %e, "commit failed; it is tried again");
            self.lock().offsets.commit_failed(&commits);
        }
    }

    /// Takes the copies waiting of the records `commits` pass, and those stranded: waiting longer than
    /// [`STRANDED_AFTER`] for a commit that passes their record.
    pub(super) fn copies_due(&self, commits: &[(Tp, i64)]) -> Vec<PendingCopy> {
        let mut state = self.lock();
        let (due, rest): (Vec<PendingCopy>, Vec<PendingCopy>) = std::mem::take(&mut state.copies)
            .into_iter()
            .partition(|c| {
                c.since.elapsed() >= STRANDED_AFTER
                    || commits
                        .iter()
                        .any(|(tp, point)| *tp == c.tp && c.offset < *point)
            });
        state.copies = rest;
        due
    }

    /// Commits `commits` with `copies` in one transaction and answers each copy's receipt; after a
    /// failure the copies wait for the next commit, and the offsets are tried again with them.
    pub(super) fn commit_in_transaction(
        &self,
        txn: &SharedTxnProducer,
        consumer: &BaseConsumer<Context>,
        commits: &[(Tp, i64)],
        copies: Vec<PendingCopy>,
    ) {
        let tpl = offset_list(commits);
        let retry_at = self.lock().transaction_retry_at;
        let outcome = match (retry_at, consumer.group_metadata()) {
            (Some(at), _) if Instant::now() < at => Err(None),
            (_, None) => Err(None),
            (_, Some(group)) => {
                let records: Vec<&StagedCopy> = copies.iter().map(|c| &c.copy).collect();
                let mut producer = txn.producer.lock().unwrap_or_else(|p| p.into_inner());
                producer
                    .commit(&txn.link, &records, &tpl, &group)
                    .map_err(Some)
            }
        };
        // A process that dies here has committed copies whose offsets the transaction did not carry
        // (stranded ones, see `STRANDED_AFTER`): their records are consumed and copied again.
        #[cfg(feature = "failpoints")]
        if outcome.is_ok()
            && copies.iter().any(|c| {
                !commits
                    .iter()
                    .any(|(tp, point)| *tp == c.tp && c.offset < *point)
            })
        {
            failpoint!("kafka-after-stranded-commit", |_| std::process::abort());
        }
        let mut state = self.lock();
        match outcome {
            Ok(()) => {
                state.transaction_retry_at = None;
                state.transaction_failures = 0;
                drop(state);
                for c in copies {
                    let _ = c.done.send(Ok(()));
                }
            }
            Err(aborted) => {
                state.offsets.commit_failed(commits);
                let mut refused = Vec::new();
                let mut again = Vec::new();
                match aborted {
                    None => again = copies,
                    Some(aborted) => {
                        warn!(error = %aborted.error, "a transaction of copies and offsets failed");
                        // A copy the broker refused (answered below, without it the transaction can
                        // commit) is not the transaction's failure: the others go again at once and
                        // count no failure, so one refused copy (a DLQ that takes no more) does not
                        // fail the retry copies beside it.
                        let refused_copy =
                            aborted.copies.iter().flatten().any(|e| !e.is_temporary());
                        if !refused_copy {
                            state.transaction_retry_at = Some(Instant::now() + TRANSACTION_BACKOFF);
                            state.transaction_failures += 1;
                        }
                        // Transactions that keep failing (the broker unreachable, transactions
                        // refused) answer their copies with the error, as a send that fails would:
                        // the runtime then holds, releases or tries again, and the failure shows.
                        let give_up = state.transaction_failures >= TRANSACTION_TRIES;
                        if give_up {
                            state.transaction_failures = 0;
                        }
                        for (c, e) in copies.into_iter().zip(aborted.copies) {
                            match e {
                                // The broker refused this copy: it will not take it by trying again.
                                Some(e) if !e.is_temporary() => refused.push((c, e)),
                                _ if give_up => refused.push((
                                    c,
                                    Error::new(aborted.error.kind(), aborted.error.to_string())
                                        .temporary(aborted.error.is_temporary()),
                                )),
                                _ => again.push(c),
                            }
                        }
                    }
                }
                for (c, _) in &refused {
                    state.offsets.unsettle(&c.tp, c.offset, c.epoch);
                }
                again.append(&mut state.copies);
                state.copies = again;
                drop(state);
                for (c, e) in refused {
                    let _ = c.done.send(Err(e));
                }
            }
        }
    }

    /// Lets partitions go (all of them, closing): their copies waiting are answered with an error and
    /// their records unsettled again — so no commit, the one leaving the group makes included, passes a
    /// record whose copy was not produced; whoever owns the partitions next consumes them again — and
    /// revoked partitions are forgotten in the same step, so no copy arrives in between.
    pub(super) fn let_go(&self, only: Option<&[Tp]>) {
        let dropped: Vec<PendingCopy> = {
            let mut state = self.lock();
            let (dropped, kept): (Vec<PendingCopy>, Vec<PendingCopy>) =
                std::mem::take(&mut state.copies)
                    .into_iter()
                    .partition(|c| only.is_none_or(|tps| tps.contains(&c.tp)));
            state.copies = kept;
            for c in &dropped {
                state.offsets.unsettle(&c.tp, c.offset, c.epoch);
            }
            // Closing, the partitions stay: the revoke that leaving the group brings commits what was
            // settled meanwhile, never past a record unsettled here.
            for tp in only.unwrap_or_default() {
                state.offsets.revoked(tp);
            }
            dropped
        };
        for c in dropped {
            let _ = c.done.send(Err(moved(&c.tp)));
        }
    }
}

/// A partition and the offset to commit there.
type Commit = (Tp, i64);

/// `commits` as librdkafka's list of partition offsets.
fn offset_list(commits: &[(Tp, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in commits {
        if let Err(e) = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset)) {
            warn!(error = %e, "building a commit failed");
        }
    }
    tpl
}

/// The error of a copy whose record this member no longer owns.
fn moved(tp: &Tp) -> Error {
    Error::new(
        event_retry_core::error::Kind::Closed,
        format!(
            "{} partition {} is no longer this member's: its copy was not committed, and the record is consumed again",
            tp.0, tp.1
        ),
    )
}
