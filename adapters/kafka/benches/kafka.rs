//! The Kafka adapter against a raw rdkafka consumer, on the local broker, in one run:
//!
//! 1. happy-path throughput: a topic of `RETRY_BENCH_MESSAGES` records (50,000 by default) drained by a
//!    raw `StreamConsumer` (the same
//!    work per record, then its offset stored and committed by librdkafka), by the SDK's consumer
//!    (concurrency P, same handler) and by the SDK's consumer with a batch handler (the same work per
//!    event, batches of up to P), three rounds each, alternating, each round starting with the next of
//!    the three (so none of them always meets the broker first), after one unmeasured raw round that
//!    warms the broker's JVM up; `ratio sdk/raw kafka <payload>` and `ratio sdk/raw kafka-batch
//!    <payload>` compare the medians;
//!    The same handler through the in-memory transport (no broker) is measured too: the runtime's own
//!    ceiling on this machine, which the SDK on any broker cannot pass;
//! 2. retry lateness: events fail once and retry after delays spread over 1–60 s through the delay ladder
//!    (100 ms steps); lateness is the retry's start minus its due time (wall clock); an early retry fails
//!    the bench.
//! 3. backlog: healthy-event latency and the consumer process's resident set, idle and while 1,000 and
//!    100,000 events wait in retry (`test_support::backlog`; `RETRY_BENCH_BACKLOG` sets the larger count);
//! 4. scale: 1, 2 and 4 consumer processes in one group (`test_support::scale`).
//! 5. busy: retry lateness while a backlog of healthy events waits (`test_support::busy`).
//! 6. hops: the cost of transactional hops — events that each fail once and come back through the
//!    ladder, with and without `transactional_hops` (`ratio transactional/plain hops kafka`).
//! 7. steady (only when named): long rounds, where start-up does not count — the raw loop and the SDK
//!    alternated [`STEADY_PAIRS`] times on `RETRY_BENCH_MESSAGES` records each (1,000,000 by default),
//!    compared from each one's first record (`ratio steady sdk/raw kafka <payload>`).
//!
//! ```text
//! scripts/brokers start kafka && source target/brokers/env.sh
//! cargo bench -p event-retry-kafka --bench kafka                 # every part
//! cargo bench -p event-retry-kafka --bench kafka -- throughput   # or lateness, backlog, scale, busy, hops
//! cargo bench -p event-retry-kafka --bench kafka -- sdk          # one SDK round alone, for profiling
//! cargo bench -p event-retry-kafka --bench kafka -- raw          # one raw round alone, the same
//! cargo bench -p event-retry-kafka --bench kafka -- steady       # long rounds, alternated
//! RETRY_BENCH_PAYLOAD=1024 cargo bench -p event-retry-kafka --bench kafka -- throughput  # 1 KB records
//! RETRY_BENCH_RAW_SETTINGS=fetch.queue.backoff.ms=10 cargo bench … -- steady  # against a tuned raw loop
//! ```

use std::time::{Duration, Instant};

use event_retry_core::adapter::{Admin, Published};
use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{Context, handler_fn};
use event_retry_kafka::{KafkaConfig, KafkaTransport, bootstrap_of};
use rdkafka::Message;
use rdkafka::TopicPartitionList;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use test_support::bench::{self, Clock, Contender, Error, Rate, Throughput, work};

/// Records per throughput round when `RETRY_BENCH_MESSAGES` is unset.
const MESSAGES: usize = 50_000;
const CONCURRENCY: usize = 64;
const RETRIES: usize = 300;
/// Events per round of the hops part (`RETRY_BENCH_HOPS` overrides).
const HOPS: usize = 5_000;
/// Records per round of the steady part when `RETRY_BENCH_MESSAGES` is unset.
const STEADY_MESSAGES: usize = 1_000_000;
/// Pairs of long rounds (raw, SDK) in the steady part.
const STEADY_PAIRS: usize = 3;

fn main() -> Result<(), Error> {
    bench::main(
        "RETRY_TEST_KAFKA",
        "kafka",
        |url| async move { run(&url).await },
    )
}

