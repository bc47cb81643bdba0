//! What every adapter's bench binary does the same way: start, pick its parts, publish the events, run
//! the SDK's throughput round, report the rounds, and measure retry lateness.
//!
//! An adapter's bench adds only its raw-client round and its set-up (declaring topics or queues).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use event_retry_core::adapter::Admin;
use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{BatchHandler, BatchItem, ConsumerHandle, Context, handler_fn};
use event_retry_core::time::Timestamp;
use futures::{StreamExt, TryStreamExt};

/// A bench's error.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Runs a bench binary against the broker whose URL is in `env` (`broker` is its name in
/// `scripts/brokers`): without it, says how to start it and exits with status 2; `cargo test` (which
/// passes `--test` or `--list`) only checks that it starts.
pub fn main<F, Fut>(env: &str, broker: &str, run: F) -> Result<(), Error>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let Some(url) = crate::broker::url(env) else {
        eprintln!(
            "{env} is not set: start the broker (scripts/brokers start {broker}) and source target/brokers/env.sh"
        );
        std::process::exit(2);
    };
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(url))
}

fn parts_asked() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect()
}

/// Whether to run `part`: every part runs when none is named (`cargo bench … -- throughput` runs one).
pub fn wants(part: &str) -> bool {
    let asked = parts_asked();
    asked.is_empty() || asked.iter().any(|a| a == part)
}

/// Whether `part` was named explicitly (for parts a default run leaves out).
pub fn asked(part: &str) -> bool {
    parts_asked().iter().any(|a| a == part)
}

/// When this process is the helper consumer of a part that runs its consumers apart ([`backlog`],
/// [`scale`]), runs it and returns its end; `None` in the bench's own process.
///
/// [`backlog`]: crate::backlog
/// [`scale`]: crate::scale
pub async fn helper_consumer(broker: &Broker) -> Option<Result<(), Error>> {
    if asked(crate::backlog::CONSUMER_PART) {
        Some(crate::backlog::consumer(broker).await)
    } else if asked(crate::scale::CONSUMER_PART) {
        Some(crate::scale::consumer(broker).await)
    } else {
        None
    }
}

/// The parts whose consumers run in processes of their own, where asked for: `backlog` (`describe`
/// says how the broker delays; `position` reads where the group stands if a healthy event goes missing)
/// and `scale` (its topics declared through `scale_admin`).
pub async fn consumer_process_parts(
    broker: &Broker,
    name: &str,
    describe: &str,
    scale_admin: &dyn Admin,
    position: Option<&crate::backlog::GroupPosition>,
) -> Result<(), Error> {
    if wants("backlog") {
        crate::backlog::run(broker, name, describe, position).await?;
    }
    if wants("scale") {
        crate::scale::run(broker, name, scale_admin).await?;
    }
    Ok(())
}

/// The nearest-rank `p`th percentile of `sorted` (ascending, not empty).
pub fn percentile(sorted: &[i64], p: usize) -> i64 {
    sorted[(sorted.len() * p).div_ceil(100).clamp(1, sorted.len()) - 1]
}

/// The work every consumer does per message: look at every byte (so the payload is really read).
pub fn work(payload: &[u8]) -> u64 {
    payload.iter().map(|b| u64::from(*b)).sum()
}

/// The payload size of the events a bench publishes, in bytes: `RETRY_BENCH_PAYLOAD` (for example
/// `100`, `1024`, `16384`), 230 when unset.
pub fn payload_bytes() -> Result<usize, Error> {
    count_from_env("RETRY_BENCH_PAYLOAD", DEFAULT_PAYLOAD, MIN_PAYLOAD)
}

/// How many messages a throughput round drains: `RETRY_BENCH_MESSAGES`, or `default` when unset.
pub fn messages(default: usize) -> Result<usize, Error> {
    count_from_env("RETRY_BENCH_MESSAGES", default, 1)
}

