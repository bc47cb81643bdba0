//! The RabbitMQ adapter against the raw client, on the local broker, in one run:
//!
//! 1. happy-path throughput: the same prefilled queue drained by a raw lapin consumer (prefetch P, up to
//!    P messages handled and acked concurrently) and by the SDK's consumer (concurrency P, same handler),
//!    twice each, alternating; the ratio compares the better run of each;
//! 2. retry lateness: a few hundred events fail once and retry after delays spread over 1–60 s; lateness
//!    is the retry's start minus its due time (wall clock), and an early retry is counted as a failure.
//!
//! ```text
//! scripts/brokers start rabbitmq && source target/brokers/env.sh
//! cargo bench -p event-retry-rabbitmq --bench rabbitmq                 # both parts
//! cargo bench -p event-retry-rabbitmq --bench rabbitmq -- throughput   # or lateness
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use event_retry_rabbitmq::RabbitTransport;
use futures::{StreamExt, TryStreamExt};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use retry_core::classify::HandlerError;
use retry_core::event::Event;
use retry_core::policy::RetryPolicy;
use retry_core::runtime::{Consumer, Context, handler_fn};
use retry_core::time::Timestamp;
use retry_core::transport::Transport;

const MESSAGES: usize = 20_000;
const PREFETCH: usize = 64;
const RETRIES: usize = 300;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let Some(url) = std::env::var("RETRY_TEST_AMQP")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!(
            "RETRY_TEST_AMQP is not set: start the broker (scripts/brokers start rabbitmq) and source target/brokers/env.sh"
        );
        std::process::exit(2);
    };
    // `cargo bench` passes --bench; a plain `cargo test` run of benches only checks it starts.
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(&url))
}

/// The work every consumer does per message: look at every byte (so the payload is really read).
fn work(payload: &[u8]) -> u64 {
    payload.iter().map(|b| u64::from(*b)).sum()
}

async fn prefill(transport: &RabbitTransport, topic: &str) -> Result<(), Error> {
    transport.declare(topic).await?;
    futures::stream::iter(0..MESSAGES)
        .map(|i| async move {
            let id = format!("m{i}");
            let body = format!("{{\"id\":{i},\"pad\":\"{}\"}}", "x".repeat(200));
            transport
                .publish(topic, &Event::new(body).with_id(id))
                .await
        })
        .buffer_unordered(256)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn raw_run(url: &str, transport: &RabbitTransport, topic: &str) -> Result<f64, Error> {
    prefill(transport, topic).await?;
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(PREFETCH as u16, BasicQosOptions::default())
        .await?;
    let started = Instant::now();
    let consumer = ch
        .basic_consume(
            topic.into(),
            "raw-bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    // The raw consumer works like the SDK: up to PREFETCH messages handled and acked concurrently.
    let sink = Arc::new(AtomicU64::new(0));
    consumer
        .take(MESSAGES)
        .map_err(Error::from)
        .try_for_each_concurrent(PREFETCH, |d| {
            let sink = sink.clone();
            async move {
                sink.fetch_add(work(&d.data), Ordering::Relaxed);
                d.ack(BasicAckOptions::default()).await?;
                Ok(())
            }
        })
        .await?;
    let rate = MESSAGES as f64 / started.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    conn.close(200, "done".into()).await?;
    transport.delete_topic(topic).await?;
    Ok(rate)
}

async fn sdk_run(transport: &RabbitTransport, topic: &str) -> Result<f64, Error> {
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
    let consumer = Consumer::builder(Arc::new(transport.clone()) as Arc<dyn Transport>, topic)
        .concurrency(PREFETCH)
        .build()?
        .start(handler)
        .await?;
    while consumer.stats().succeeded < MESSAGES as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = MESSAGES as f64 / started.elapsed().as_secs_f64();
    consumer.shutdown().await?;
    transport.delete_topic(topic).await?;
    Ok(rate)
}

async fn lateness(transport: &RabbitTransport) -> Result<(), Error> {
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
    // Uniform delays over [1.2 s, 59.8 s].
    let policy = RetryPolicy::parse("30500ms x1; jitter=±96%")?;
    let consumer = Consumer::builder(Arc::new(transport.clone()) as Arc<dyn Transport>, &topic)
        .policy(policy)
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
    let deadline = Instant::now() + Duration::from_secs(120);
    while consumer.stats().succeeded_after_retry < RETRIES as u64 {
        if Instant::now() > deadline {
            return Err(format!("retries did not finish: {:?}", consumer.stats()).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    consumer.shutdown().await?;
    transport.delete_topic(&topic).await?;
    let mut late = late_ms.lock().unwrap_or_else(|p| p.into_inner()).clone();
    late.sort_unstable();
    let early = late.iter().filter(|&&l| l < 0).count();
    let pct = |p: usize| late[(late.len() * p / 100).min(late.len() - 1)];
    println!(
        "retry lateness over {} retries with delays of 1.2-59.8 s (granularity {:?}): p50 {} ms, p99 {} ms, max {} ms, early {}",
        late.len(),
        transport.config().granularity,
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
    let transport = RabbitTransport::connect(url).await?;
    // `cargo bench ... -- throughput` or `-- lateness` runs one part.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    if wants("throughput") {
        throughput(url, &transport).await?;
    }
    if wants("lateness") {
        lateness(&transport).await?;
    }
    Ok(())
}

async fn throughput(url: &str, transport: &RabbitTransport) -> Result<(), Error> {
    let mut raw = Vec::new();
    let mut sdk = Vec::new();
    for round in 0..2 {
        let id = uuid::Uuid::new_v4().simple();
        raw.push(raw_run(url, transport, &format!("bench-raw-{id}")).await?);
        sdk.push(sdk_run(transport, &format!("bench-sdk-{id}")).await?);
        println!(
            "round {}: raw lapin {:.0} msg/s, SDK {:.0} msg/s ({MESSAGES} messages, prefetch/concurrency {PREFETCH})",
            round + 1,
            raw[round],
            sdk[round]
        );
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    println!(
        "happy-path throughput: SDK/raw = {:.2} (best of 2: SDK {:.0} msg/s, raw {:.0} msg/s)",
        best(&sdk) / best(&raw),
        best(&sdk),
        best(&raw)
    );
    Ok(())
}
