//! The SQS adapter against a raw aws-sdk-sqs loop, on the local endpoint, in one run:
//!
//! 1. happy-path throughput: the same prefilled queue drained by a raw loop (receive up to 10, handle
//!    each, delete each while the next batch is received) and by the SDK's consumer (same handler),
//!    twice each, alternating; the ratio compares the better run of each;
//! 2. retry lateness: events fail once and retry after delays spread over 1–60 s (granularity 1 s);
//!    lateness is the retry's start minus its due time (wall clock); an early retry fails the bench.
//!
//! ```text
//! scripts/brokers start sqs && source target/brokers/env.sh
//! cargo bench -p event-retry-sqs --bench sqs                 # both parts
//! cargo bench -p event-retry-sqs --bench sqs -- throughput   # or lateness
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use event_retry_sqs::SqsTransport;
use futures::{StreamExt, TryStreamExt};
use retry_core::classify::HandlerError;
use retry_core::event::Event;
use retry_core::policy::RetryPolicy;
use retry_core::runtime::{Consumer, Context, handler_fn};
use retry_core::time::Timestamp;
use retry_core::transport::Transport;

const MESSAGES: usize = 3_000;
const CONCURRENCY: usize = 10;
const RETRIES: usize = 200;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let Some(url) = std::env::var("RETRY_TEST_SQS")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!(
            "RETRY_TEST_SQS is not set: start the endpoint (scripts/brokers start sqs) and source target/brokers/env.sh"
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

async fn prefill(transport: &SqsTransport, topic: &str) -> Result<(), Error> {
    transport.declare(topic).await?;
    futures::stream::iter(0..MESSAGES)
        .map(|i| async move {
            let body = format!("{{\"id\":{i},\"pad\":\"{}\"}}", "x".repeat(200));
            transport
                .publish(topic, &Event::new(body).with_id(format!("m{i}")))
                .await
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

fn raw_client(url: &str) -> Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(url)
        .credentials_provider(Credentials::new("local", "local", None, None, "bench"))
        .build();
    Client::from_conf(config)
}

async fn raw_run(client: &Client, transport: &SqsTransport, topic: &str) -> Result<f64, Error> {
    prefill(transport, topic).await?;
    let queue = client
        .get_queue_url()
        .queue_name(topic)
        .send()
        .await?
        .queue_url
        .unwrap_or_default();
    let started = Instant::now();
    let mut seen = 0;
    let mut sink = 0u64;
    // The deletes of one batch run while the next batch is received, as the SDK's settles do, with at
    // most CONCURRENCY messages in hand (the SDK's concurrency).
    let mut deletes = tokio::task::JoinSet::new();
    while seen < MESSAGES {
        let got = client
            .receive_message()
            .queue_url(&queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_attribute_names("All")
            .send()
            .await?
            .messages
            .unwrap_or_default();
        for m in &got {
            sink = sink.wrapping_add(work(m.body().unwrap_or_default().as_bytes()));
            let delete = client
                .delete_message()
                .queue_url(&queue)
                .receipt_handle(m.receipt_handle().unwrap_or_default());
            deletes.spawn(async move { delete.send().await.map(drop) });
        }
        seen += got.len();
        while deletes.len() > CONCURRENCY {
            if let Some(done) = deletes.join_next().await {
                done??;
            }
        }
    }
    while let Some(done) = deletes.join_next().await {
        done??;
    }
    std::hint::black_box(sink);
    let rate = MESSAGES as f64 / started.elapsed().as_secs_f64();
    transport.delete_topic(topic).await?;
    Ok(rate)
}

async fn sdk_run(transport: &SqsTransport, topic: &str) -> Result<f64, Error> {
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
        .concurrency(CONCURRENCY)
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

async fn throughput(url: &str, transport: &SqsTransport) -> Result<(), Error> {
    let client = raw_client(url);
    let (mut raw, mut sdk) = (Vec::new(), Vec::new());
    for round in 0..2 {
        let id = uuid::Uuid::new_v4().simple();
        raw.push(raw_run(&client, transport, &format!("bench-raw-{id}")).await?);
        sdk.push(sdk_run(transport, &format!("bench-sdk-{id}")).await?);
        println!(
            "round {}: raw aws-sdk-sqs {:.0} msg/s, SDK {:.0} msg/s ({MESSAGES} messages, batches of 10, concurrency {CONCURRENCY})",
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

async fn lateness(transport: &SqsTransport) -> Result<(), Error> {
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
    let consumer = Consumer::builder(Arc::new(transport.clone()) as Arc<dyn Transport>, &topic)
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
    transport.delete_topic(&topic).await?;
    let mut late = late_ms.lock().unwrap_or_else(|p| p.into_inner()).clone();
    late.sort_unstable();
    let early = late.iter().filter(|&&l| l < 0).count();
    let pct = |p: usize| late[(late.len() * p / 100).min(late.len() - 1)];
    println!(
        "retry lateness over {} retries with delays of 1.2-59.8 s (granularity 1 s): p50 {} ms, p99 {} ms, max {} ms, early {}",
        late.len(),
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
    let transport = SqsTransport::connect(url).await?;
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