/// The whole number in the variable `name` (at least `min`), or `default` when it is unset; anything
/// else is an error naming the variable.
pub fn count_from_env(name: &str, default: usize, min: usize) -> Result<usize, Error> {
    match std::env::var(name) {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(format!("{name}={v:?}: expected a whole number of at least {min}").into()),
        },
        Err(_) => Ok(default),
    }
}

/// The payload size when `RETRY_BENCH_PAYLOAD` is unset.
const DEFAULT_PAYLOAD: usize = 230;

/// A payload size as the ratio lines name it: `100B`, `1KB` (1,024 bytes), `16KB`, `230B`.
pub fn payload_label(bytes: usize) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}KB", bytes / 1024)
    } else {
        format!("{bytes}B")
    }
}

/// The smallest payload: room for the JSON frame around the padding.
const MIN_PAYLOAD: usize = 32;

/// A JSON payload of exactly `size` bytes for event `i` (`size` at least 32 bytes):
/// `{"id":i,"pad":"xx…"}`.
pub fn payload(i: usize, size: usize) -> String {
    let head = format!("{{\"id\":{i},\"pad\":\"");
    let pad = size.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

/// Publishes `messages` events of [`payload_bytes`] each (ids `m0`, `m1`, …), `at_once` at a time.
pub async fn publish_all(
    broker: &Broker,
    topic: &str,
    messages: usize,
    at_once: usize,
) -> Result<(), Error> {
    let size = payload_bytes()?;
    let producer = broker.producer();
    let producer = &producer;
    futures::stream::iter(0..messages)
        .map(|i| async move {
            let body = payload(i, size);
            producer
                .publish(topic, Event::new(body).with_id(format!("m{i}")))
                .await
                .map(drop)
        })
        .buffer_unordered(at_once)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// A round's rate measured two ways: from the consumer's start (joining the group, declaring its
/// topics, the first fetch) and from its first message (the steady state).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Messages per second from the consumer's start to the last message.
    pub whole: f64,
    /// Messages per second from the first message to the last.
    pub steady: f64,
    /// From the consumer's start to its first message: joining the group, finding where to start and
    /// the first fetch (a large share of a short round's time).
    pub start_up: Duration,
    /// The CPU time each message cost over the round, where `/proc` tells it (Linux).
    pub cpu: Option<CpuPerMessage>,
}

/// CPU time per message over a round: the bench process's own (the consumer: raw client or SDK) and the
/// rest of the machine's (the broker, and anything else running) — where a round's time went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuPerMessage {
    /// This process's user + system time per message.
    pub process: Duration,
    /// Every other process's busy time per message (the machine's minus this process's).
    pub rest: Duration,
    /// This process's read and write system calls per message (sockets included), from
    /// `/proc/self/io`: how many round trips and writes the client made of the work.
    pub syscalls: (f64, f64),
}

/// CPU time used so far, in `/proc`'s clock ticks (USER_HZ, 100 per second on Linux).
#[derive(Debug, Clone, Copy)]
struct CpuTicks {
    process: u64,
    machine: u64,
    /// Read and write system calls so far (`syscr`, `syscw`).
    syscalls: (u64, u64),
}

/// `/proc`'s clock tick (USER_HZ is 100 on every Linux architecture).
const TICK: Duration = Duration::from_millis(10);

impl CpuTicks {
    /// Reads this process's and the whole machine's busy ticks; `None` without `/proc`.
    fn now() -> Option<CpuTicks> {
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        let machine = std::fs::read_to_string("/proc/stat").ok()?;
        let io = std::fs::read_to_string("/proc/self/io").ok()?;
        Some(CpuTicks {
            process: process_ticks(&own)?,
            machine: machine_busy_ticks(&machine)?,
            syscalls: (io_field(&io, "syscr")?, io_field(&io, "syscw")?),
        })
    }
}

/// utime + stime of a `/proc/<pid>/stat` line (fields 14 and 15; the command name before them, in
/// parentheses, may hold spaces).
fn process_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// One counter of `/proc/<pid>/io`.
fn io_field(io: &str, name: &str) -> Option<u64> {
    crate::child::proc_field(io, name)?.parse().ok()
}

