//! The backlog part of every adapter's bench: does a backlog of waiting retries slow healthy events down
//! or grow the consumer's memory?
//!
//! The consumer runs in its own process (the bench binary again, part `backlog-consumer`), so its
//! resident set is its own and not the publisher's. The bench publishes healthy events at a steady 100
//! per second and reads each one's latency (handler start minus the publisher's clock just before the
//! publish, both wall clock on this machine) three times: idle, with 1,000 events waiting in retry, and
//! with 100,000 waiting (`RETRY_BENCH_BACKLOG`). A waiting event failed once with a deferred error under
//! a 10-minute policy, so it sits in the broker's delay mechanism for the whole measurement.
//!
//! Beside its resident set, each phase reports the consumer's heap as glibc's allocator counts it: the
//! bytes in use, and the bytes freed but still held (not returned to the system). A resident set that
//! grows with the backlog while the heap in use stays flat holds no state per waiting retry: it is
//! memory a burst used and the allocator kept. With the feature `mimalloc` (see [`crate::allocator`])
//! Rust's allocations are mimalloc's and glibc's counts are what C libraries (librdkafka) allocate; with
//! `jemalloc` every allocation is jemalloc's, and no heap is reported.
//!
//! At the end the consumer is stopped and 300 more healthy events are published with the backlog still
//! in the broker: their publish time alone tells a broker slowed by what it holds from one slowed by the
//! consumer's traffic beside the publishes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_retry_core::adapter::Published;
use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{Context, handler_fn};
use event_retry_core::time::Timestamp;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::mpsc;

use crate::bench::{Error, percentile};
use crate::child;

/// The part name the bench binary is run again with, as the consumer.
pub const CONSUMER_PART: &str = "backlog-consumer";
const TOPIC_ENV: &str = "RETRY_BENCH_BACKLOG_TOPIC";
const HEALTHY_PER_PHASE: usize = 1_000;
/// Healthy events sent (and not measured) before the idle phase: the consumer's start-up (group join,
/// partition assignment, first fetch) is not the idle figure.
const WARM_UP: usize = 200;
const HEALTHY_PER_SECOND: u64 = 100;
/// Publishes timed at the end, with the consumer stopped and the backlog still there.
const PUBLISHES_WITHOUT_CONSUMER: usize = 300;
const WAIT_POLICY: &str = "10m x1";

/// A line the consumer process prints.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Report {
    /// The consumer has started.
    Ready,
    /// A healthy event's latency, in µs, and its id.
    Latency(i64, String),
    /// Retries scheduled so far.
    Scheduled(u64),
    /// The consumer's heap: KiB in use and KiB freed but held by the allocator.
    Heap(u64, u64),
}

impl Report {
    fn render(&self) -> String {
        match self {
            Report::Ready => "BACKLOG ready".into(),
            Report::Latency(us, id) => format!("BACKLOG latency {us} {id}"),
            Report::Scheduled(n) => format!("BACKLOG scheduled {n}"),
            Report::Heap(used, free) => format!("BACKLOG heap {used} {free}"),
        }
    }

    fn parse(line: &str) -> Option<Report> {
        let rest = line.trim().strip_prefix("BACKLOG ")?;
        match rest.split_once(' ') {
            None if rest == "ready" => Some(Report::Ready),
            Some(("latency", rest)) => {
                let (us, id) = rest.split_once(' ')?;
                Some(Report::Latency(us.parse().ok()?, id.to_string()))
            }
            Some(("scheduled", n)) => n.parse().ok().map(Report::Scheduled),
            Some(("heap", kib)) => {
                let (used, free) = kib.split_once(' ')?;
                Some(Report::Heap(used.parse().ok()?, free.parse().ok()?))
            }
            _ => None,
        }
    }
}