/// Fills `topic` with `messages` records, after declaring its whole topology (the consumer group's retry
/// topic included), as a deployment does once before its consumers start: neither side's timing then
/// includes creating topics.
async fn prefill(transport: &KafkaTransport, topic: &str, messages: usize) -> Result<(), Error> {
    transport
        .declare(
            topic,
            Some(&event_retry_core::adapter::default_group(topic)),
        )
        .await?;
    bench::publish_all(&Broker::new(transport.clone()), topic, messages, 1024).await
}

async fn raw_run(
    url: &str,
    transport: &KafkaTransport,
    topic: &str,
    messages: usize,
) -> Result<Rate, Error> {
    prefill(transport, topic, messages).await?;
    let clock = Clock::start();
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap_of(url)?)
        .set("group.id", format!("{topic}-raw"))
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest");
    for (key, value) in raw_settings()? {
        config.set(key, value);
    }
    let consumer: StreamConsumer = config.create()?;
    consumer.subscribe(&[topic])?;
    let mut sink = 0;
    for _ in 0..messages {
        let message = consumer.recv().await?;
        clock.message();
        sink += work(message.payload().unwrap_or_default());
        consumer.store_offset_from_message(&message)?;
    }
    std::hint::black_box(sink);
    Ok(clock.rate(messages))
}

/// librdkafka settings for the raw loop beside its defaults, from `RETRY_BENCH_RAW_SETTINGS`
/// (`key=value` pairs separated by commas, e.g. `fetch.queue.backoff.ms=10`): to compare the SDK with
/// a raw loop tuned as the adapter tunes its own consumer. The ratio lines compare with the defaults.
fn raw_settings() -> Result<Vec<(String, String)>, Error> {
    let Ok(text) = std::env::var("RETRY_BENCH_RAW_SETTINGS") else {
        return Ok(Vec::new());
    };
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) => Ok((key.trim().to_string(), value.trim().to_string())),
            None => Err(format!("RETRY_BENCH_RAW_SETTINGS: {pair:?} is not key=value").into()),
        })
        .collect()
}

async fn sdk_run(transport: &KafkaTransport, topic: &str, messages: usize) -> Result<Rate, Error> {
    prefill(transport, topic, messages).await?;
    bench::sdk_round(
        &Broker::new(transport.clone()),
        topic,
        messages,
        CONCURRENCY,
    )
    .await
}

/// The same handler and concurrency through the in-memory transport: the runtime without a broker.
async fn memory_run() -> Result<f64, Error> {
    let broker = Broker::memory();
    bench::publish_all(&broker, "ceiling", MESSAGES, 1).await?;
    let countdown = bench::Countdown::new(MESSAGES);
    let handler = handler_fn({
        let countdown = countdown.clone();
        move |event: Event, _ctx: Context| {
            std::hint::black_box(work(&event.payload));
            countdown.tick();
            async { Ok::<(), HandlerError>(()) }
        }
    });
    let started = Instant::now();
    let consumer = broker
        .consumer("ceiling")
        .concurrency(CONCURRENCY)
        .start(handler)
        .await?;
    countdown.wait(&consumer).await?;
    consumer
        .wait_until(|s| s.succeeded >= MESSAGES as u64)
        .await;
    let rate = MESSAGES as f64 / started.elapsed().as_secs_f64();
    consumer.shutdown().await?;
    Ok(rate)
}

/// The same records drained by the SDK with a batch handler (batches of up to `CONCURRENCY`).
async fn sdk_batch_run(
    transport: &KafkaTransport,
    topic: &str,
    messages: usize,
) -> Result<Rate, Error> {
    prefill(transport, topic, messages).await?;
    bench::sdk_batch_round(
        &Broker::new(transport.clone()),
        topic,
        messages,
        CONCURRENCY,
    )
    .await
}

