//! Starting a consumer: its subscription taken and split into receive lanes, the state each lane
//! shares with its tasks made, and the lanes spawned.
//!
//! Separate from the builder, which only configures and checks, and from the receive loop, which only
//! runs a lane: starting is the one step that needs both, and keeping it here lets neither depend on
//! the other.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::info;

use super::batch::{BatchHandler, OneAtATime};
use super::builder::{Consumer, ConsumerBuilder};
use super::error::ConsumerError;
use super::handle::ConsumerHandle;
use super::handler::Handler;
use super::health::HealthState;
use super::ordering::Parking;
use super::receive::{Batching, ReceiveLoop};
use super::shared::{PauseGate, Shared};
use super::stats::Counters;
use super::stop::StopSignal;
use crate::check::DelayReport;
use crate::telemetry::Telemetry;

impl Consumer {
    /// Subscribes and starts consuming in the background; the handle says when it stops.
    pub async fn start(self, handler: impl Handler) -> Result<ConsumerHandle, ConsumerError> {
        self.start_shared(Arc::new(handler)).await
    }

    /// Subscribes and starts consuming in the background with a batch handler: it is called once with
    /// the events the subscription has at hand (up to [`ConsumerBuilder::batch_size`]; a quiet topic's
    /// event comes alone, at once) and returns one result per event, each event then retried,
    /// dead-lettered or acknowledged by its own result (see [`BatchHandler`]).
    ///
    /// Per-key ordering ([`ConsumerBuilder::ordered_by_key`]) and `tower` layers wrap a per-event
    /// handler: with a batch handler they are refused here, with [`ConsumerError::Invalid`].
    pub async fn start_batch(
        self,
        handler: impl BatchHandler,
    ) -> Result<ConsumerHandle, ConsumerError> {
        self.start_with(Started::Batch(Arc::new(handler))).await
    }

    /// Subscribes and starts consuming with `handler`, per event or per batch.
    pub(super) async fn start_with(
        mut self,
        handler: Started,
    ) -> Result<ConsumerHandle, ConsumerError> {
        if let Started::Batch(_) = handler {
            self.check_batch()?;
            let spec = &mut self.builder.spec;
            spec.max_in_flight = spec.max_in_flight.max(self.builder.batch_size);
        }
        launch(self.builder, &self.report, handler).await
    }

    pub(super) async fn start_shared(
        self,
        handler: Arc<dyn Handler>,
    ) -> Result<ConsumerHandle, ConsumerError> {
        self.start_with(Started::PerEvent(handler)).await
    }
}

/// The handler a consumer starts with.
pub(super) enum Started {
    /// Called once per event.
    PerEvent(Arc<dyn Handler>),
    /// Called once per batch of the events at hand.
    Batch(Arc<dyn BatchHandler>),
}

/// Marks the consumer stopped when its task ends, however it ends (returned, panicked, aborted).
struct StopGuard(Arc<Counters>, Arc<HealthState>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        // A task that returned has said how it ended already; this covers a panic or an abort.
        self.1
            .stopped(Some("the consumer's task ended without a result".into()));
        self.0.stop();
    }
}

/// Subscribes and spawns the receive loop.
async fn launch(
    b: ConsumerBuilder,
    report: &DelayReport,
    handler: Started,
) -> Result<ConsumerHandle, ConsumerError> {
    let (handler, batch) = match handler {
        Started::PerEvent(handler) => {
            #[cfg(feature = "tower")]
            let handler = b.layers.apply(handler);
            (handler, None)
        }
        // Layers were refused with a batch handler when it started.
        Started::Batch(handler) => (
            Arc::new(OneAtATime(handler.clone())) as Arc<dyn Handler>,
            Some(Batching {
                handler,
                size: b.batch_size,
            }),
        ),
    };
    let subscription = b.transport.subscribe(&b.spec).await?;
    info!(
        topic = %b.spec.topic,
        transport = b.transport.name(),
        topology = b.transport.topology().as_deref().unwrap_or("-"),
        policy = %b.policies.deferred,
        "consumer started\n{report}"
    );
    let runtime = tokio::runtime::Handle::current();
    let single_thread = runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread;
    let wanted = lane_count(
        if single_thread {
            1
        } else {
            runtime.metrics().num_workers()
        },
        b.spec.max_in_flight,
        batch.as_ref().map(|batching| batching.size),
        b.ordering.is_some(),
    );
    let mut subscription = subscription;
    let mut subscriptions = subscription.split_lanes(wanted - 1);
    // At most the number asked for.
    subscriptions.truncate(wanted - 1);
    subscriptions.insert(0, subscription);
    let lanes = subscriptions.len();
    let shutdown = StopSignal::default();
    let counters = Arc::new(Counters::new(lanes));
    let health = HealthState::new();
    let (pause_tx, pause_rx) = watch::channel(0usize);
    let pause = Arc::new(PauseGate {
        holds: pause_tx,
        health: health.clone(),
    });
    let topic: Arc<str> = Arc::from(b.spec.topic.as_str());
    let rng = Arc::new(Mutex::new(
        b.seed
            .map_or_else(|| StdRng::from_rng(&mut rand::rng()), StdRng::seed_from_u64),
    ));
    let mut parking = b.ordering.map(|o| {
        Parking::new(
            o.follow_to_dlq,
            Duration::from_millis(50),
            Duration::from_secs(300),
        )
    });
    let mut alive = Vec::with_capacity(lanes);
    let mut runs = Vec::with_capacity(lanes);
    for (lane, subscription) in subscriptions.into_iter().enumerate() {
        let shared = Arc::new(Shared {
            topic: topic.clone(),
            system: crate::telemetry::messaging_system(b.transport.name()),
            spec: b.spec.clone(),
            policies: b.policies.clone(),
            classifier: b.classifier.clone(),
            idempotency: b.idempotency.clone(),
            // One lane where there is per-key ordering (`lane_count`).
            parking: parking.take(),
            handler: handler.clone(),
            counters: counters.lane(lane),
            telemetry: Telemetry::new(&b.spec.topic),
            health: health.clone(),
            pause: pause.clone(),
            shutdown: shutdown.clone(),
            rng: rng.clone(),
            settle_backoff: b.settle_backoff,
            probes: b.probes.clone(),
        });
        alive.push(Arc::downgrade(&shared));
        let slots = lane_share(b.spec.max_in_flight, lanes, lane);
        runs.push(ReceiveLoop::new(
            shared,
            subscription,
            pause_rx.clone(),
            slots,
            b.shutdown_grace,
            single_thread,
            b.give_up,
            batch.as_ref(),
        ));
    }
    let stopped = StopGuard(counters.clone(), health.clone());
    let task_health = health.clone();
    let lanes_shutdown = shutdown.clone();
    let task = tokio::spawn(async move {
        let _stopped = stopped;
        let result = run_lanes(runs, lanes_shutdown).await;
        task_health.stopped(result.as_ref().err().map(ToString::to_string));
        result
    });
    Ok(ConsumerHandle::new(task, shutdown, counters, health, alive))
}