/// The consumer process: consumes the topic named in its environment until killed; a healthy event
/// (`h:<publish µs>`) reports its latency, a waiting one (`w:<n>`) fails once with a deferred error.
pub async fn consumer(broker: &Broker) -> Result<(), Error> {
    let topic = std::env::var(TOPIC_ENV).map_err(|_| format!("{TOPIC_ENV} is not set"))?;
    let handler = handler_fn(|event: Event, ctx: Context| async move {
        let body = String::from_utf8_lossy(&event.payload);
        if let Some(sent) = body
            .strip_prefix("h:")
            .and_then(|us| us.parse::<i64>().ok())
        {
            let latency = now_micros() - sent;
            println!(
                "{}",
                Report::Latency(latency, ctx.event_id.to_string()).render()
            );
            return Ok(());
        }
        if ctx.attempt == 1 {
            return Err(HandlerError::deferred("waits in retry"));
        }
        Ok::<(), HandlerError>(())
    });
    let consumer = broker
        .consumer(&topic)
        .policy(RetryPolicy::parse(WAIT_POLICY)?)
        .start(handler)
        .await?;
    println!("{}", Report::Ready.render());
    let mut last = u64::MAX;
    loop {
        let scheduled = consumer.stats().retries_scheduled;
        if scheduled != last {
            println!("{}", Report::Scheduled(scheduled).render());
            last = scheduled;
        }
        if let Some((used, free)) = heap_kib() {
            println!("{}", Report::Heap(used, free).render());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One phase's figures.
#[derive(Debug, Clone, Copy)]
struct Phase {
    waiting: u64,
    p50: i64,
    p99: i64,
    max: i64,
    /// The healthy events' publish time (the broker's answer to the producer), p50 and p99.
    publish_p50: i64,
    publish_p99: i64,
    rss_kib: u64,
    /// The consumer's heap, KiB in use and KiB freed but held, if its allocator reports it.
    heap_kib: Option<(u64, u64)>,
}

/// A healthy phase's latencies and publish times, in µs.
struct Timings {
    latencies: Vec<i64>,
    publishes: Vec<i64>,
}

/// One healthy publish: its id, how long the broker took to answer, and where the broker put it.
struct Sent {
    id: String,
    micros: i64,
    published: Published,
}

/// Where the broker said it put a message, for a report: partition and offset, or the message id.
fn place(published: &Published) -> String {
    match (published.partition, published.offset, &published.message_id) {
        (Some(p), Some(o), _) => format!("partition {p} offset {o}"),
        (_, _, Some(id)) => format!("message {id}"),
        _ => "accepted".into(),
    }
}

/// The bench side: starts the consumer process, measures the three phases, prints them and the ratio
/// lines (`ratio backlog/idle latency p99 <broker> <n> waiting: x`, and the same for RSS).
///
/// `position`, where the adapter can read it, says where the consumer's group stands when a healthy
/// event is missing (see [`GroupPosition`]).
pub async fn run(
    broker: &Broker,
    name: &str,
    describe: &str,
    position: Option<&GroupPosition>,
) -> Result<(), Error> {
    let waiting_max = crate::bench::count_from_env("RETRY_BENCH_BACKLOG", 100_000, 0)? as u64;
    let topic = format!("bench-backlog-{}", uuid_like());
    let log = child::log_path(&format!("backlog-consumer-{name}.log"))?;
    let child::Helper {
        mut child,
        pid,
        mut lines,
        ..
    } = child::spawn(CONSUMER_PART, &[(TOPIC_ENV, topic.clone())], &log)?;
    let (tx, mut reports) = mpsc::unbounded_channel();
    // The consumer's last heap report (it sends one every 250 ms).
    let heap = Arc::new(Mutex::new(None));
    let last_heap = heap.clone();
    tokio::spawn(async move {
        while let Some(line) = lines.recv().await {
            let Some(report) = Report::parse(&line) else {
                continue;
            };
            if let Report::Heap(used, free) = report {
                *last_heap.lock().unwrap_or_else(|p| p.into_inner()) = Some((used, free));
            } else if tx.send(report).is_err() {
                break;
            }
        }
    });
    let fail =
        |what: String| -> Error { format!("{what} (consumer log: {})", log.display()).into() };
    wait_for(&mut reports, Duration::from_secs(120), |r| {
        matches!(r, Report::Ready)
    })
    .await
    .map_err(|_| fail("the consumer did not start".into()))?;

    let producer = broker.producer();
    let mut phases = Vec::new();
    let mut waiting = 0;
    let mut targets = vec![0, 1_000.min(waiting_max), waiting_max];
    targets.dedup();
    for target in targets {
        if target > waiting {
            futures::stream::iter(waiting..target)
                .map(|n| {
                    let producer = producer.clone();
                    let topic = topic.clone();
                    async move {
                        let id = format!("w-{n}");
                        producer
                            .publish(&topic, Event::new(format!("w:{n}")).with_id(id))
                            .await
                            .map(drop)
                    }
                })
                .buffer_unordered(256)
                .try_collect::<Vec<()>>()
                .await?;
            wait_for(
                &mut reports,
                Duration::from_secs(600),
                |r| matches!(&r, Report::Scheduled(n) if *n >= target),
            )
            .await
            .map_err(|_| fail(format!("{target} retries were not scheduled within 600 s")))?;
            waiting = target;
        }
        if phases.is_empty() {
            healthy_phase(broker, &topic, "warm-up", WARM_UP, &mut reports, position)
                .await
                .map_err(|e| fail(e.to_string()))?;
        }
        let label = format!("phase-{}", phases.len());
        let Timings {
            mut latencies,
            mut publishes,
        } = healthy_phase(
            broker,
            &topic,
            &label,
            HEALTHY_PER_PHASE,
            &mut reports,
            position,
        )
        .await
        .map_err(|e| fail(e.to_string()))?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rss_kib = child::rss_kib(pid)?;
        let heap_kib = *heap.lock().unwrap_or_else(|p| p.into_inner());
        latencies.sort_unstable();
        publishes.sort_unstable();
        let phase = Phase {
            waiting,
            p50: percentile(&latencies, 50),
            p99: percentile(&latencies, 99),
            max: latencies[latencies.len() - 1],
            publish_p50: percentile(&publishes, 50),
            publish_p99: percentile(&publishes, 99),
            rss_kib,
            heap_kib,
        };
        let ms = |us: i64| us as f64 / 1000.0;
        println!(
            "backlog {name}: {:>6} waiting: healthy latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (the publish alone: p50 {:.2} ms, p99 {:.2} ms); consumer RSS {:.1} MiB{}",
            phase.waiting,
            ms(phase.p50),
            ms(phase.p99),
            ms(phase.max),
            ms(phase.publish_p50),
            ms(phase.publish_p99),
            phase.rss_kib as f64 / 1024.0,
            phase.heap_kib.map_or(String::new(), |(used, free)| format!(
                " (glibc's heap in use {:.1} MiB, freed but held by it {:.1} MiB)",
                used as f64 / 1024.0,
                free as f64 / 1024.0
            ))
        );
        phases.push(phase);
    }
    // `RETRY_BENCH_BACKLOG_HOLD=<seconds>` keeps the consumer running with everything still waiting, for
    // an operator to look into the process (its maps, its allocator) before it is stopped.
    let hold = crate::bench::count_from_env("RETRY_BENCH_BACKLOG_HOLD", 0, 0)?;
    if hold > 0 {
        println!("backlog {name}: holding the consumer (pid {pid}) for {hold} s");
        tokio::time::sleep(Duration::from_secs(hold as u64)).await;
    }
    child.kill().await.ok();
    // The broker's part alone: the same publishes with the consumer stopped and the backlog still in
    // the broker. A publish time that stays high belongs to the broker holding the backlog; one that
    // drops belonged to the consumer's traffic beside it.
    let mut alone: Vec<i64> =
        publish_healthy(broker, &topic, "stopped", PUBLISHES_WITHOUT_CONSUMER)
            .await?
            .iter()
            .map(|s| s.micros)
            .collect();
    alone.sort_unstable();
    println!(
        "backlog {name}: {:>6} waiting, the consumer stopped: the publish alone p50 {:.2} ms, p99 {:.2} ms",
        waiting,
        percentile(&alone, 50) as f64 / 1000.0,
        percentile(&alone, 99) as f64 / 1000.0
    );
    // The waiting retries would outlive the bench in the broker (and fill an in-memory one's heap).
    crate::bench::tidy(broker.admin(), &topic).await;
    println!(
        "({HEALTHY_PER_PHASE} healthy events at {HEALTHY_PER_SECOND}/s per phase; waiting events under \"{WAIT_POLICY}\"; the consumer's allocator: {}; {describe})",
        crate::allocator::name()
    );
    let idle = phases[0];
    for p in &phases[1..] {
        println!(
            "ratio backlog/idle latency p99 {name} {}: {:.2}",
            p.waiting,
            p.p99 as f64 / (idle.p99 as f64).max(1.0)
        );
    }
    for p in &phases[1..] {
        println!(
            "ratio backlog/idle rss {name} {}: {:.2}",
            p.waiting,
            p.rss_kib as f64 / idle.rss_kib.max(1) as f64
        );
    }
    Ok(())
}

/// The id of the `i`-th healthy event of phase `label`.
fn healthy_id(label: &str, i: usize) -> String {
    format!("h-{label}-{i}")
}

/// Whether `id` is one of the `count` healthy events of phase `label`.
fn is_of_phase(id: &str, label: &str, count: usize) -> bool {
    id.strip_prefix("h-")
        .and_then(|rest| rest.strip_prefix(label))
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| n < count)
}

/// Publishes `count` healthy events at the healthy rate; each one's id, publish time (the broker's answer
/// to the producer, in µs) and place in the broker.
async fn publish_healthy(
    broker: &Broker,
    topic: &str,
    label: &str,
    count: usize,
) -> Result<Vec<Sent>, Error> {
    let producer = broker.producer();
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / HEALTHY_PER_SECOND));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sends = Vec::with_capacity(count);
    for i in 0..count {
        tick.tick().await;
        let producer = producer.clone();
        let topic = topic.to_string();
        let id = healthy_id(label, i);
        sends.push(tokio::spawn(async move {
            let sent = now_micros();
            producer
                .publish(&topic, Event::new(format!("h:{sent}")).with_id(id.clone()))
                .await
                .map(|published| Sent {
                    id,
                    micros: now_micros() - sent,
                    published,
                })
        }));
    }
    let mut publishes = Vec::with_capacity(count);
    for send in sends {
        publishes.push(send.await??);
    }
    Ok(publishes)
}

