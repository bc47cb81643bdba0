//! The contenders of a throughput round — the raw client, the SDK with a per-event handler and with a
//! batch handler — each draining a topic of its own, in an order that rotates from round to round.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::runtime::{BatchHandler, BatchItem, ConsumerHandle, Context, handler_fn};

use super::{Clock, Countdown, Error, Rate, work};

/// One SDK round: a consumer of `topic` (already filled with `messages` events) with `concurrency`,
/// doing [`work`] per event; its rates from its start and from its first event to the last success.
pub async fn sdk_round(
    broker: &Broker,
    topic: &str,
    messages: usize,
    concurrency: usize,
) -> Result<Rate, Error> {
    let sink = Arc::new(AtomicU64::new(0));
    let clock = Arc::new(Clock::start());
    let countdown = Countdown::new(messages);
    let (s, c, d) = (sink.clone(), clock.clone(), countdown.clone());
    let handler = handler_fn(move |event: Event, _ctx: Context| {
        let (s, c, d) = (s.clone(), c.clone(), d.clone());
        async move {
            c.message();
            s.fetch_add(work(&event.payload), Ordering::Relaxed);
            d.tick();
            Ok::<(), HandlerError>(())
        }
    });
    let consumer = broker
        .consumer(topic)
        .concurrency(concurrency)
        .start(handler)
        .await?;
    drained(consumer, &countdown, &clock, messages).await
}

/// Waits for `consumer`'s `messages` handler calls and successes, stops it, and returns its rates.
async fn drained(
    consumer: ConsumerHandle,
    countdown: &Countdown,
    clock: &Clock,
    messages: usize,
) -> Result<Rate, Error> {
    countdown.wait(&consumer).await?;
    consumer
        .wait_until(|s| s.succeeded >= messages as u64)
        .await;
    let rate = clock.rate(messages);
    consumer.shutdown().await?;
    Ok(rate)
}

/// One SDK round as [`sdk_round`], with a batch handler doing [`work`] per event of each batch (batches
/// of up to `concurrency` events, the consumer's batch size).
pub async fn sdk_batch_round(
    broker: &Broker,
    topic: &str,
    messages: usize,
    concurrency: usize,
) -> Result<Rate, Error> {
    let sink = Arc::new(AtomicU64::new(0));
    let clock = Arc::new(Clock::start());
    let countdown = Countdown::new(messages);
    let calls = Arc::new(AtomicU64::new(0));
    let handler = Worker {
        sink: sink.clone(),
        clock: clock.clone(),
        countdown: countdown.clone(),
        calls: calls.clone(),
    };
    let consumer = broker
        .consumer(topic)
        .concurrency(concurrency)
        .batch_size(concurrency)
        .start_batch(handler)
        .await?;
    let rate = drained(consumer, &countdown, &clock, messages).await?;
    let calls = calls.load(Ordering::Relaxed);
    println!(
        "  batch handler: {calls} calls, {:.1} events per call on average",
        messages as f64 / calls.max(1) as f64
    );
    Ok(rate)
}

/// The batch handler of [`sdk_batch_round`]: [`work`] per event, each counted.
struct Worker {
    sink: Arc<AtomicU64>,
    clock: Arc<Clock>,
    countdown: Arc<Countdown>,
    /// Calls so far.
    calls: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl BatchHandler for Worker {
    async fn handle_batch(&self, batch: &[BatchItem<'_>]) -> Vec<Result<(), HandlerError>> {
        self.clock.message();
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut done = 0;
        for item in batch {
            done += work(&item.event.payload);
            self.countdown.tick();
        }
        self.sink.fetch_add(done, Ordering::Relaxed);
        batch.iter().map(|_| Ok(())).collect()
    }
}

/// One of the consumers a throughput round compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    /// The broker's raw client.
    Raw,
    /// The SDK with a per-event handler.
    Sdk,
    /// The SDK with a batch handler.
    Batch,
}

impl Contender {
    /// Every contender, in the order the first round runs them.
    pub const ALL: [Contender; 3] = [Contender::Raw, Contender::Sdk, Contender::Batch];

