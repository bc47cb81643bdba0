//! The SQS adapter against a raw aws-sdk-sqs loop, on the local endpoint, in one run:
//!
//! 1. happy-path throughput: the same prefilled queue drained by a raw loop (receive up to 10, handle
//!    each, delete each while the next batch is received) and by the SDK's consumer (same handler),
//!    twice each, alternating; the ratio compares the better run of each;
//! 2. retry lateness: events fail once and retry after delays spread over 1–60 s (granularity 1 s);
//!    lateness is the retry's start minus its due time (wall clock); an early retry fails the bench.
//! 3. backlog: healthy-event latency and the consumer process's resident set, idle and while 1,000 and
//!    100,000 events wait in retry (`test_support::backlog`; `RETRY_BENCH_BACKLOG` sets the larger count);
//! 4. scale: 1, 2 and 4 consumer processes in one group (`test_support::scale`);
//! 5. busy: retry lateness while a backlog of healthy events waits in the same queue, against the idle
//!    lateness (`test_support::busy`), through the retry queue (`sqs`, the default); `busy-visibility`
//!    the same by visibility in the source queue (`sqs-visibility`, `retry_queue=false`);
//! 6. `backlog-raw` (only when named): the backlog part's healthy-event latency with the raw client and
//!    no SDK — a receive loop as the adapter's (up to 10 per receive, long polling 1 s), messages sent at
//!    100/s — idle and while 1,000 and 100,000 received messages are hidden for 10 minutes by
//!    ChangeMessageVisibility, as the SDK's waiting retries are: what the broker itself does under that
//!    backlog.
//!
//! ```text
//! scripts/brokers start sqs && source target/brokers/env.sh
//! cargo bench -p event-retry-sqs --bench sqs                 # every part
//! cargo bench -p event-retry-sqs --bench sqs -- throughput   # or lateness, backlog, scale, busy, busy-visibility
//! cargo bench -p event-retry-sqs --bench sqs -- backlog-raw  # the broker alone under a backlog
//! ```

use std::time::{Duration, Instant};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use event_retry_core::adapter::Admin;
use event_retry_core::broker::Broker;
use event_retry_sqs::{SqsConfig, SqsTransport};
use test_support::bench::{self, Clock, Error, Rate, Throughput, work};

const MESSAGES: usize = 3_000;
const CONCURRENCY: usize = 10;
const RETRIES: usize = 200;

fn main() -> Result<(), Error> {
    bench::main(
        "RETRY_TEST_SQS",
        "sqs",
        |url| async move { run(&url).await },
    )
}

