//! The Pulsar adapter against the raw `pulsar` client, on the local standalone, in one run:
//!
//! 1. happy-path throughput: a topic of `RETRY_BENCH_MESSAGES` messages (20,000 by default) drained on
//!    a Shared subscription by a raw consumer (receiver queue P, up to P messages handled and
//!    acknowledged concurrently), by the SDK's consumer (concurrency P, same handler) and by the SDK's
//!    consumer with a batch handler (the same work per event, batches of up to P), three times each,
//!    alternating, each round starting with the next of the three (the broker's JVM warms up and its rate
//!    swings between rounds, so none of them always runs first), after one unmeasured raw round that
//!    warms the broker up; `ratio sdk/raw pulsar <payload>` and `ratio sdk/raw pulsar-batch <payload>`
//!    compare them;
//! 2. retry lateness: events fail once and retry after delays spread over 1–60 s through the retry topic;
//!    lateness is the retry's start minus its due time (wall clock); an early retry fails the bench.
//! 3. backlog: healthy-event latency and the consumer process's resident set, idle and while 1,000 and
//!    100,000 events wait in retry (`test_support::backlog`; `RETRY_BENCH_BACKLOG` sets the larger count);
//! 4. scale: 1, 2 and 4 consumer processes in one group (`test_support::scale`).
//! 5. busy: retry lateness while a backlog of healthy events waits in the same topic, against the idle
//!    lateness (`test_support::busy`), with the bare URL and default settings.
//!
//! ```text
//! scripts/brokers start pulsar && source target/brokers/env.sh
//! cargo bench -p event-retry-pulsar --bench pulsar                 # every part
//! cargo bench -p event-retry-pulsar --bench pulsar -- throughput   # or lateness, backlog, scale, busy
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use event_retry_core::adapter::Admin;
use event_retry_core::broker::Broker;
use event_retry_pulsar::{PulsarConfig, PulsarTransport};
use futures::StreamExt;
use pulsar::consumer::InitialPosition;
use pulsar::{Consumer, ConsumerOptions, Pulsar, SubType, TokioExecutor};
use test_support::bench::{self, Clock, Contender, Error, Rate, Throughput, work};

/// Messages per throughput round when `RETRY_BENCH_MESSAGES` is unset.
const MESSAGES: usize = 20_000;
const PREFETCH: usize = 64;
const RETRIES: usize = 300;

fn main() -> Result<(), Error> {
    bench::main("RETRY_TEST_PULSAR", "pulsar", |url| async move {
        run(&url).await
    })
}

/// Subscribes (so the messages are kept), then publishes `messages` events.
async fn prefill(
    transport: &PulsarTransport,
    client: &Pulsar<TokioExecutor>,
    topic: &str,
    group: &str,
    messages: usize,
) -> Result<(), Error> {
    let mut sub: Consumer<Vec<u8>, TokioExecutor> = client
        .consumer()
        .with_topic(transport.config().full_name(topic))
        .with_subscription(group)
        .with_subscription_type(SubType::Shared)
        .build()
        .await?;
    sub.close().await?;
    fill(transport, topic, messages).await
}

/// Publishes `messages` events to `topic`.
async fn fill(transport: &PulsarTransport, topic: &str, messages: usize) -> Result<(), Error> {
    bench::publish_all(&Broker::new(transport.clone()), topic, messages, 256).await
}

async fn raw_run(
    client: &Pulsar<TokioExecutor>,
    transport: &PulsarTransport,
    topic: &str,
    messages: usize,
) -> Result<Rate, Error> {
    prefill(transport, client, topic, "bench", messages).await?;
    let clock = Clock::start();
    let consumer: Consumer<Vec<u8>, TokioExecutor> = client
        .consumer()
        .with_topic(transport.config().full_name(topic))
        .with_subscription("bench")
        .with_subscription_type(SubType::Shared)
        .with_options(
            ConsumerOptions::default()
                .with_receiver_queue_size(PREFETCH as u32)
                .with_initial_position(InitialPosition::Earliest),
        )
        .build()
        .await?;
    // The client needs `&mut` to acknowledge, so one loop owns the consumer: it takes messages while
    // fewer than PREFETCH are in hand, and acknowledges those the handlers finished.
    let mut consumer = consumer;
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let sink = Arc::new(AtomicU64::new(0));
    let (mut taken, mut acked, mut in_hand) = (0, 0, 0);
    while acked < messages {
        // A client that stops handing out messages fails the round (as a stalled SDK consumer does,
        // test_support::bench::Countdown::STALL) instead of holding the bench for ever.
        let stalled = tokio::time::sleep(test_support::bench::Countdown::STALL);
        tokio::select! {
            biased;
            done = done_rx.recv() => {
                let message: pulsar::consumer::Message<Vec<u8>> = done.ok_or("handlers gone")?;
                consumer.ack(&message).await?;
                acked += 1;
                in_hand -= 1;
            }
            next = consumer.next(), if in_hand < PREFETCH && taken < messages => {
                let message = next.ok_or("consumer ended")??;
                clock.message();
                taken += 1;
                in_hand += 1;
                let (sink, done_tx) = (sink.clone(), done_tx.clone());
                tokio::spawn(async move {
                    sink.fetch_add(work(&message.payload.data), Ordering::Relaxed);
                    let _ = done_tx.send(message);
                });
            }
            () = stalled => {
                return Err(format!(
                    "the raw pulsar consumer handed out nothing for {:?}: {taken} of {messages} taken, {acked} acknowledged",
                    test_support::bench::Countdown::STALL
                )
                .into());
            }
        }
    }
    Ok(clock.rate(messages))
}

