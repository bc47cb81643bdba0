//! The Kafka adapter against a raw rdkafka consumer, on the local broker, in one run:
//!
//! 1. happy-path throughput: a topic of `MESSAGES` records drained by a raw `StreamConsumer` (the same
//!    work per record, then its offset stored and committed by librdkafka) and by the SDK's consumer
//!    (concurrency P, same handler), three rounds each, alternating; the ratio compares the best run of
//!    each (the broker's JVM warms up and its rate swings between rounds);
//!    The same handler through the in-memory transport (no broker) is measured too: the runtime's own
//!    ceiling on this machine, which the SDK on any broker cannot pass;
//! 2. retry lateness: events fail once and retry after delays spread over 1–60 s through the delay ladder
//!    (100 ms steps); lateness is the retry's start minus its due time (wall clock); an early retry fails
//!    the bench.
//!
//! ```text
//! scripts/brokers start kafka && source target/brokers/env.sh
//! cargo bench -p event-retry-kafka --bench kafka                 # both parts
//! cargo bench -p event-retry-kafka --bench kafka -- throughput   # or lateness
//! cargo bench -p event-retry-kafka --bench kafka -- sdk          # one SDK round alone, for profiling
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use event_retry_kafka::{KafkaConfig, KafkaTransport, bootstrap_of};
use futures::{StreamExt, TryStreamExt};
use rdkafka::Message;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use retry_core::classify::HandlerError;
use retry_core::event::Event;
use retry_core::memory::MemoryTransport;
use retry_core::policy::RetryPolicy;
use retry_core::runtime::{Consumer as RetryConsumer, Context, handler_fn};
use retry_core::time::Timestamp;
use retry_core::transport::Transport;

const MESSAGES: usize = 50_000;
const CONCURRENCY: usize = 64;
const RETRIES: usize = 300;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let Some(url) = std::env::var("RETRY_TEST_KAFKA")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!(
            "RETRY_TEST_KAFKA is not set: start the broker (scripts/brokers start kafka) and source target/brokers/env.sh"
        );
        std::process::exit(2);
    };
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(&url))
}

fn work(payload: &[u8]) -> u64 {
    payload.iter().map(|b| u64::from(*b)).sum()
}

async fn prefill(transport: &KafkaTransport, topic: &str) -> Result<(), Error> {
    transport.declare(topic, None).await?;
    futures::stream::iter(0..MESSAGES)
        .map(|i| async move {
            let body = format!("{{\"id\":{i},\"pad\":\"{}\"}}", "x".repeat(200));
            transport
                .publish(topic, &Event::new(body).with_id(format!("m{i}")))
                .await
        })
        .buffer_unordered(1024)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn raw_run(url: &str, transport: &KafkaTransport, topic: &str) -> Result<f64, Error> {
    prefill(transport, topic).await?;
    let started = Instant::now();
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_of(url)?)
        .set("group.id", format!("{topic}-raw"))
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[topic])?;
    let mut sink = 0;
    for _ in 0..MESSAGES {
        let message = consumer.recv().await?;
        sink += work(message.payload().unwrap_or_default());
        consumer.store_offset_from_message(&message)?;
    }
    std::hint::black_box(sink);
    Ok(MESSAGES as f64 / started.elapsed().as_secs_f64())
}

async fn sdk_run(transport: &KafkaTransport, topic: &str) -> Result<f64, Error> {
    prefill(transport, topic).await?;
    let sink = Arc::new(AtomicU64::new(0));
    let s = sink.clone();
    let handler = handler_fn(move |event: Event, _ctx: Context| {
        let s = s.clone();
        async move {
            s.fetch_add(work(&event.payload), Ordering::Relaxed);
            Ok::<(), HandlerError>(())
        }
    });
    let started = Instant::now();
    let consumer = RetryConsumer::builder(Arc::new(transport.clone()) as Arc<dyn Transport>, topic)
        .concurrency(CONCURRENCY)
        .build()?
        .start(handler)
        .await?;
    while consumer.stats().succeeded < MESSAGES as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = MESSAGES as f64 / started.elapsed().as_secs_f64();
    consumer.shutdown().await?;
    Ok(rate)
}

