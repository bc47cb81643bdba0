//! The consumer's librdkafka callbacks: rebalances, failed asynchronous commits and statistics.
//!
//! librdkafka calls them inside a poll of the consumer thread. Losing partitions in a rebalance, the
//! member first waits (up to `revoke_grace`) for the work in flight on them, commits it, and forgets
//! them, so a settle that comes later never commits for a partition this member no longer owns. Kept
//! apart from the loop that polls because they run in the middle of it, and a revocation is where a
//! member's work changes hands.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{debug, warn};

use crate::consumer::context::{Context, State};
use crate::consumer::offsets::Tp;

impl ClientContext for Context {
    fn stats(&self, statistics: Statistics) {
        self.brokers.observe(&statistics);
    }
}

impl ConsumerContext for Context {
    /// rdkafka's rebalance, with the start of each new partition that has no committed offset named.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        crate::consumer::start::rebalance(self, consumer, err, partitions, self.reset);
    }

    /// An asynchronous commit that failed (e.g. during a rebalance) is tried again with the next one.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(e) = result {
            debug!(error = %e, "commit failed; it is tried again");
            let failed: Vec<(Tp, i64)> = offsets
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some(((Arc::from(e.topic()), e.partition()), o)),
                    _ => None,
                })
                .collect();
            self.lock().offsets.commit_failed(&failed);
        }
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let revoked: Vec<Tp> = tpl
            .elements()
            .iter()
            .map(|e| (Arc::from(e.topic()), e.partition()))
            .collect();
        {
            // Records read but never handed out are not waited for: their new owner reads them again
            // (the commit point goes back to the first of them). Those in the hand-off channels and
            // the subscription's current batch are given back by the subscription once it sees the
            // partitions marked (`KafkaSubscription::sweep`): the wait below is for the work the
            // runtime has, not for up to 32 batches queued ahead of it.
            let mut state = self.lock();
            let State {
                pending,
                priority,
                offsets,
                reassigned,
                ..
            } = &mut *state;
            for queue in [pending, priority] {
                queue.retain(|r| {
                    let keep = !revoked.contains(&r.tp);
                    if !keep {
                        offsets.unread(&r.tp, r.offset);
                    }
                    keep
                });
            }
            for tp in &revoked {
                offsets.revoking(tp);
            }
            *reassigned = true;
        }
        if !consumer.assignment_lost() {
            // Let the work handed out on these partitions finish and commit it, unless the runtime holds
            // consumption (a blocking hold may last long; that record is simply consumed again).
            let deadline = Instant::now() + self.revoke_grace;
            loop {
                let busy = {
                    let state = self.lock();
                    !state.held_by_runtime
                        && !state.closing
                        && revoked.iter().any(|tp| state.offsets.in_flight(tp) > 0)
                };
                if !busy || Instant::now() > deadline {
                    break;
                }
                // A close asked for meanwhile ends the wait and is seen again by the main loop.
                self.serve_commands(consumer, Duration::from_millis(20));
            }
            self.commit_before_letting_go(consumer, Some(&revoked));
        }
        self.let_go(Some(&revoked));
        debug!(partitions = ?revoked, "partitions revoked");
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                self.joined.store(true, Ordering::Release);
                let mut state = self.lock();
                state.reassigned = true;
                for e in tpl.elements() {
                    state
                        .offsets
                        .assigned((Arc::from(e.topic()), e.partition()));
                }
                let paused = state.paused;
                drop(state);
                // librdkafka keeps an application's pause of a partition across its revocation, so a
                // partition coming back may still be paused: set every assigned one as it should be.
                let result = if paused {
                    consumer.pause(tpl)
                } else {
                    consumer.resume(tpl)
                };
                if let Err(e) = result {
                    warn!(error = %e, "pausing or resuming newly assigned partitions failed");
                }
                debug!(partitions = tpl.count(), "partitions assigned");
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }
}
