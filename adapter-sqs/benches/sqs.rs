//! The SQS adapter against a raw aws-sdk-sqs loop, on the local endpoint, in one run:
//!
//! 1. happy-path throughput: the same prefilled queue drained by a raw loop (receive up to 10, handle
//!    each, delete each while the next batch is received) and by the SDK's consumer (same handler),
//!    twice each, alternating; the ratio compares the better run of each;
//! 2. retry lateness: events fail once and retry after delays spread over 1–60 s (granularity 1 s);
//!    lateness is the retry's start minus its due time (wall clock); an early retry fails the bench.
//! 3. backlog: healthy-event latency and the consumer process's resident set, idle and while 1,000 and
//!    100,000 events wait in retry (`test_support::backlog`; `RETRY_BENCH_BACKLOG` sets the larger count);
//! 4. scale: 1, 2 and 4 consumer processes in one group (`test_support::scale`).
//!
//! ```text
//! scripts/brokers start sqs && source target/brokers/env.sh
//! cargo bench -p event-retry-sqs --bench sqs                 # every part
//! cargo bench -p event-retry-sqs --bench sqs -- throughput   # or lateness, backlog, scale
//! ```

use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use event_retry_sqs::SqsTransport;
use retry_core::adapter::Admin;
use retry_core::broker::Broker;
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
    for _ in 0..2 {
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
        "visibility-timeout retries",
        &transport,
    )
    .await?;
    if bench::wants("throughput") {
        throughput(url, &transport).await?;
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