/// One contender's round on `topic`.
async fn contender_run(
    contender: Contender,
    url: &str,
    transport: &KafkaTransport,
    topic: &str,
    messages: usize,
) -> Result<Rate, Error> {
    let rate = match contender {
        Contender::Raw => raw_run(url, transport, topic, messages).await,
        Contender::Sdk => sdk_run(transport, topic, messages).await,
        Contender::Batch => sdk_batch_run(transport, topic, messages).await,
    };
    // Kafka keeps every record it was given: a few runs at 16 KB or of long rounds (8 GB for one
    // `throughput` run at 16 KB) would otherwise fill the broker's disk.
    bench::tidy(transport, topic).await;
    rate
}

async fn throughput(url: &str, transport: &KafkaTransport) -> Result<(), Error> {
    let messages = bench::messages(MESSAGES)?;
    let run = |contender, topic: String| async move {
        contender_run(contender, url, transport, &topic, messages).await
    };
    let fresh = || uuid::Uuid::new_v4().simple().to_string();
    bench::warm_up("raw rdkafka", messages, &fresh(), run).await?;
    let (mut rounds, mut batch_rounds) = (Throughput::default(), Throughput::default());
    for round in 0..3 {
        let rates = bench::rotated_round(round, &fresh(), run).await?;
        let detail = |handler: &str| -> Result<String, Error> {
            Ok(format!(
                "{messages} records of {} B in 2 partitions, SDK concurrency {CONCURRENCY}, {handler}, {} first",
                bench::payload_bytes()?,
                rates.first.name()
            ))
        };
        rounds.round(
            rates.raw,
            rates.sdk,
            "raw rdkafka",
            &detail("a per-event handler")?,
        );
        batch_rounds.round(
            rates.raw,
            rates.batch,
            "raw rdkafka",
            &detail(&format!("a batch handler, batches of up to {CONCURRENCY}"))?,
        );
    }
    println!(
        "the runtime alone (in-memory transport, same handler and concurrency): {:.0} msg/s",
        memory_run().await?
    );
    // The ratio lines come last.
    rounds.report("kafka");
    batch_rounds.report("kafka-batch");
    Ok(())
}

/// The steady part: [`STEADY_PAIRS`] pairs of long rounds, the raw loop and the SDK (per-event handler)
/// alternated, each pair started by the other contender than the pair before. A long-lived consumer's
/// rate is its steady state, which the 50,000-record throughput rounds hardly reach: there start-up is
/// most of a round. Prints each pair, then the least, median and greatest of the pairs' ratios of
/// steady rates, and the median as `ratio steady sdk/raw kafka <payload>`.
async fn steady(url: &str, transport: &KafkaTransport) -> Result<(), Error> {
    let messages = bench::messages(STEADY_MESSAGES)?;
    let mut ratios = Vec::new();
    for pair in 0..STEADY_PAIRS {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let first = if pair % 2 == 0 {
            Contender::Raw
        } else {
            Contender::Sdk
        };
        let run = |contender: Contender| {
            let topic = contender.topic(&id);
            async move { contender_run(contender, url, transport, &topic, messages).await }
        };
        let (raw, sdk) = if first == Contender::Raw {
            let raw = run(Contender::Raw).await?;
            (raw, run(Contender::Sdk).await?)
        } else {
            let sdk = run(Contender::Sdk).await?;
            (run(Contender::Raw).await?, sdk)
        };
        let cpu = |r: &Rate| {
            r.cpu.map_or_else(
                || "-".to_string(),
                |c| format!("{:.2} µs", c.process.as_secs_f64() * 1e6),
            )
        };
        println!(
            "steady pair {}: raw rdkafka {:.0} msg/s ({} CPU per record), SDK {:.0} msg/s ({}), SDK/raw {:.2} ({messages} records of {} B, {} first)",
            pair + 1,
            raw.steady,
            cpu(&raw),
            sdk.steady,
            cpu(&sdk),
            sdk.steady / raw.steady,
            bench::payload_bytes()?,
            first.name(),
        );
        ratios.push(sdk.steady / raw.steady);
    }
    let (min, median, max) = bench::spread(&ratios).ok_or("no steady pair ran")?;
    println!(
        "steady SDK/raw over {STEADY_PAIRS} pairs: min {min:.2}, median {median:.2}, max {max:.2}"
    );
    println!(
        "ratio steady sdk/raw kafka {}: {median:.2}",
        bench::payload_label(bench::payload_bytes()?)
    );
    Ok(())
}