/// The busy ticks of `/proc/stat`'s `cpu` line: user, nice, system, irq, softirq, steal (not idle or
/// iowait; guest time is already inside user).
fn machine_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    Some(at(0) + at(1) + at(2) + at(5) + at(6) + at(7))
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `d` in milliseconds, for a report.
fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Times one consumer: started when made, marked at its first message.
#[derive(Debug)]
pub struct Clock {
    started: Instant,
    first: std::sync::OnceLock<Instant>,
    cpu_at_start: Option<CpuTicks>,
}

impl Clock {
    /// Starts the clock (just before the consumer is made).
    pub fn start() -> Clock {
        Clock {
            started: Instant::now(),
            first: std::sync::OnceLock::new(),
            cpu_at_start: CpuTicks::now(),
        }
    }

    /// Marks a message in hand (only the first counts).
    pub fn message(&self) {
        self.first.get_or_init(Instant::now);
    }

    /// The rates for `messages` messages, now that the last one is done.
    pub fn rate(&self, messages: usize) -> Rate {
        let per_second = |since: Instant| messages as f64 / since.elapsed().as_secs_f64().max(1e-9);
        let cpu = self.cpu_at_start.zip(CpuTicks::now()).map(|(start, end)| {
            let per_message = |ticks: u64| {
                TICK * u32::try_from(ticks).unwrap_or(u32::MAX) / messages.max(1) as u32
            };
            let process = end.process.saturating_sub(start.process);
            let machine = end.machine.saturating_sub(start.machine);
            let calls =
                |end: u64, start: u64| end.saturating_sub(start) as f64 / messages.max(1) as f64;
            CpuPerMessage {
                process: per_message(process),
                rest: per_message(machine.saturating_sub(process)),
                syscalls: (
                    calls(end.syscalls.0, start.syscalls.0),
                    calls(end.syscalls.1, start.syscalls.1),
                ),
            }
        });
        let first = *self.first.get().unwrap_or(&self.started);
        Rate {
            whole: per_second(self.started),
            steady: per_second(first),
            start_up: first.duration_since(self.started),
            cpu,
        }
    }
}

/// Counts a bench's handler calls and signals the one that reaches a target, so the bench waits for its
/// last event without being woken at every change of the consumer's counters (`wait_until` is: several
/// wake-ups per event, another thread's work on a 2-core machine that a raw client's loop never pays).
#[derive(Debug)]
pub struct Countdown {
    target: u64,
    calls: AtomicU64,
    reached: tokio::sync::Notify,
}

impl Countdown {
    /// A countdown to `target` calls.
    pub fn new(target: usize) -> Arc<Countdown> {
        Arc::new(Countdown {
            target: target as u64,
            calls: AtomicU64::new(0),
            reached: tokio::sync::Notify::new(),
        })
    }

    /// Counts one handler call.
    pub fn tick(&self) {
        if self.calls.fetch_add(1, Ordering::Relaxed) + 1 == self.target {
            self.reached.notify_one();
        }
    }

