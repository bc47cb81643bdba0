//! The delay ladder's consumer: moves each record to its next level, or to its retry topic once due.
//!
//! Every subscription runs one member of the topic's ladder group on a thread of its own. Within one
//! partition of one level every record waits the same time, so the head is always the first due: when it
//! is not due yet the partition is paused and the head held in memory (uncommitted) until its time — a
//! deadline the polling loop wakes for, never a sleep — while the loop keeps polling, so the membership
//! holds and the other partitions go on. Due records are produced in batches; the offsets are committed
//! (synchronously) only after every record before them was acknowledged, so a crash at any point leaves
//! each record either still in its level or already in the next one. A record produced twice (a crash
//! between the acknowledgement and the commit) is possible; a record lost is not. With transactional
//! hops a batch's forwards and its offsets are one transaction (see [`crate::consumer::txn`]), and a crash leaves
//! each record in exactly one place.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use event_retry_core::error::{Error, Kind, wrap};
use event_retry_core::time::Timestamp;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::producer::DeliveryFuture;
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use tracing::{debug, warn};

use crate::codec::{self, Decoded};
use crate::consumer::offsets::Tp;
use crate::consumer::txn::{StagedCopy, TxnProducer};
use crate::ladder::{Hop, next_hop};
use crate::link::{Link, delivered};
use crate::stranding::{BrokerWatch, report_statistics};

/// The most records forwarded in one batch.
const BATCH: usize = 500;
/// After this many tries (a second apart) to forward a record whose destination topic does not exist
/// (its group's retry topic was deleted), the record goes to the source's DLQ instead, so it does not
/// hold up its ladder partition for ever.
const MISSING_TARGET_TRIES: u32 = 30;
/// The longest a ladder consumer's fetch waits at the broker for new records, in ms.
const LADDER_FETCH_WAIT_MS: &str = "20";
/// How long a record whose forwarding failed waits before it is tried again.
const FORWARD_BACKOFF: Duration = Duration::from_secs(1);

/// Holds `entry`, whose forward failed with `e`, as the first failed entry of its partition; a
/// destination that does not exist (by a fresh metadata answer) counts towards sending it to the DLQ.
fn failed_forward(failed: &mut HashMap<Tp, Vec<Entry>>, mut entry: Entry, e: &Error) {
    warn!(error = %e, topic = %entry.tp.0, partition = entry.tp.1, offset = entry.offset, "forwarding a delayed record failed; trying again");
    if e.kind() == Kind::NotFound && !e.is_temporary() {
        entry.missing_target += 1;
    }
    failed.insert(entry.tp.clone(), vec![entry]);
}

/// A ladder record and the copy that forwards it, in a transaction.
type Forward = (Entry, StagedCopy);

/// A ladder record read but not yet forwarded.
struct Entry {
    tp: Tp,
    offset: i64,
    decoded: Decoded,
    /// Set after a failed forward: not tried again before.
    not_before: Option<Timestamp>,
    /// Forwards that failed because the destination does not exist.
    missing_target: u32,
}

impl Entry {
    fn leave_at(&self) -> Timestamp {
        let hop = self
            .decoded
            .route
            .as_ref()
            .map_or(Timestamp::from_millis(0), |r| r.hop_due);
        match self.not_before {
            Some(t) if t > hop => t,
            _ => hop,
        }
    }
}

#[derive(Default)]
struct LadderState {
    /// Per paused partition, its head (not yet due) and what was read behind it.
    held: HashMap<Tp, VecDeque<Entry>>,
    /// Due records waiting to be forwarded, in the order read.
    ready: Vec<Entry>,
}

/// The ladder consumer's context: drops what it holds of partitions it loses, and watches whether
/// the consumer was left with no broker (see [`crate::stranding`]).
struct LadderContext {
    state: Mutex<LadderState>,
    /// Set at the first assignment (the member joined its group).
    joined: Arc<AtomicBool>,
    brokers: BrokerWatch,
    /// Where a newly assigned level partition with no committed offset starts (see [`crate::consumer::start`]).
    reset: Option<Offset>,
}