/// Where the backlog consumer's group stands on each partition holding a record it never handled: the
/// committed offset and the high watermark, read with rdkafka. A record below the committed offset was
/// committed past (lost); one at or above it is late.
fn group_position(url: &str) -> Box<test_support::backlog::GroupPosition> {
    let bootstrap = bootstrap_of(url).unwrap_or_else(|_| url.to_string());
    Box::new(move |topic: String, places: Vec<Published>| {
        let bootstrap = bootstrap.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || committed_report(&bootstrap, &topic, &places))
                .await
                .unwrap_or_else(|e| format!("not read: {e}"))
        })
    })
}

fn committed_report(bootstrap: &str, topic: &str, places: &[Published]) -> String {
    let group = event_retry_core::adapter::default_group(topic);
    let consumer: BaseConsumer = match ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", &group)
        .create()
    {
        Ok(consumer) => consumer,
        Err(e) => return format!("not read: {e}"),
    };
    let mut partitions: Vec<i32> = places.iter().filter_map(|p| p.partition).collect();
    partitions.sort_unstable();
    partitions.dedup();
    let mut list = TopicPartitionList::new();
    for p in &partitions {
        list.add_partition(topic, *p);
    }
    let timeout = Duration::from_secs(10);
    let committed = match consumer.committed_offsets(list, timeout) {
        Ok(committed) => committed,
        Err(e) => return format!("not read: {e}"),
    };
    partitions
        .iter()
        .map(|&p| {
            let at = committed
                .find_partition(topic, p)
                .map_or("none".to_string(), |e| format!("{:?}", e.offset()));
            let high = consumer
                .fetch_watermarks(topic, p, timeout)
                .map_or_else(|e| format!("not read: {e}"), |(_, high)| high.to_string());
            let below: Vec<String> = places
                .iter()
                .filter(|place| place.partition == Some(p))
                .filter_map(|place| place.offset)
                .map(|o| o.to_string())
                .collect();
            format!(
                "{group} partition {p} committed {at}, high watermark {high} (missing offsets {})",
                below.join(" ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The cost of transactional hops: rounds of `HOPS` events that each fail their first attempt (a retry
/// after 100 ms) and succeed their second, alternately without and with `transactional_hops`; each
/// setting's best round.
async fn hops(url: &str) -> Result<(), Error> {
    let events = bench::count_from_env("RETRY_BENCH_HOPS", HOPS, 1)?;
    let (mut plain, mut transactional) = (0f64, 0f64);
    for _ in 0..2 {
        plain = plain.max(hops_round(url, false, events).await?);
        transactional = transactional.max(hops_round(url, true, events).await?);
    }
    println!(
        "hops kafka: {events} events failing once (retry after 100 ms through the ladder): plain {plain:.0} events/s, transactional {transactional:.0} events/s (best of 2 rounds each)"
    );
    println!(
        "ratio transactional/plain hops kafka: {:.2}",
        transactional / plain
    );
    Ok(())
}

/// One round of the hops part: events per second from the consumer's start until every event's second
/// attempt succeeded.
async fn hops_round(url: &str, transactional: bool, events: usize) -> Result<f64, Error> {
    let config = KafkaConfig {
        partitions: 2,
        transactional_hops: transactional,
        ..KafkaConfig::default()
    };
    let transport = KafkaTransport::connect_with(url, config).await?;
    let topic = format!("bench-hops-{}", uuid::Uuid::new_v4().simple());
    transport
        .declare(
            &topic,
            Some(&event_retry_core::adapter::default_group(&topic)),
        )
        .await?;
    bench::publish_all(&Broker::new(transport.clone()), &topic, events, 1024).await?;
    let handler = handler_fn(|_event: Event, ctx: Context| async move {
        if ctx.attempt == 1 {
            Err(HandlerError::deferred("comes back once"))
        } else {
            Ok(())
        }
    });
    let started = Instant::now();
    let consumer = Broker::new(transport.clone())
        .consumer(&topic)
        .policy(RetryPolicy::parse("100ms x1")?)
        .concurrency(CONCURRENCY)
        .start(handler)
        .await?;
    tokio::time::timeout(
        Duration::from_secs(600),
        consumer.wait_until(|s| s.succeeded >= events as u64),
    )
    .await
    .map_err(|_| {
        format!(
            "hops: not every event's retry succeeded within 600 s: {:?}",
            consumer.stats()
        )
    })?;
    let rate = events as f64 / started.elapsed().as_secs_f64();
    consumer.shutdown().await?;
    transport.delete(&topic).await?;
    Ok(rate)
}

/// librdkafka settings for the SDK's clients in the throughput, backlog, scale and busy parts, from
/// `RETRY_BENCH_KAFKA_CLIENT` (`name=value,name=value`; none when unset): to measure what a setting
/// changes, e.g. the prefetch's `queued.max.messages.kbytes`.
fn client_settings_from_env() -> Result<Vec<(String, String)>, Error> {
    let Ok(list) = std::env::var("RETRY_BENCH_KAFKA_CLIENT") else {
        return Ok(Vec::new());
    };
    list.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| format!("RETRY_BENCH_KAFKA_CLIENT: {s:?} is not name=value").into())
        })
        .collect()
}

async fn run(url: &str) -> Result<(), Error> {
    let client = client_settings_from_env()?;
    let config = KafkaConfig {
        partitions: 2,
        client: client.clone(),
        ..KafkaConfig::default()
    };
    let transport = KafkaTransport::connect_with(url, config).await?;
    if let Some(done) = bench::helper_consumer(&Broker::new(transport.clone())).await {
        return done;
    }
    // Four partitions for the scale part, so up to four processes of one group each have work.
    let scale_transport = if bench::wants("scale") {
        let four = KafkaConfig {
            partitions: 4,
            client,
            ..KafkaConfig::default()
        };
        KafkaTransport::connect_with(url, four).await?
    } else {
        transport.clone()
    };
    bench::consumer_process_parts(
        &Broker::new(transport.clone()),
        "kafka",
        &transport.config().to_string(),
        &scale_transport,
        Some(&group_position(url)),
    )
    .await?;
    if bench::wants("throughput") {
        throughput(url, &transport).await?;
    }
    if bench::asked("sdk") {
        // The SDK's rounds alone (for profiling); not part of a default run.
        let topic = format!("bench-sdk-{}", uuid::Uuid::new_v4().simple());
        let messages = bench::messages(MESSAGES)?;
        let rate = contender_run(Contender::Sdk, url, &transport, &topic, messages).await?;
        println!("SDK alone: {rate:?} msg/s");
    }
    if bench::asked("raw") {
        // The raw client's rounds alone (for profiling beside `sdk`); not part of a default run.
        let topic = format!("bench-raw-{}", uuid::Uuid::new_v4().simple());
        let messages = bench::messages(MESSAGES)?;
        let rate = contender_run(Contender::Raw, url, &transport, &topic, messages).await?;
        println!("raw rdkafka alone: {rate:?} msg/s");
    }
    if bench::asked("steady") {
        // Long rounds; not part of a default run.
        steady(url, &transport).await?;
    }
    if bench::wants("busy") {
        let topic = format!("bench-busy-{}", uuid::Uuid::new_v4().simple());
        let describe = transport.config().to_string();
        test_support::busy::run(&Broker::new(transport.clone()), &topic, "kafka", &describe)
            .await?;
    }
    if bench::wants("hops") {
        hops(url).await?;
    }
    if bench::wants("lateness") {
        let topic = format!("bench-lateness-{}", uuid::Uuid::new_v4().simple());
        let describe = transport.config().to_string();
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