    /// Waits until the target is reached or `consumer` has stopped (checked every 100 ms); an error if
    /// no handler call came for [`Countdown::STALL`] before that.
    pub async fn wait(&self, consumer: &ConsumerHandle) -> Result<(), Error> {
        let (mut seen, mut since) = (0, Instant::now());
        while !consumer.is_finished() {
            tokio::select! {
                () = self.reached.notified() => return Ok(()),
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            let calls = self.calls.load(Ordering::Relaxed);
            if calls != seen {
                (seen, since) = (calls, Instant::now());
            } else if since.elapsed() >= Self::STALL {
                return Err(format!(
                    "the consumer stalled: {calls} of {} handler calls, none for {:?}; its counters: {:?}",
                    self.target,
                    Self::STALL,
                    consumer.stats()
                )
                .into());
            }
        }
        Ok(())
    }

    /// How long a bench waits for a next handler call before it reports a stalled consumer.
    pub const STALL: Duration = Duration::from_secs(20);
}

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

/// The raw client's and the SDK's rates, round by round.
#[derive(Debug, Default)]
pub struct Throughput {
    raw: Vec<Rate>,
    sdk: Vec<Rate>,
}

impl Throughput {
    /// Records and prints one round: `raw` named `raw_name` (e.g. "raw lapin"), with `detail` (the
    /// message count and settings).
    pub fn round(&mut self, raw: Rate, sdk: Rate, raw_name: &str, detail: &str) {
        self.raw.push(raw);
        self.sdk.push(sdk);
        println!(
            "round {}: {raw_name} {:.0} msg/s, SDK {:.0} msg/s; from the first message: {raw_name} {:.0} msg/s, SDK {:.0} msg/s; start-up to the first message: {raw_name} {:.0} ms, SDK {:.0} ms ({detail})",
            self.raw.len(),
            raw.whole,
            sdk.whole,
            raw.steady,
            sdk.steady,
            millis(raw.start_up),
            millis(sdk.start_up),
        );
        if let (Some(r), Some(s)) = (raw.cpu, sdk.cpu) {
            println!(
                "  CPU per message: {raw_name} {:.1} µs, the rest of the machine (the broker) {:.1} µs; SDK {:.1} µs, the rest {:.1} µs; system calls per message (reads + writes): {raw_name} {:.2} + {:.2}, SDK {:.2} + {:.2}",
                micros(r.process),
                micros(r.rest),
                micros(s.process),
                micros(s.rest),
                r.syscalls.0,
                r.syscalls.1,
                s.syscalls.0,
                s.syscalls.1,
            );
        }
    }

    /// Prints the ratio of the best rounds and of the medians, from the consumers' start and from their
    /// first message; the least, median and greatest of the rounds' own ratios (each SDK round against
    /// the raw round run beside it); then the summary line `ratio sdk/raw <broker> <payload>: x`
    /// (`100B`, `1KB`, `16KB`; the median SDK rate over the median raw rate, from the consumers' start).
    pub fn report(&self, broker: &str) {
        let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        let median = |v: &[f64]| spread(v).map_or(0.0, |(_, median, _)| median);
        for (what, pick) in [
            (
                "from the consumer's start",
                (|r: &Rate| r.whole) as fn(&Rate) -> f64,
            ),
            ("from the first message", |r: &Rate| r.steady),
        ] {
            let sdk: Vec<f64> = self.sdk.iter().map(pick).collect();
            let raw: Vec<f64> = self.raw.iter().map(pick).collect();
            println!(
                "happy-path throughput {what}: SDK/raw = {:.2} (best of {}: SDK {:.0} msg/s, raw {:.0} msg/s); medians: {:.2}",
                best(&sdk) / best(&raw),
                raw.len(),
                best(&sdk),
                best(&raw),
                median(&sdk) / median(&raw)
            );
        }
        let cpu = |v: &[Rate], pick: fn(&CpuPerMessage) -> Duration| {
            median(
                &v.iter()
                    .filter_map(|r| r.cpu.as_ref().map(|c| micros(pick(c))))
                    .collect::<Vec<_>>(),
            )
        };
        if self.raw.iter().chain(&self.sdk).all(|r| r.cpu.is_some()) {
            println!(
                "CPU per message, medians: raw client {:.1} µs, SDK {:.1} µs; the rest of the machine (the broker) with raw {:.1} µs, with the SDK {:.1} µs",
                cpu(&self.raw, |c| c.process),
                cpu(&self.sdk, |c| c.process),
                cpu(&self.raw, |c| c.rest),
                cpu(&self.sdk, |c| c.rest),
            );
        }
        let start_up =
            |v: &[Rate]| median(&v.iter().map(|r| millis(r.start_up)).collect::<Vec<_>>());
        println!(
            "start-up to the first message, medians: raw client {:.0} ms, SDK {:.0} ms",
            start_up(&self.raw),
            start_up(&self.sdk),
        );
        let per_round: Vec<f64> = self
            .sdk
            .iter()
            .zip(&self.raw)
            .map(|(s, r)| s.whole / r.whole)
            .collect();
        if let Some((min, median, max)) = spread(&per_round) {
            println!(
                "SDK/raw per round (each SDK round against the raw round beside it, from the consumer's start), {} rounds: min {min:.2}, median {median:.2}, max {max:.2}",
                per_round.len()
            );
        }
        let whole = |v: &[Rate]| median(&v.iter().map(|r| r.whole).collect::<Vec<_>>());
        println!(
            "ratio sdk/raw {broker} {}: {:.2}",
            payload_label(payload_bytes().unwrap_or(DEFAULT_PAYLOAD)),
            whole(&self.sdk) / whole(&self.raw)
        );
    }
}

/// The smallest, the median (the upper one of an even count) and the largest of `values`; `None` when
/// there are none.
pub fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some((*sorted.first()?, sorted[sorted.len() / 2], *sorted.last()?))
}