/// The same handler and concurrency through the in-memory transport: the runtime without a broker.
async fn memory_run() -> Result<f64, Error> {
    let transport = MemoryTransport::new();
    for i in 0..MESSAGES {
        let body = format!("{{\"id\":{i},\"pad\":\"{}\"}}", "x".repeat(200));
        transport
            .publish("ceiling", &Event::new(body).with_id(format!("m{i}")))
            .await?;
    }
    let handler = handler_fn(move |event: Event, _ctx: Context| async move {
        std::hint::black_box(work(&event.payload));
        Ok::<(), HandlerError>(())
    });
    let started = Instant::now();
    let consumer = RetryConsumer::builder(Arc::new(transport) as Arc<dyn Transport>, "ceiling")
        .concurrency(CONCURRENCY)
        .build()?
        .start(handler)
        .await?;
    while consumer.stats().succeeded < MESSAGES as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let rate = MESSAGES as f64 / started.elapsed().as_secs_f64();
    consumer.shutdown().await?;
    Ok(rate)
}

async fn throughput(url: &str, transport: &KafkaTransport) -> Result<(), Error> {
    let (mut raw, mut sdk) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let id = uuid::Uuid::new_v4().simple();
        raw.push(raw_run(url, transport, &format!("bench-raw-{id}")).await?);
        sdk.push(sdk_run(transport, &format!("bench-sdk-{id}")).await?);
        println!(
            "round {}: raw rdkafka {:.0} msg/s, SDK {:.0} msg/s ({MESSAGES} records in 2 partitions, SDK concurrency {CONCURRENCY})",
            round + 1,
            raw[round],
            sdk[round]
        );
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "happy-path throughput: SDK/raw = {:.2} (best of 3: SDK {:.0} msg/s, raw {:.0} msg/s); medians: {:.2}",
        best(&sdk) / best(&raw),
        best(&sdk),
        best(&raw),
        median(&sdk) / median(&raw)
    );
    println!(
        "the runtime alone (in-memory transport, same handler and concurrency): {:.0} msg/s",
        memory_run().await?
    );
    Ok(())
}

async fn lateness(transport: &KafkaTransport) -> Result<(), Error> {
    let topic = format!("bench-lateness-{}", uuid::Uuid::new_v4().simple());
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
    let consumer =
        RetryConsumer::builder(Arc::new(transport.clone()) as Arc<dyn Transport>, &topic)
            .policy(RetryPolicy::parse("30500ms x1; jitter=±96%")?)
            .concurrency(32)
            .build()?
            .start(handler)
            .await?;
    for i in 0..RETRIES {
        let id = format!("late-{i}");
        transport
            .publish(&topic, &Event::new(id.clone()).with_id(id))
            .await?;
    }
    let deadline = Instant::now() + Duration::from_secs(150);
    while consumer.stats().succeeded_after_retry < RETRIES as u64 {
        if Instant::now() > deadline {
            return Err(format!("retries did not finish: {:?}", consumer.stats()).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    consumer.shutdown().await?;
    let mut late = late_ms.lock().unwrap_or_else(|p| p.into_inner()).clone();
    late.sort_unstable();
    let early = late.iter().filter(|&&l| l < 0).count();
    let pct = |p: usize| late[(late.len() * p / 100).min(late.len() - 1)];
    println!(
        "retry lateness over {} retries with delays of 1.2-59.8 s ({}): p50 {} ms, p99 {} ms, max {} ms, early {}",
        late.len(),
        transport.config(),
        pct(50),
        pct(99),
        late[late.len() - 1],
        early
    );
    if early > 0 {
        return Err(format!("{early} retries ran before their due time").into());
    }
    Ok(())
}

async fn run(url: &str) -> Result<(), Error> {
    let config = KafkaConfig {
        partitions: 2,
        ..KafkaConfig::default()
    };
    let transport = KafkaTransport::connect_with(url, config).await?;
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    if wants("throughput") {
        throughput(url, &transport).await?;
    }
    if only.iter().any(|o| o == "sdk") {
        // The SDK's rounds alone (for profiling); not part of a default run.
        let topic = format!("bench-sdk-{}", uuid::Uuid::new_v4().simple());
        println!("SDK alone: {:.0} msg/s", sdk_run(&transport, &topic).await?);
    }
    if wants("lateness") {
        lateness(&transport).await?;
    }
    Ok(())
}