/// The messages drained by the SDK with the same work per event: a per-event handler (concurrency
/// `PREFETCH`), or with `batch` a batch handler (batches of up to `PREFETCH`).
async fn sdk_run(
    transport: &PulsarTransport,
    topic: &str,
    messages: usize,
    batch: bool,
) -> Result<Rate, Error> {
    // The topology declared as a deployment does once before its consumers start (the group's
    // subscriptions on the topic and its retry topic, as on the Kafka bench): the round's timing
    // includes creating no topic.
    let group = event_retry_core::adapter::default_group(topic);
    transport.declare(topic, Some(&group)).await?;
    fill(transport, topic, messages).await?;
    let broker = Broker::new(transport.clone());
    if batch {
        bench::sdk_batch_round(&broker, topic, messages, PREFETCH).await
    } else {
        bench::sdk_round(&broker, topic, messages, PREFETCH).await
    }
}

/// One contender's round on `topic`.
async fn contender_run(
    contender: Contender,
    client: &Pulsar<TokioExecutor>,
    transport: &PulsarTransport,
    topic: &str,
    messages: usize,
) -> Result<Rate, Error> {
    match contender {
        Contender::Raw => raw_run(client, transport, topic, messages).await,
        Contender::Sdk => sdk_run(transport, topic, messages, false).await,
        Contender::Batch => sdk_run(transport, topic, messages, true).await,
    }
}

async fn throughput(url: &str, transport: &PulsarTransport) -> Result<(), Error> {
    let client: Pulsar<TokioExecutor> = Pulsar::builder(url, TokioExecutor).build().await?;
    let messages = bench::messages(MESSAGES)?;
    let client = &client;
    let run = |contender, topic: String| async move {
        contender_run(contender, client, transport, &topic, messages).await
    };
    let fresh = || uuid::Uuid::new_v4().simple().to_string();
    bench::warm_up("raw pulsar", messages, &fresh(), run).await?;
    let (mut rounds, mut batch_rounds) = (Throughput::default(), Throughput::default());
    for round in 0..3 {
        let rates = bench::rotated_round(round, &fresh(), run).await?;
        let first = rates.first.name();
        rounds.round(
            rates.raw,
            rates.sdk,
            "raw pulsar",
            &format!("{messages} messages, receiver queue/concurrency {PREFETCH}, {first} first"),
        );
        batch_rounds.round(
            rates.raw,
            rates.batch,
            "raw pulsar",
            &format!(
                "{messages} messages, receiver queue {PREFETCH}, a batch handler, batches of up to {PREFETCH}, {first} first"
            ),
        );
    }
    // The ratio lines come last.
    rounds.report("pulsar");
    batch_rounds.report("pulsar-batch");
    Ok(())
}

async fn run(url: &str) -> Result<(), Error> {
    let config = PulsarConfig {
        tick: Duration::from_millis(100),
        strict_deliver_at: true,
        ..PulsarConfig::default()
    };
    let transport = PulsarTransport::connect_with(url, config).await?;
    if let Some(done) = bench::helper_consumer(&Broker::new(transport.clone())).await {
        return done;
    }
    bench::consumer_process_parts(
        &Broker::new(transport.clone()),
        "pulsar",
        &format!("delayed delivery, tick {:?}", transport.config().tick),
        &transport,
        None,
    )
    .await?;
    if bench::wants("throughput") {
        throughput(url, &transport).await?;
    }
    if bench::wants("busy") {
        // The bare service URL and default settings, as a user's first consumer: the tick and
        // strictness are whatever the adapter reads from the broker's admin API.
        let defaults = PulsarTransport::connect(url).await?;
        let topic = format!("bench-busy-{}", uuid::Uuid::new_v4().simple());
        let describe = format!(
            "default settings, broker tick read as {:?}, strict deliverAt {}",
            defaults.config().tick,
            defaults.config().strict_deliver_at
        );
        test_support::busy::run(&Broker::new(defaults), &topic, "pulsar", &describe).await?;
    }
    if bench::wants("lateness") {
        let topic = format!("bench-lateness-{}", uuid::Uuid::new_v4().simple());
        let describe = format!(
            "broker tick {:?}, strict deliverAt",
            transport.config().tick
        );
        bench::lateness(
            &Broker::new(transport),
            &topic,
            RETRIES,
            Duration::from_secs(150),
            &describe,
        )
        .await?;
    }
    Ok(())
}