/// How long a report waits, after the 120 s, for the healthy events still missing: one that arrives
/// then was late, not lost.
const LATE_PATIENCE: Duration = Duration::from_secs(60);

/// The failure report of a phase whose healthy events were not all handled within 120 s: each missing
/// id with where the broker put it, where the consumer's group stands there (if the adapter can say),
/// and whether the id arrived in the next [`LATE_PATIENCE`] — a record the group committed past and that
/// never arrives is lost; one beyond the committed offset that arrives late is late.
async fn missing_report(
    label: &str,
    count: usize,
    sent: &[Sent],
    handled: &std::collections::HashMap<String, i64>,
    topic: &str,
    position: Option<&GroupPosition>,
    reports: &mut mpsc::UnboundedReceiver<Report>,
) -> Error {
    let missing: Vec<&Sent> = sent
        .iter()
        .filter(|s| !handled.contains_key(&s.id))
        .collect();
    let listed = missing
        .iter()
        .take(10)
        .map(|s| format!("{} ({})", s.id, place(&s.published)))
        .collect::<Vec<_>>()
        .join(", ");
    let group = match position {
        Some(position) => {
            let places = missing.iter().map(|s| s.published.clone()).collect();
            format!("; the group: {}", position(topic.to_string(), places).await)
        }
        None => String::new(),
    };
    let mut late: Vec<String> = Vec::new();
    let started = tokio::time::Instant::now();
    let deadline = started + LATE_PATIENCE;
    while late.len() < missing.len() {
        match tokio::time::timeout_at(deadline, reports.recv()).await {
            Ok(Some(Report::Latency(_, id))) if missing.iter().any(|s| s.id == id) => {
                if !late.contains(&id) {
                    late.push(id);
                }
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    let afterwards = if late.len() == missing.len() {
        format!(
            "all {} handled late, within {:.1} s more",
            late.len(),
            started.elapsed().as_secs_f64()
        )
    } else {
        format!(
            "{} of them handled in the {} s after, {} still missing",
            late.len(),
            LATE_PATIENCE.as_secs(),
            missing.len() - late.len()
        )
    };
    format!(
        "{label}: {} of {count} healthy events handled within 120 s; never handled: {listed}{group}; {afterwards}",
        handled.len(),
    )
    .into()
}

/// Reads where the consumer's group stands for records it has not handled (on Kafka: the group's
/// committed offset and the high watermark of each record's partition), for a failure report. Given
/// the topic and where the broker put each record; answers one line.
pub type GroupPosition =
    dyn Fn(String, Vec<Published>) -> futures::future::BoxFuture<'static, String> + Send + Sync;

/// Publishes `count` healthy events at a steady rate and collects their latencies and publish times.
async fn healthy_phase(
    broker: &Broker,
    topic: &str,
    label: &str,
    count: usize,
    reports: &mut mpsc::UnboundedReceiver<Report>,
    position: Option<&GroupPosition>,
) -> Result<Timings, Error> {
    let sent = publish_healthy(broker, topic, label, count).await?;
    // Counted by id: a healthy event handled twice, or one of another phase handled late, is not one
    // of this phase's.
    let mut handled: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while handled.len() < count {
        match tokio::time::timeout_at(deadline, reports.recv()).await {
            Ok(Some(Report::Latency(us, id))) if is_of_phase(&id, label, count) => {
                handled.entry(id).or_insert(us);
            }
            Ok(Some(_)) => {}
            Ok(None) => return Err("the consumer process exited".into()),
            Err(_) => {
                return Err(missing_report(
                    label, count, &sent, &handled, topic, position, reports,
                )
                .await);
            }
        }
    }
    let latencies: Vec<i64> = handled.into_values().collect();
    Ok(Timings {
        latencies,
        publishes: sent.iter().map(|s| s.micros).collect(),
    })
}

async fn wait_for(
    reports: &mut mpsc::UnboundedReceiver<Report>,
    within: Duration,
    done: impl Fn(Report) -> bool,
) -> Result<(), Error> {
    tokio::time::timeout(within, async {
        while let Some(r) = reports.recv().await {
            if done(r) {
                return Ok(());
            }
        }
        Err::<(), Error>("the consumer process exited".into())
    })
    .await
    .map_err(|_| -> Error { "timed out".into() })?
}

/// This process's heap as glibc's allocator reports it (`malloc_info`): KiB in use — the arenas' memory
/// less their free chunks, plus chunks mapped on their own — and KiB free in the arenas (freed, held).
/// With mimalloc as Rust's allocator this is what C code (librdkafka) allocates through glibc. `None`
/// where glibc does not answer, and with jemalloc, which serves every allocation then (glibc's arenas
/// stay empty).
fn heap_kib() -> Option<(u64, u64)> {
    use malloc_info::info::{SystemType, TotalType};
    if cfg!(feature = "jemalloc") {
        return None;
    }
    let info = malloc_info::malloc_info().ok()?;
    let total = |kind: TotalType| -> usize {
        info.total
            .iter()
            .filter(|t| t.r#type == kind)
            .map(|t| t.size)
            .sum()
    };
    let arenas: usize = info
        .system
        .iter()
        .filter(|s| s.r#type == SystemType::Current)
        .map(|s| s.size)
        .sum();
    let free = total(TotalType::Fast) + total(TotalType::Rest);
    let used = arenas.saturating_sub(free) + total(TotalType::Mmap);
    Some(((used / 1024) as u64, (free / 1024) as u64))
}

/// Wall-clock microseconds since the Unix epoch (both processes read the same clock).
fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

fn uuid_like() -> String {
    format!("{:x}{:x}", Timestamp::now().as_millis(), std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_round_trip_and_other_lines_are_ignored() {
        for r in [
            Report::Ready,
            Report::Latency(-2, "h-idle-7".into()),
            Report::Scheduled(100_000),
            Report::Heap(20_480, 512),
        ] {
            assert_eq!(Report::parse(&r.render()), Some(r.clone()));
        }
        for other in [
            "",
            "BACKLOG",
            "BACKLOG latency",
            "BACKLOG latency 12",
            "BACKLOG scheduled x",
            "BACKLOG heap 12",
            "INFO ready",
        ] {
            assert_eq!(Report::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn only_a_phases_own_healthy_ids_count_for_it() {
        assert!(is_of_phase(&healthy_id("idle", 999), "idle", 1_000));
        assert!(!is_of_phase(&healthy_id("idle", 1_000), "idle", 1_000));
        assert!(!is_of_phase(&healthy_id("warm-up", 3), "idle", 1_000));
        assert!(!is_of_phase("h-idle", "idle", 1_000));
        assert!(!is_of_phase("w:1", "idle", 1_000));
    }

    /// The heap this process reports grows by what it holds: 32 MiB kept alive shows in use. Only on
    /// glibc's allocator: with mimalloc glibc does not see Rust's allocations, and with jemalloc nothing.
    #[cfg(not(any(feature = "mimalloc", feature = "jemalloc")))]
    #[test]
    fn the_heap_in_use_counts_what_is_held() {
        let (before, _) = heap_kib().expect("glibc's malloc_info");
        let held: Vec<Vec<u8>> = (0..32).map(|_| vec![1u8; 1 << 20]).collect();
        let (during, _) = heap_kib().expect("glibc's malloc_info");
        assert!(
            during >= before + 30 * 1024,
            "in use {before} KiB before, {during} KiB while 32 MiB are held"
        );
        drop(held);
    }
}
