//! The runtime alone: events through the in-memory transport to a no-op handler, with the consumer's
//! defaults and with concurrency 64, on the default multi-threaded Tokio runtime (what `#[tokio::main]`
//! builds and the adapters use; a worker per core) and on one core (a current-thread runtime). What it
//! reports is the SDK's own cost per event — receive, decode, classify, settle, count — with no broker to
//! wait for; an adapter on a real broker cannot go faster than this. The heap allocations per event on
//! both runtimes are the `allocations` bench's (counting them here would slow what is timed). Targets (DESIGN §8 and the performance issue):
//! at least 1,000,000 events/s on one core, 2,000,000 on the multi-threaded runtime of this 2-core
//! machine. The last line, `runtime events/s: N`, is the multi-threaded runtime's median with defaults.
//!
//! ```text
//! cargo bench -p event-retry-core --bench runtime
//! ```
//!
//! Three rounds of each setting; the report gives every round, then the least, the median and the
//! greatest.
//!
//! For a profiler: `RETRY_BENCH_PROFILE=<events>` runs one round of the multi-threaded runtime with
//! defaults only (a batch handler's with `RETRY_BENCH_PROFILE_SETTING=batch`), over that many events, and after publishing them prints `published, pid N` and waits
//! 2 s before the consumer starts — time to attach (`perf record -g -p N`) to the consuming alone.
//!
//! The bench waits for the last handler call through a signal the handler raises, and only then for the
//! last acknowledgement through `wait_until`: a `wait_until` for all of them would be woken at every
//! change of the counters — several times per event, a cost of the waiting bench, not of a consumer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tokio::sync::Notify;

use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::runtime::{Context, batch_handler_fn, handler_fn};

/// Events per round.
const EVENTS: usize = 200_000;
/// The environment variable of the profiling round (see the module docs).
const PROFILE_ENV: &str = "RETRY_BENCH_PROFILE";
/// With [`PROFILE_ENV`]: `batch` profiles the batch handler's round instead of the per-event one.
const PROFILE_SETTING_ENV: &str = "RETRY_BENCH_PROFILE_SETTING";
/// Rounds per setting.
const ROUNDS: usize = 3;
/// Payload size of each event, in bytes.
const PAYLOAD: usize = 100;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One round's figures.
struct Round {
    /// Events per second from the consumer's start to the last success.
    rate: f64,
}

/// How the consumer's handler is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setting {
    /// A handler per event.
    PerEvent,
    /// A batch handler, batches of up to the batch size (64 by default).
    Batch,
}

/// One round: `EVENTS` events published to a fresh in-memory topic, then consumed by a consumer with
/// `concurrency` (the default when `None`); the rate from the consumer's start to the last success.
async fn round(concurrency: Option<usize>, setting: Setting) -> Result<Round, Error> {
    round_of(EVENTS, concurrency, setting, false).await
}

/// [`round`] over `events`; with `pause`, a 2 s pause for a profiler after publishing.
async fn round_of(
    events: usize,
    concurrency: Option<usize>,
    setting: Setting,
    pause: bool,
) -> Result<Round, Error> {
    let broker = Broker::memory();
    let producer = broker.producer();
    let body = "x".repeat(PAYLOAD);
    for i in 0..events {
        producer
            .publish("bench", Event::new(body.clone()).with_id(format!("m{i}")))
            .await?;
    }
    if pause {
        println!("published, pid {}", std::process::id());
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    let (calls, last_call) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let handler = handler_fn({
        let (calls, last_call) = (calls.clone(), last_call.clone());
        move |_event: Event, _ctx: Context| {
            if calls.fetch_add(1, Ordering::Relaxed) + 1 == events {
                last_call.notify_one();
            }
            async { Ok::<(), HandlerError>(()) }
        }
    });
    let mut builder = broker.consumer("bench");
    if let Some(n) = concurrency {
        builder = builder.concurrency(n);
    }
    let started = Instant::now();
    let consumer = match setting {
        Setting::PerEvent => builder.start(handler).await?,
        Setting::Batch => {
            builder
                .start_batch(batch_handler_fn({
                    let (calls, last_call) = (calls.clone(), last_call.clone());
                    move |batch: Vec<(Event, Context)>| {
                        let n = batch.len();
                        if calls.fetch_add(n, Ordering::Relaxed) + n == events {
                            last_call.notify_one();
                        }
                        async move { (0..n).map(|_| Ok::<(), HandlerError>(())).collect() }
                    }
                }))
                .await?
        }
    };
    // A consumer that stopped early is reported below.
    while !consumer.is_finished() {
        tokio::select! {
            () = last_call.notified() => break,
            () = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
        }
    }
    let stats = consumer.wait_until(|s| s.succeeded >= events as u64).await;
    let elapsed = started.elapsed().as_secs_f64();
    consumer.shutdown().await?;
    if stats.succeeded < events as u64 {
        return Err(format!(
            "the consumer stopped after {} of {events} events",
            stats.succeeded
        )
        .into());
    }
    Ok(Round {
        rate: events as f64 / elapsed,
    })
}

/// Three rounds of each setting on `runtime`, every round and the least, median and greatest printed;
/// returns the median rate with the consumer's defaults.
fn measure(runtime: &tokio::runtime::Runtime, on: &str) -> Result<f64, Error> {
    let mut defaults = 0.0;
    for (name, concurrency, setting) in [
        ("defaults", None, Setting::PerEvent),
        ("concurrency 64", Some(64), Setting::PerEvent),
        ("a batch handler, batches of 64", None, Setting::Batch),
    ] {
        let mut rounds = Vec::with_capacity(ROUNDS);
        for r in 1..=ROUNDS {
            let round = runtime.block_on(round(concurrency, setting))?;
            println!(
                "{on}, {name}, round {r}: {:.0} events/s ({:.2} µs per event)",
                round.rate,
                1e6 / round.rate,
            );
            rounds.push(round);
        }
        rounds.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        let median = &rounds[ROUNDS / 2];
        println!(
            "{on}, {name}: min / median / max {:.0} / {:.0} / {:.0} events/s, {:.2} µs per event at the median ({EVENTS} events of {PAYLOAD} B, no-op handler, in-memory transport)",
            rounds[0].rate,
            median.rate,
            rounds[ROUNDS - 1].rate,
            1e6 / median.rate,
        );
        if concurrency.is_none() && setting == Setting::PerEvent {
            defaults = median.rate;
        }
    }
    Ok(defaults)
}

fn main() -> Result<(), Error> {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return Ok(());
    }
    if let Ok(events) = std::env::var(PROFILE_ENV) {
        let events: usize = events
            .parse()
            .map_err(|e| format!("{PROFILE_ENV}={events}: {e}"))?;
        let multi = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let setting = match std::env::var(PROFILE_SETTING_ENV).as_deref() {
            Ok("batch") => Setting::Batch,
            Ok("per-event") | Err(_) => Setting::PerEvent,
            Ok(other) => {
                return Err(
                    format!("{PROFILE_SETTING_ENV}={other}: want per-event or batch").into(),
                );
            }
        };
        let round = multi.block_on(round_of(events, None, setting, true))?;
        println!("profiled round: {:.0} events/s", round.rate);
        return Ok(());
    }
    let one_core = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    measure(&one_core, "current-thread runtime (one core)")?;
    // What #[tokio::main] builds: a worker thread per core.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let multi = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let rate = measure(
        &multi,
        &format!("multi-threaded runtime ({workers} workers)"),
    )?;
    println!("runtime events/s: {rate:.0}");
    Ok(())
}