    /// How a round's line names it.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Raw => "raw",
            Contender::Sdk => "SDK",
            Contender::Batch => "batch",
        }
    }

    /// Its topic in the round named `id` (each contender drains a topic of its own).
    pub fn topic(self, id: &str) -> String {
        let prefix = match self {
            Contender::Raw => "raw",
            Contender::Sdk => "sdk",
            Contender::Batch => "batch",
        };
        format!("bench-{prefix}-{id}")
    }

    /// The order round `round` runs them in: round r starts with the r-th contender (modulo three), so
    /// each runs first as often as the others and none always meets the broker first.
    pub fn order(round: usize) -> impl Iterator<Item = Contender> {
        Self::ALL
            .into_iter()
            .cycle()
            .skip(round % Self::ALL.len())
            .take(Self::ALL.len())
    }
}

/// The rates of one throughput round, each contender's on a topic of its own.
#[derive(Debug, Clone, Copy)]
pub struct RoundRates {
    /// The raw client's.
    pub raw: Rate,
    /// The SDK's with a per-event handler.
    pub sdk: Rate,
    /// The SDK's with a batch handler.
    pub batch: Rate,
    /// The contender that ran first.
    pub first: Contender,
}

/// Runs round `round` of a throughput bench: `run` drains one contender's topic (named by
/// [`Contender::topic`] from `id`, fresh for the round) and returns its rate, the contenders taken in
/// [`Contender::order`].
pub async fn rotated_round<F, Fut>(round: usize, id: &str, mut run: F) -> Result<RoundRates, Error>
where
    F: FnMut(Contender, String) -> Fut,
    Fut: Future<Output = Result<Rate, Error>>,
{
    let (mut raw, mut sdk, mut batch) = (None, None, None);
    for contender in Contender::order(round) {
        let rate = run(contender, contender.topic(id)).await?;
        match contender {
            Contender::Raw => raw = Some(rate),
            Contender::Sdk => sdk = Some(rate),
            Contender::Batch => batch = Some(rate),
        }
    }
    match (raw, sdk, batch) {
        (Some(raw), Some(sdk), Some(batch)) => Ok(RoundRates {
            raw,
            sdk,
            batch,
            first: Contender::ALL[round % Contender::ALL.len()],
        }),
        _ => Err("a throughput round ran without one of its contenders".into()),
    }
}

/// One unmeasured round of the raw client (`run` given [`Contender::Raw`] and its topic named from `id`,
/// fresh) before the measured ones: a broker's JVM compiles its paths during the first round, which
/// would otherwise count against whichever contender runs first. Prints its rate, naming the client
/// `raw_name`.
pub async fn warm_up<F, Fut>(raw_name: &str, messages: usize, id: &str, run: F) -> Result<(), Error>
where
    F: FnOnce(Contender, String) -> Fut,
    Fut: Future<Output = Result<Rate, Error>>,
{
    let rate = run(
        Contender::Raw,
        Contender::Raw.topic(&format!("warm-up-{id}")),
    )
    .await?;
    println!(
        "warm-up (not counted): {raw_name} {:.0} msg/s ({messages} messages)",
        rate.whole
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_starts_with_the_next_contender_and_runs_all_three() {
        use Contender::{Batch, Raw, Sdk};
        let order = |round| Contender::order(round).collect::<Vec<_>>();
        assert_eq!(order(0), [Raw, Sdk, Batch]);
        assert_eq!(order(1), [Sdk, Batch, Raw]);
        assert_eq!(order(2), [Batch, Raw, Sdk]);
        assert_eq!(order(3), order(0));
        assert_eq!(Sdk.topic("r1"), "bench-sdk-r1");
    }
}