impl LadderContext {
    fn lock(&self) -> std::sync::MutexGuard<'_, LadderState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ClientContext for LadderContext {
    fn stats(&self, statistics: Statistics) {
        self.brokers.observe(&statistics);
    }
}

impl ConsumerContext for LadderContext {
    /// rdkafka's rebalance, with the start of each new partition that has no committed offset named.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        crate::consumer::start::rebalance(self, consumer, err, partitions, self.reset);
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.joined.store(true, Ordering::Release);
            // librdkafka keeps an application's pause of a partition across its revocation: a partition
            // this member held a head of, lost and got back would stay paused with nothing held.
            if let Err(e) = consumer.resume(tpl) {
                warn!(error = %e, "resuming newly assigned ladder partitions failed");
            }
        }
    }

    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut state = self.lock();
            for e in tpl.elements() {
                let tp: Tp = (Arc::from(e.topic()), e.partition());
                state.held.remove(&tp);
                state.ready.retain(|r| r.tp != tp);
            }
        }
    }
}

/// A running ladder consumer.
pub(crate) struct Ladder {
    /// Set once the member joined the ladder's group.
    pub(crate) joined: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ladder {
    /// Starts a member of `source`'s ladder group.
    pub(crate) fn start(link: Arc<Link>, source: &str) -> Result<Self, Error> {
        let joined = Arc::new(AtomicBool::new(false));
        let mut config = link.consumer_config(&link.config.ladder_group(source));
        // A resumed partition is fetched only once the fetch request in flight returns; a short wait
        // keeps the records behind a head that just left from waiting for it (500 ms by default).
        config.set("fetch.wait.max.ms", LADDER_FETCH_WAIT_MS);
        report_statistics(&mut config);
        let context = LadderContext {
            state: Mutex::new(LadderState::default()),
            joined: joined.clone(),
            brokers: BrokerWatch::new(&config, "ladder")?,
            reset: crate::consumer::start::reset_position(&config),
        };
        let consumer: BaseConsumer<LadderContext> = config
            .create_with_context(context)
            .map_err(crate::error::settings_error("consumer"))?;
        let levels = link.config.level_topics(source);
        let names: Vec<&str> = levels.iter().map(String::as_str).collect();
        consumer
            .subscribe(&names)
            .map_err(crate::error::error("subscribe to the ladder"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let transactional = link.config.transactional_hops.then(|| {
            TxnProducer::new(
                link.transactional.clone(),
                &link.config.ladder_group(source),
            )
        });
        let forwarder = Forwarder {
            link,
            source: source.to_string(),
            consumer,
            stop: stop.clone(),
            transactional,
        };
        let thread = std::thread::Builder::new()
            .name(format!("kafka-ladder-{source}"))
            .spawn(move || forwarder.run())
            .map_err(wrap(Kind::Other, "start the ladder thread"))?;
        Ok(Self {
            joined,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the consumer and waits for it to leave its group.
    pub(crate) async fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

impl Drop for Ladder {
    fn drop(&mut self) {
        // Dropped without `stop` (the subscription was dropped): the thread ends on its own.
        self.stop.store(true, Ordering::Release);
    }
}

struct Forwarder {
    link: Arc<Link>,
    source: String,
    consumer: BaseConsumer<LadderContext>,
    stop: Arc<AtomicBool>,
    /// Set with transactional hops: a batch's forwards and offsets are one transaction.
    transactional: Option<TxnProducer>,
}

impl Forwarder {
    fn state(&self) -> std::sync::MutexGuard<'_, LadderState> {
        self.consumer.context().lock()
    }

    fn run(mut self) {
        let mut resumed_again = std::time::Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            self.consumer.context().brokers.heal(self.consumer.client());
            self.resume_again(&mut resumed_again);
            let now = Timestamp::now();
            let next_due = self.release_due_heads(now);
            let wait = if !self.state().ready.is_empty() {
                Duration::ZERO
            } else {
                let until = next_due.map_or(Duration::MAX, |t| t.since(now));
                until.min(Duration::from_millis(50))
            };
            match self.consumer.poll(wait) {
                Some(Ok(message)) => {
                    let entry = Entry {
                        tp: (Arc::from(message.topic()), message.partition()),
                        offset: message.offset(),
                        decoded: codec::decode(&message),
                        not_before: None,
                        missing_target: 0,
                    };
                    drop(message);
                    self.place(entry, Timestamp::now());
                    if self.state().ready.len() < BATCH {
                        continue;
                    }
                }
                Some(Err(e)) => warn!(error = %e, ladder = %self.source, "ladder consumer error"),
                None => {}
            }
            self.flush();
        }
    }

    /// Queues a record read: behind its partition's held head, as ready, or as a new held head (the
    /// partition is then paused).
    fn place(&self, entry: Entry, now: Timestamp) {
        let mut state = self.state();
        if let Some(queue) = state.held.get_mut(&entry.tp) {
            queue.push_back(entry);
        } else if entry.leave_at() <= now {
            state.ready.push(entry);
        } else {
            let tp = entry.tp.clone();
            state.held.insert(tp.clone(), VecDeque::from([entry]));
            drop(state);
            self.pause(&tp, true);
        }
    }

    fn pause(&self, tp: &Tp, pause: bool) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&tp.0, tp.1);
        let result = if pause {
            self.consumer.pause(&tpl)
        } else {
            crate::consumer::pause::resume(&self.consumer, &tpl, "kafka-ladder-resume-discarded")
        };
        if let Err(e) = result {
            warn!(error = %e, topic = %tp.0, partition = tp.1, "pausing or resuming a ladder partition failed");
        }
    }

    /// Resumes again, at most once per [`crate::consumer::pause::RESUME_AGAIN_EVERY`] (`last` says when it last
    /// did), every assigned partition that holds no head: a resume librdkafka dropped as outdated would
    /// otherwise leave its level's later records unread for ever.
    fn resume_again(&self, last: &mut std::time::Instant) {
        if last.elapsed() < crate::consumer::pause::RESUME_AGAIN_EVERY {
            return;
        }
        *last = std::time::Instant::now();
        let Ok(assignment) = self.consumer.assignment() else {
            return;
        };
        let free = {
            let state = self.state();
            let mut free = TopicPartitionList::new();
            for e in assignment.elements() {
                let tp: Tp = (Arc::from(e.topic()), e.partition());
                if !state.held.contains_key(&tp) {
                    free.add_partition(e.topic(), e.partition());
                }
            }
            free
        };
        if free.count() > 0
            && let Err(e) = self.consumer.resume(&free)
        {
            warn!(error = %e, ladder = %self.source, "resuming the ladder's partitions again failed");
        }
    }

    /// Moves the due heads of held partitions to the ready list, resuming partitions with nothing left
    /// held; returns the earliest time a held head becomes due.
    fn release_due_heads(&self, now: Timestamp) -> Option<Timestamp> {
        let mut resume = Vec::new();
        let mut next_due = None;
        {
            let mut state = self.state();
            let LadderState { held, ready } = &mut *state;
            held.retain(|tp, queue| {
                while queue.front().is_some_and(|e| e.leave_at() <= now) {
                    if let Some(e) = queue.pop_front() {
                        ready.push(e);
                    }
                }
                match queue.front() {
                    Some(head) => {
                        let at = head.leave_at();
                        next_due = Some(next_due.map_or(at, |n: Timestamp| n.min(at)));
                        true
                    }
                    None => {
                        resume.push(tp.clone());
                        false
                    }
                }
            });
        }
        for tp in resume {
            self.pause(&tp, false);
        }
        next_due
    }

    /// Where a due entry goes next: the topic, and the routing headers it carries there.
    fn target(&self, entry: &Entry, now: Timestamp) -> (String, Vec<(&'static str, Vec<u8>)>) {
        let dlq = self.link.config.dlq_topic(&self.source);
        let Some(route) = &entry.decoded.route else {
            // Not a record the adapter wrote (no routing headers): keep it, in the DLQ.
            return (dlq, Vec::new());
        };
        if entry.missing_target >= MISSING_TARGET_TRIES {
            // Its retry topic is gone: keep it in the DLQ, with its group so a replay finds its way.
            let prefix = format!("{}{}", self.source, self.link.config.retry_infix);
            let group = route.to.strip_prefix(&prefix).unwrap_or(&route.to);
            tracing::error!(destination = %route.to, dlq = %dlq, "a delayed record's destination does not exist; it goes to the DLQ");
            return (
                dlq,
                vec![(
                    event_retry_core::metadata::names::GROUP,
                    group.as_bytes().to_vec(),
                )],
            );
        }
        match next_hop(
            now,
            // Handed over early by the lead; the consumer holds it to its due time.
            route.due.minus(self.link.config.handover_lead()),
            self.link.config.granularity,
            self.link.config.levels(),
        ) {
            Hop::Due => (route.to.clone(), Vec::new()),
            Hop::Level { level, leave_at } => {
                let next = codec::Route {
                    hop_due: leave_at,
                    ..route.clone()
                };
                (
                    self.link.config.level_topic(&self.source, level),
                    codec::route_headers(&next).to_vec(),
                )
            }
        }
    }

    fn start_forward(&self, entry: &Entry, now: Timestamp) -> Result<DeliveryFuture, Error> {
        let (topic, headers) = self.target(entry, now);
        self.link.partitions_blocking(&topic)?;
        let extra: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        self.link
            .start_send(
                &topic,
                Some(entry.tp.1),
                &entry.decoded.raw,
                &entry.decoded.nulls,
                &extra,
            )
            .map_err(crate::error::error(format!("forward to {topic}")))
            .map_err(|e| self.uncounted(e))
    }

    /// A send or delivery that says its topic does not exist is not counted towards sending the record
    /// to the DLQ: librdkafka says so from stale metadata too (while a broker restarts). The cached
    /// partition counts are dropped, so the next try asks the cluster afresh, and only that answer
    /// (`partitions_blocking`, a permanent [`Kind::NotFound`]) counts.
    fn uncounted(&self, e: Error) -> Error {
        if e.kind() == Kind::NotFound {
            self.link.forget_all();
            e.temporary(true)
        } else {
            e
        }
    }

    /// Forwards the ready records, then commits, per partition, the offsets up to the first failure;
    /// what failed (and what followed it in its partition) is held again for a while.
    fn flush(&mut self) {
        let ready = std::mem::take(&mut self.state().ready);
        if ready.is_empty() {
            return;
        }
        let now = Timestamp::now();
        if self.transactional.is_some() {
            return self.flush_in_transaction(ready, now);
        }
        let sends: Vec<Result<DeliveryFuture, Error>> =
            ready.iter().map(|e| self.start_forward(e, now)).collect();
        let results: Vec<Result<(), Error>> = futures::executor::block_on(async {
            let mut out = Vec::with_capacity(sends.len());
            for send in sends {
                out.push(match send {
                    Ok(delivery) => delivered(delivery.await, "forward a delayed record")
                        .map(drop)
                        .map_err(|e| self.uncounted(e)),
                    Err(e) => Err(e),
                });
            }
            out
        });
        let mut commits: HashMap<Tp, i64> = HashMap::new();
        let mut failed: HashMap<Tp, Vec<Entry>> = HashMap::new();
        for (entry, result) in ready.into_iter().zip(results) {
            if let Some(queue) = failed.get_mut(&entry.tp) {
                queue.push(entry);
                continue;
            }
            match result {
                Ok(()) => {
                    commits.insert(entry.tp.clone(), entry.offset + 1);
                }
                Err(e) => failed_forward(&mut failed, entry, &e),
            }
        }
        if !commits.is_empty() {
            let mut tpl = TopicPartitionList::new();
            for ((topic, partition), offset) in &commits {
                if let Err(e) = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))
                {
                    warn!(error = %e, "building a ladder commit failed");
                }
            }
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Sync) {
                // The records were forwarded; the next commit of the partition covers them, or a new
                // owner forwards them again (a duplicate, never a loss).
                debug!(error = %e, "ladder commit failed");
            }
        }
        self.hold_again(failed);
    }

    /// Holds again, for a while, the entries whose forward failed and what followed them in their
    /// partitions.
    fn hold_again(&self, failed: HashMap<Tp, Vec<Entry>>) {
        let again = Timestamp::now().plus(FORWARD_BACKOFF);
        for (tp, entries) in failed {
            {
                let mut state = self.state();
                let queue = state.held.entry(tp.clone()).or_default();
                for mut e in entries.into_iter().rev() {
                    e.not_before = Some(again);
                    queue.push_front(e);
                }
            }
            self.pause(&tp, true);
        }
    }

    /// [`Self::flush`] with transactional hops: the forwards up to each partition's first record that
    /// cannot be placed, and their offsets, in one transaction; if it aborts, every one is held again.
    fn flush_in_transaction(&mut self, ready: Vec<Entry>, now: Timestamp) {
        let mut failed: HashMap<Tp, Vec<Entry>> = HashMap::new();
        let mut included: Vec<Forward> = Vec::new();
        for entry in ready {
            if let Some(queue) = failed.get_mut(&entry.tp) {
                queue.push(entry);
                continue;
            }
            let (topic, extra) = self.target(&entry, now);
            match self.link.partitions_blocking(&topic) {
                Ok(_) => {
                    let copy = StagedCopy {
                        topic,
                        partition: Some(entry.tp.1),
                        raw: entry.decoded.raw.clone(),
                        nulls: entry.decoded.nulls.clone(),
                        extra,
                    };
                    included.push((entry, copy));
                }
                Err(e) => failed_forward(&mut failed, entry, &e),
            }
        }
        if included.is_empty() {
            return self.hold_again(failed);
        }
        let mut commits: HashMap<Tp, i64> = HashMap::new();
        for (entry, _) in &included {
            commits.insert(entry.tp.clone(), entry.offset + 1);
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in &commits {
            if let Err(e) = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset)) {
                warn!(error = %e, "building a ladder commit failed");
            }
        }
        let outcome = match (self.consumer.group_metadata(), &mut self.transactional) {
            (Some(group), Some(producer)) => {
                let copies: Vec<&StagedCopy> = included.iter().map(|(_, c)| c).collect();
                producer.commit(&self.link, &copies, &tpl, &group)
            }
            _ => return self.hold_again(Self::regroup(included, failed)),
        };
        if let Err(aborted) = outcome {
            warn!(error = %aborted.error, ladder = %self.source, "a transaction of forwards failed; trying again");
            if aborted
                .copies
                .iter()
                .flatten()
                .any(|e| e.kind() == Kind::NotFound)
            {
                self.link.forget_all();
            }
            // A forward the broker refused holds only its own partition, as without transactions; the
            // other partitions' forwards go again in the next batch, at once.
            let refused: Vec<Tp> = included
                .iter()
                .zip(&aborted.copies)
                .filter(|(_, e)| e.as_ref().is_some_and(|e| !e.is_temporary()))
                .map(|((entry, _), _)| entry.tp.clone())
                .collect();
            if refused.is_empty() {
                return self.hold_again(Self::regroup(included, failed));
            }
            let (held, again): (Vec<Forward>, Vec<Forward>) =
                included.into_iter().partition(|(entry, _)| {
                    refused.contains(&entry.tp) || failed.contains_key(&entry.tp)
                });
            self.state()
                .ready
                .splice(0..0, again.into_iter().map(|(entry, _)| entry));
            self.hold_again(Self::regroup(held, failed));
        } else {
            self.hold_again(failed);
        }
    }

    /// The entries of a transaction that did not commit put back in front of the entries that failed
    /// before it, partition by partition. A delivery that said its topic does not exist is not counted
    /// towards the DLQ (it may come of stale metadata): the next try reads the metadata afresh, and only
    /// that answer counts.
    fn regroup(
        included: Vec<Forward>,
        mut failed: HashMap<Tp, Vec<Entry>>,
    ) -> HashMap<Tp, Vec<Entry>> {
        let mut back: HashMap<Tp, Vec<Entry>> = HashMap::new();
        for (entry, _) in included {
            back.entry(entry.tp.clone()).or_default().push(entry);
        }
        for (tp, rest) in failed.drain() {
            back.entry(tp).or_default().extend(rest);
        }
        back
    }
}