async fn prefill(transport: &SqsTransport, topic: &str) -> Result<(), Error> {
    transport.declare(topic, None).await?;
    bench::publish_all(&Broker::new(transport.clone()), topic, MESSAGES, 32).await
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

async fn raw_run(client: &Client, transport: &SqsTransport, topic: &str) -> Result<Rate, Error> {
    prefill(transport, topic).await?;
    let queue = client
        .get_queue_url()
        .queue_name(topic)
        .send()
        .await?
        .queue_url
        .unwrap_or_default();
    let clock = Clock::start();
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
            clock.message();
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
    let rate = clock.rate(MESSAGES);
    transport.delete(topic).await?;
    Ok(rate)
}

async fn sdk_run(transport: &SqsTransport, topic: &str) -> Result<Rate, Error> {
    prefill(transport, topic).await?;
    let rate = bench::sdk_round(
        &Broker::new(transport.clone()),
        topic,
        MESSAGES,
        CONCURRENCY,
    )
    .await?;
    transport.delete(topic).await?;
    Ok(rate)
}

async fn throughput(url: &str, transport: &SqsTransport) -> Result<(), Error> {
    let client = raw_client(url);
    let mut rounds = Throughput::default();
    for _ in 0..3 {
        let id = uuid::Uuid::new_v4().simple();
        let raw = raw_run(&client, transport, &format!("bench-raw-{id}")).await?;
        let sdk = sdk_run(transport, &format!("bench-sdk-{id}")).await?;
        rounds.round(
            raw,
            sdk,
            "raw aws-sdk-sqs",
            &format!("{MESSAGES} messages, batches of 10, concurrency {CONCURRENCY}"),
        );
    }
    rounds.report("sqs");
    Ok(())
}

async fn run(url: &str) -> Result<(), Error> {
    let transport = SqsTransport::connect(url).await?;
    if let Some(done) = bench::helper_consumer(&Broker::new(transport.clone())).await {
        return done;
    }
    bench::consumer_process_parts(
        &Broker::new(transport.clone()),
        "sqs",
        "retries through the retry queue",
        &transport,
        None,
    )
    .await?;
    if bench::wants("throughput") {
        throughput(url, &transport).await?;
    }
    if bench::wants("busy") {
        let topic = format!("bench-busy-{}", uuid::Uuid::new_v4().simple());
        test_support::busy::run(
            &Broker::new(transport.clone()),
            &topic,
            "sqs",
            "retries through the retry queue, granularity 1 s",
        )
        .await?;
        transport.delete(&topic).await?;
    }
    if bench::wants("busy-visibility") {
        // The same by visibility in the source queue (`retry_queue=false`, as FIFO queues retry).
        let config = SqsConfig {
            retry_queue: false,
            ..SqsConfig::default()
        };
        let visibility = SqsTransport::connect_with(url, config).await?;
        let topic = format!("bench-busy-visibility-{}", uuid::Uuid::new_v4().simple());
        test_support::busy::run(
            &Broker::new(visibility.clone()),
            &topic,
            "sqs-visibility",
            "visibility-timeout retries (retry_queue=false), granularity 1 s",
        )
        .await?;
        visibility.delete(&topic).await?;
    }
    if bench::asked("backlog-raw") {
        raw_backlog(&raw_client(url)).await?;
    }
    if bench::wants("lateness") {
        let topic = format!("bench-lateness-{}", uuid::Uuid::new_v4().simple());
        bench::lateness(
            &Broker::new(transport.clone()),
            &topic,
            RETRIES,
            Duration::from_secs(150),
            "granularity 1 s",
        )
        .await?;
        transport.delete(&topic).await?;
    }
    Ok(())
}

/// Healthy messages per phase of the raw backlog part, and their rate.
const RAW_HEALTHY: usize = 1_000;
const RAW_PER_SECOND: u64 = 100;

/// The broker alone under a backlog (part 5 of the module docs): one queue, a receive loop that deletes
/// what it receives and records each message's latency (receive time minus the send time in its body),
/// and three phases of healthy messages with 0, 1,000 and 100,000 others hidden.
async fn raw_backlog(client: &Client) -> Result<(), Error> {
    let name = format!("bench-raw-backlog-{}", uuid::Uuid::new_v4().simple());
    let url = client
        .create_queue()
        .queue_name(&name)
        .send()
        .await?
        .queue_url
        .ok_or("no queue URL")?;
    let mut hidden = 0;
    for backlog in [0, 1_000, 100_000] {
        hide(client, &url, backlog - hidden).await?;
        hidden = backlog;
        let (p50, p99, max) = raw_phase(client, &url).await?;
        println!(
            "backlog-raw sqs: {backlog:>6} hidden: latency p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms (raw aws-sdk-sqs, long polling 1 s)"
        );
    }
    client.delete_queue().queue_url(&url).send().await?;
    Ok(())
}

/// Sends `n` messages, receives them under the adapter's visibility timeout (30 s) and hides each for 10
/// minutes with ChangeMessageVisibility — what the adapter does to a message it retries — without deleting
/// them.
async fn hide(client: &Client, url: &str, n: usize) -> Result<(), Error> {
    use aws_sdk_sqs::types::{
        ChangeMessageVisibilityBatchRequestEntry, SendMessageBatchRequestEntry,
    };
    use futures::{StreamExt, TryStreamExt};
    let batches: Vec<usize> = (0..n.div_ceil(10)).collect();
    futures::stream::iter(batches)
        .map(|b| async move {
            let entries = (0..10.min(n - b * 10))
                .map(|i| {
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body("waiting")
                        .build()
                })
                .collect::<Result<Vec<_>, _>>()?;
            client
                .send_message_batch()
                .queue_url(url)
                .set_entries(Some(entries))
                .send()
                .await?;
            Ok::<(), Error>(())
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    let mut taken = 0;
    while taken < n {
        let got = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .visibility_timeout(30)
            .send()
            .await?
            .messages
            .unwrap_or_default();
        taken += got.len();
        if got.is_empty() {
            continue;
        }
        let entries = got
            .iter()
            .enumerate()
            .map(|(i, m)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .visibility_timeout(600)
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        client
            .change_message_visibility_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await?;
    }
    Ok(())
}

/// One phase: `RAW_HEALTHY` messages at `RAW_PER_SECOND`, each received and deleted by one loop like the
/// adapter's; p50, p99 and max latency in ms.
async fn raw_phase(client: &Client, url: &str) -> Result<(f64, f64, f64), Error> {
    let epoch = Instant::now();
    let receiver = {
        let (client, url) = (client.clone(), url.to_string());
        tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(RAW_HEALTHY);
            while latencies.len() < RAW_HEALTHY {
                let got = client
                    .receive_message()
                    .queue_url(&url)
                    .max_number_of_messages(10)
                    .wait_time_seconds(1)
                    .send()
                    .await?
                    .messages
                    .unwrap_or_default();
                for m in got {
                    let sent: u64 = m.body().unwrap_or_default().parse()?;
                    let now = u64::try_from(epoch.elapsed().as_micros())?;
                    latencies.push(i64::try_from(now.saturating_sub(sent))?);
                    client
                        .delete_message()
                        .queue_url(&url)
                        .receipt_handle(m.receipt_handle().unwrap_or_default())
                        .send()
                        .await?;
                }
            }
            Ok::<Vec<i64>, Error>(latencies)
        })
    };
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RAW_PER_SECOND));
    for _ in 0..RAW_HEALTHY {
        tick.tick().await;
        let sent = epoch.elapsed().as_micros().to_string();
        client
            .send_message()
            .queue_url(url)
            .message_body(sent)
            .send()
            .await?;
    }
    let mut latencies = receiver.await??;
    latencies.sort_unstable();
    let ms = |us: i64| us as f64 / 1000.0;
    Ok((
        ms(bench::percentile(&latencies, 50)),
        ms(bench::percentile(&latencies, 99)),
        ms(*latencies.last().unwrap_or(&0)),
    ))
}
