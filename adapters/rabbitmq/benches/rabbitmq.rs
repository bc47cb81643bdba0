//! The RabbitMQ adapter against the raw client, on the local broker, in one run:
//!
//! 1. happy-path throughput: the same prefilled queue drained by a raw lapin consumer (prefetch P, up to
//!    P messages handled and acked concurrently) and by the SDK's consumer (concurrency P, same handler),
//!    twice each, alternating; the ratio compares the better run of each;
//! 2. retry lateness: a few hundred events fail once and retry after delays spread over 1–60 s; lateness
//!    is the retry's start minus its due time (wall clock), and an early retry is counted as a failure.
//! 3. backlog: healthy-event latency and the consumer process's resident set, idle and while 1,000 and
//!    100,000 events wait in retry (`test_support::backlog`; `RETRY_BENCH_BACKLOG` sets the larger count);
//! 4. scale: 1, 2 and 4 consumer processes in one group (`test_support::scale`).
//! 5. busy: retry lateness while a backlog of healthy events waits in the same queue, against the idle
//!    lateness (`test_support::busy`).
//!
//! ```text
//! scripts/brokers start rabbitmq && source target/brokers/env.sh
//! cargo bench -p event-retry-rabbitmq --bench rabbitmq                 # every part
//! cargo bench -p event-retry-rabbitmq --bench rabbitmq -- throughput   # or lateness, backlog, scale, busy
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use event_retry_core::adapter::Admin;
use event_retry_core::broker::Broker;
use event_retry_rabbitmq::RabbitTransport;
use futures::{StreamExt, TryStreamExt};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use test_support::bench::{self, Clock, Error, Rate, Throughput, work};

const MESSAGES: usize = 20_000;
const PREFETCH: usize = 64;
const RETRIES: usize = 300;

fn main() -> Result<(), Error> {
    bench::main("RETRY_TEST_AMQP", "rabbitmq", |url| async move {
        run(&url).await
    })
}

async fn prefill(transport: &RabbitTransport, topic: &str) -> Result<(), Error> {
    transport.declare(topic, None).await?;
    bench::publish_all(&Broker::new(transport.clone()), topic, MESSAGES, 256).await
}

async fn raw_run(url: &str, transport: &RabbitTransport, topic: &str) -> Result<Rate, Error> {
    prefill(transport, topic).await?;
    // The queue the SDK's consumer would read: the topic's default group's.
    let queue = transport.names(topic, None).await?.topic;
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(PREFETCH as u16, BasicQosOptions::default())
        .await?;
    let clock = Arc::new(Clock::start());
    let consumer = ch
        .basic_consume(
            queue.as_str().into(),
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
            let (sink, clock) = (sink.clone(), clock.clone());
            async move {
                clock.message();
                sink.fetch_add(work(&d.data), Ordering::Relaxed);
                d.ack(BasicAckOptions::default()).await?;
                Ok(())
            }
        })
        .await?;
    let rate = clock.rate(MESSAGES);
    std::hint::black_box(sink);
    conn.close(200, "done".into()).await?;
    transport.delete(topic).await?;
    Ok(rate)
}

async fn sdk_run(transport: &RabbitTransport, topic: &str) -> Result<Rate, Error> {
    prefill(transport, topic).await?;
    let rate = bench::sdk_round(&Broker::new(transport.clone()), topic, MESSAGES, PREFETCH).await?;
    transport.delete(topic).await?;
    Ok(rate)
}

async fn run(url: &str) -> Result<(), Error> {
    let transport = RabbitTransport::connect(url).await?;
    if let Some(done) = bench::helper_consumer(&Broker::new(transport.clone())).await {
        return done;
    }
    bench::consumer_process_parts(
        &Broker::new(transport.clone()),
        "rabbitmq",
        &format!("granularity {:?}", transport.config().granularity),
        &transport,
        None,
    )
    .await?;
    if bench::wants("throughput") {
        throughput(url, &transport).await?;
    }
    if bench::wants("busy") {
        let topic = format!("bench-busy-{}", uuid::Uuid::new_v4().simple());
        let describe = format!("granularity {:?}", transport.config().granularity);
        test_support::busy::run(
            &Broker::new(transport.clone()),
            &topic,
            "rabbitmq",
            &describe,
        )
        .await?;
    }
    if bench::wants("lateness") {
        let topic = format!("bench-lateness-{}", uuid::Uuid::new_v4().simple());
        let describe = format!("granularity {:?}", transport.config().granularity);
        bench::lateness(
            &Broker::new(transport.clone()),
            &topic,
            RETRIES,
            Duration::from_secs(120),
            &describe,
        )
        .await?;
        transport.delete(&topic).await?;
    }
    Ok(())
}

async fn throughput(url: &str, transport: &RabbitTransport) -> Result<(), Error> {
    let mut rounds = Throughput::default();
    for _ in 0..3 {
        let id = uuid::Uuid::new_v4().simple();
        let raw = raw_run(url, transport, &format!("bench-raw-{id}")).await?;
        let sdk = sdk_run(transport, &format!("bench-sdk-{id}")).await?;
        rounds.round(
            raw,
            sdk,
            "raw lapin",
            &format!("{MESSAGES} messages, prefetch/concurrency {PREFETCH}"),
        );
    }
    rounds.report("rabbitmq");
    Ok(())
}