/// Deletes a finished part's `topic` with what the adapter keeps beside it (its DLQ, delay levels or
/// retry route): a broker keeps every record it was given, so a few runs would otherwise fill it. A
/// topic left behind (the adapter cannot delete one, or the delete failed) is reported, not an error:
/// the part's figures stand.
pub async fn tidy(admin: &dyn Admin, topic: &str) {
    match admin.delete(topic).await {
        Ok(()) => {}
        Err(e) if e.kind() == event_retry_core::error::Kind::Unsupported => {
            println!("(topic {topic} left in the broker: {e})");
        }
        Err(e) => {
            eprintln!("warning: topic {topic} of a finished part was left on the broker: {e}")
        }
    }
}

/// The lateness part: `retries` events fail once and retry after delays spread uniformly over
/// 1.2–59.8 s; lateness is the retry's start minus its due time (wall clock). Prints p50, p99 and max
/// with `describe` (how the broker delays); an early retry, or retries not done within `deadline`, fail.
pub async fn lateness(
    broker: &Broker,
    topic: &str,
    retries: usize,
    deadline: Duration,
    describe: &str,
) -> Result<(), Error> {
    let late_ms: Arc<std::sync::Mutex<Vec<i64>>> = Arc::default();
    let record = late_ms.clone();
    let handler = handler_fn(move |_event: Event, ctx: Context| {
        let record = record.clone();
        async move {
            if ctx.attempt == 1 {
                return Err(HandlerError::deferred("fail once"));
            }
            if let Some(due) = ctx.due_at {
                let now = Timestamp::now().as_millis() as i64;
                record
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(now - due.as_millis() as i64);
            }
            Ok(())
        }
    });
    // Uniform delays over [1.2 s, 59.8 s].
    let consumer = broker
        .consumer(topic)
        .policy(RetryPolicy::parse("30500ms x1; jitter=±96%")?)
        .concurrency(32)
        .start(handler)
        .await?;
    let producer = broker.producer();
    for i in 0..retries {
        let id = format!("late-{i}");
        producer
            .publish(topic, Event::new(id.clone()).with_id(id))
            .await?;
    }
    let finished = tokio::time::timeout(
        deadline,
        consumer.wait_until(|s| s.succeeded_after_retry >= retries as u64),
    )
    .await;
    if finished.is_err() {
        return Err(format!("retries did not finish: {:?}", consumer.stats()).into());
    }
    consumer.shutdown().await?;
    tidy(broker.admin(), topic).await;
    let mut late = late_ms.lock().unwrap_or_else(|p| p.into_inner()).clone();
    late.sort_unstable();
    let Some(&max) = late.last() else {
        return Err("no retry was measured".into());
    };
    let early = late.iter().filter(|&&l| l < 0).count();
    let pct = |p: usize| late[(late.len() * p / 100).min(late.len() - 1)];
    println!(
        "retry lateness over {} retries with delays of 1.2-59.8 s ({describe}): p50 {} ms, p99 {} ms, max {max} ms, early {early}",
        late.len(),
        pct(50),
        pct(99),
    );
    if early > 0 {
        return Err(format!("{early} retries ran before their due time").into());
    }
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

    #[test]
    fn a_spread_is_the_least_the_middle_and_the_most_of_its_rounds() {
        assert_eq!(spread(&[0.9, 0.6, 0.7]), Some((0.6, 0.7, 0.9)));
        assert_eq!(spread(&[0.5, 0.8]), Some((0.5, 0.8, 0.8)));
        assert_eq!(spread(&[1.1]), Some((1.1, 1.1, 1.1)));
        assert_eq!(spread(&[]), None);
    }

    #[test]
    fn payloads_are_named_as_the_ratio_lines_name_them() {
        let labels: Vec<String> = [100, 230, 1024, 16384, 1500]
            .into_iter()
            .map(payload_label)
            .collect();
        assert_eq!(labels, ["100B", "230B", "1KB", "16KB", "1500B"]);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(
            (percentile(&v, 50), percentile(&v, 99), percentile(&v, 100)),
            (50, 99, 100)
        );
        assert_eq!(
            (percentile(&[-5, 10], 50), percentile(&[-5, 10], 99)),
            (-5, 10)
        );
        assert_eq!(percentile(&[7], 0), 7);
    }

    #[test]
    fn cpu_ticks_are_read_from_proc_lines() {
        // A command name with spaces and a parenthesis; utime 1234, stime 56.
        let own = "4242 (bench (x) y) R 1 2 3 4 5 6 7 8 9 10 1234 56 0 0 20 0 1";
        assert_eq!(process_ticks(own), Some(1290));
        let machine = "cpu  100 2 30 5000 7 1 4 3 0 0\ncpu0 50 1 15 2500 3 0 2 1 0 0\n";
        assert_eq!(machine_busy_ticks(machine), Some(100 + 2 + 30 + 1 + 4 + 3));
        assert_eq!(process_ticks("garbage"), None);
        let io = "rchar: 6976\nwchar: 0\nsyscr: 10\nsyscw: 3\n";
        assert_eq!(
            (io_field(io, "syscr"), io_field(io, "syscw")),
            (Some(10), Some(3))
        );
        assert_eq!(io_field(io, "syscx"), None);
    }

    #[test]
    fn a_round_of_work_shows_in_the_process_cpu_per_message() {
        let clock = Clock::start();
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let cpu = clock.rate(1_000).cpu.expect("/proc is there on Linux");
        // About 200 ms of spinning over 1,000 messages: 200 µs each (ticks are 10 ms).
        assert!(
            cpu.process >= Duration::from_micros(150),
            "{cpu:?} for 200 ms of work over 1,000 messages"
        );
    }

    #[test]
    fn the_steady_rate_leaves_out_the_wait_for_the_first_message() {
        let clock = Clock::start();
        std::thread::sleep(Duration::from_millis(60));
        clock.message();
        std::thread::sleep(Duration::from_millis(20));
        clock.message(); // only the first counts
        let rate = clock.rate(100);
        assert!(rate.whole < 100.0 / 0.07, "{rate:?}");
        assert!(rate.steady > 100.0 / 0.05, "{rate:?}");
        // No message at all: both from the start.
        let idle = Clock::start().rate(1);
        assert!(idle.steady <= idle.whole * 1.5, "{idle:?}");
    }

    #[test]
    fn payloads_have_exactly_the_size_asked_and_stay_json() {
        for size in [MIN_PAYLOAD, 100, 230, 1024, 16384] {
            for i in [0, 7, 123_456] {
                let p = payload(i, size);
                assert_eq!(p.len(), size, "event {i}, size {size}");
                assert!(p.starts_with(&format!("{{\"id\":{i},")) && p.ends_with("\"}"));
            }
        }
    }
}