/// How many receive lanes a consumer asks its subscription for: one per worker thread of the runtime,
/// but no more than its concurrency allows (each lane holds at least one work slot, a batch handler's
/// lane a whole batch), and one alone with per-key ordering — the lanes of a subscription need not keep
/// a key's messages together, and the runtime keeps them in order within one lane.
fn lane_count(
    workers: usize,
    max_in_flight: usize,
    batch_size: Option<usize>,
    ordered: bool,
) -> usize {
    if ordered {
        return 1;
    }
    let per_lane = batch_size.unwrap_or(1).max(1);
    workers.min(max_in_flight / per_lane).max(1)
}

/// Lane `lane`'s share of `max_in_flight` work slots over `lanes` lanes: as even as it can be, the
/// first lanes taking the remainder, and at least one.
fn lane_share(max_in_flight: usize, lanes: usize, lane: usize) -> usize {
    let lanes = lanes.max(1);
    let extra = usize::from(lane < max_in_flight % lanes);
    (max_in_flight / lanes + extra).max(1)
}

/// Runs the receive lanes: one in this task, several each in a task of its own so that they spread
/// over the runtime's workers. The first lane to end stops the others (through the consumer's
/// shutdown, which then reads as asked for), and the first error is the consumer's; a lane that panics
/// takes the consumer down with it, as a single receive loop's panic would. A lane that fails drains
/// its own work before it ends, so with several lanes a failing consumer can take up to twice the
/// grace period to stop.
async fn run_lanes(mut runs: Vec<ReceiveLoop>, shutdown: StopSignal) -> Result<(), ConsumerError> {
    if runs.len() == 1
        && let Some(run) = runs.pop()
    {
        return run.run().await;
    }
    let mut lanes = JoinSet::new();
    for run in runs {
        lanes.spawn(run.run());
    }
    let mut result = Ok(());
    while let Some(ended) = lanes.join_next().await {
        // The consumer stops as a whole: a lane that ends (its subscription closed, or it failed)
        // ends the others too.
        shutdown.trigger();
        match ended {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                if result.is_ok() {
                    result = Err(e);
                }
            }
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Not while this task runs (it alone could cancel them): as a lane that ended.
            Err(_) => {}
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_per_worker_within_the_concurrency_and_one_with_ordering() {
        assert_eq!(lane_count(2, 16, None, false), 2);
        assert_eq!(lane_count(8, 3, None, false), 3, "a slot per lane at least");
        assert_eq!(lane_count(2, 1, None, false), 1);
        assert_eq!(lane_count(2, 16, None, true), 1, "per-key ordering");
        assert_eq!(lane_count(1, 16, None, false), 1);
        assert_eq!(
            lane_count(2, 64, Some(64), false),
            1,
            "a whole batch per lane"
        );
        assert_eq!(lane_count(4, 128, Some(64), false), 2);
    }

    #[test]
    fn the_slots_are_shared_out_evenly_and_add_up() {
        for (max, lanes) in [(16, 2), (3, 2), (7, 3), (1, 1), (64, 4)] {
            let shares: Vec<usize> = (0..lanes)
                .map(|lane| lane_share(max, lanes, lane))
                .collect();
            assert_eq!(
                shares.iter().sum::<usize>(),
                max,
                "{max} over {lanes}: {shares:?}"
            );
            let (least, most) = (shares.iter().min(), shares.iter().max());
            assert!(
                most.zip(least).is_some_and(|(m, l)| m - l <= 1),
                "{shares:?}"
            );
        }
    }
}
