//! The live migration of docs/MIGRATING.md, run with events flowing: a service moves from RabbitMQ to
//! Kafka and nothing is lost.
//!
//! 10,000 events (ids `e0`…`e9999`): every tenth fails twice and then succeeds (retries of 1 s through
//! the broker), one in a hundred is non-retryable, two in a hundred fail until their policy runs out
//! (three retries) — so at the switch some wait in RabbitMQ's delay ladder and some are dead already.
//!
//! 1. The app is deployed consuming both brokers with one handler; the producer publishes the first
//!    5,000 events to RabbitMQ.
//! 2. The producer switches: the other 5,000 go to Kafka.
//! 3. The old broker drains: its waiting retries finish there, until every event published to it is
//!    handled or dead-lettered and its work queue (read with lapin) is empty.
//! 4. `retryctl migrate` moves RabbitMQ's DLQ to Kafka's, with its history.
//! 5. The RabbitMQ consumer stops.
//!
//! Counted at the end from the handler's own record and Kafka's DLQ read with rdkafka: every event
//! succeeded or is in Kafka's DLQ (lost 0), RabbitMQ's DLQ is empty (read with lapin), and the
//! duplicates are reported.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_retry::{
    Broker, Context, Event, HandlerError, Headers, RetryPolicy, consumer::ConsumerHandle,
    handler_fn,
};
use event_retry_core::metadata;
use libtest_mimic::{Arguments, Failed, Trial};
use raw_brokers::{RawBroker, RawKafka, RawRabbit};
use test_support::broker::{required_brokers, runtime, url};

/// Events in the run, half published before the switch.
const EVENTS: usize = 10_000;

fn main() {
    let args = Arguments::from_args();
    let name = "rabbitmq_to_kafka::live_migration_loses_nothing";
    let trial = match (url("RETRY_TEST_AMQP"), url("RETRY_TEST_KAFKA")) {
        (Some(amqp), Some(kafka)) => Trial::test(name, move || {
            live_migration(&amqp, &kafka).map_err(Failed::from)
        }),
        _ if required_brokers()
            .iter()
            .any(|b| b == "rabbitmq" || b == "kafka") =>
        {
            Trial::test(name, || {
                Err(Failed::from(
                    "RETRY_TEST_REQUIRE names rabbitmq or kafka but RETRY_TEST_AMQP or \
                     RETRY_TEST_KAFKA is not set",
                ))
            })
        }
        _ => {
            eprintln!("SKIP {name}: RETRY_TEST_AMQP and RETRY_TEST_KAFKA are not both set");
            Trial::test(name, || Ok(())).with_ignored_flag(true)
        }
    };
    libtest_mimic::run(&args, vec![trial]).exit();
}

fn fail<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// What the handler does with event `i` on attempt `attempt`.
fn outcome(i: usize, attempt: u32) -> Result<(), HandlerError> {
    if i % 100 == 1 {
        Err(HandlerError::non_retryable(format!(
            "e{i}: malformed order"
        )))
    } else if i % 50 == 7 {
        Err(HandlerError::deferred(format!(
            "e{i}: warehouse never answers"
        )))
    } else if i.is_multiple_of(10) && attempt <= 2 {
        Err(HandlerError::deferred(format!(
            "e{i}: stock not replicated yet"
        )))
    } else {
        Ok(())
    }
}

/// The handler's own record: successful calls per event id.
type Record = Arc<Mutex<HashMap<usize, u32>>>;

async fn start_consumer(
    broker: &Broker,
    topic: &str,
    record: Record,
) -> Result<ConsumerHandle, String> {
    let consumer = broker
        .consumer(topic)
        .name("order-service")
        .concurrency(64)
        .policy(RetryPolicy::parse("1s x3").map_err(fail)?);
    let handler = handler_fn(move |event: Event, ctx: Context| {
        let record = record.clone();
        async move {
            let i: usize = event
                .id()
                .and_then(|id| id.strip_prefix('e'))
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| HandlerError::non_retryable("not an event of this test"))?;
            outcome(i, ctx.attempt)?;
            *record
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(i)
                .or_insert(0) += 1;
            Ok(())
        }
    });
    consumer.start(handler).await.map_err(fail)
}

/// Publishes events `range` to `topic`, 100 at a time.
async fn publish(
    broker: &Broker,
    topic: &str,
    range: std::ops::Range<usize>,
) -> Result<(), String> {
    let producer = broker.producer();
    let ids: Vec<usize> = range.collect();
    for chunk in ids.chunks(100) {
        let sends = chunk.iter().map(|i| {
            let event = Event::new(format!("{{\"order\":{i}}}"))
                .with_id(format!("e{i}"))
                .with_key(format!("customer-{}", i % 17));
            producer.publish(topic, event)
        });
        for sent in futures::future::join_all(sends).await {
            sent.map_err(fail)?;
        }
    }
    Ok(())
}

/// Waits (bounded) until `handle` has handled or dead-lettered `n` events.
async fn settled(handle: &ConsumerHandle, n: usize, what: &str) -> Result<(), String> {
    let n = n as u64;
    tokio::time::timeout(
        Duration::from_secs(180),
        handle.wait_until(move |s| s.succeeded + s.dead_lettered >= n),
    )
    .await
    .map(drop)
    .map_err(|_| {
        format!(
            "{what}: not every event settled within 180 s: {:?}",
            handle.stats()
        )
    })
}

fn live_migration(amqp: &str, kafka: &str) -> Result<(), String> {
    runtime()?.block_on(async move {
        let started = Instant::now();
        let rabbit = event_retry::connect(amqp).await.map_err(fail)?;
        let kafka_broker = event_retry::connect(kafka).await.map_err(fail)?;
        let topic = format!("live-{}", uuid::Uuid::new_v4().simple());
        rabbit.admin().declare(&topic, None).await.map_err(fail)?;
        kafka_broker.admin().declare(&topic, None).await.map_err(fail)?;
        let record: Record = Arc::default();
        let half = EVENTS / 2;

        // 1. The app consumes both brokers; the first half is published to RabbitMQ.
        let on_rabbit = start_consumer(&rabbit, &topic, record.clone()).await?;
        let on_kafka = start_consumer(&kafka_broker, &topic, record.clone()).await?;
        publish(&rabbit, &topic, 0..half).await?;

        // 2. The producer switches.
        let at_switch = on_rabbit.stats();
        publish(&kafka_broker, &topic, half..EVENTS).await?;
        let waiting = at_switch.retries_scheduled - at_switch.succeeded_after_retry.min(at_switch.retries_scheduled);
        if waiting == 0 || at_switch.dead_lettered == 0 {
            return Err(format!(
                "at the switch no retry was waiting ({waiting}) or nothing was dead on RabbitMQ: \
                 {at_switch:?}"
            ));
        }

        // 3. The old broker drains: its retries finish there.
        settled(&on_rabbit, half, "RabbitMQ").await?;
        let names = rabbit.admin().names(&topic, None).await.map_err(fail)?;
        let retry_queue = names.retry.ok_or("RabbitMQ names no retry queue")?;
        let raw_rabbit = RawRabbit::new(amqp);
        let deadline = Instant::now() + Duration::from_secs(30);
        for queue in [&names.topic, &retry_queue] {
            while raw_rabbit.depth(queue).await.map_err(fail)? != 0 {
                if Instant::now() > deadline {
                    return Err(format!("RabbitMQ's queue {queue} did not drain"));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let rabbit_stats = on_rabbit.stats();

        // 4. Its DLQ moves to Kafka with its history.
        let cli = <retryctl::Cli as clap::Parser>::try_parse_from([
            "retryctl", "migrate", "--from", amqp, "--to", kafka, "--topic", &topic,
        ])
        .map_err(fail)?;
        let mut out = Vec::new();
        retryctl::run(cli, &mut out).await.map_err(fail)?;
        let migrated = String::from_utf8_lossy(&out).into_owned();

        // 5. The RabbitMQ consumer stops; the Kafka one finishes its half.
        on_rabbit.shutdown().await.map_err(fail)?;
        settled(&on_kafka, EVENTS - half, "Kafka").await?;
        let kafka_stats = on_kafka.stats();
        on_kafka.shutdown().await.map_err(fail)?;

        // Counted with the brokers' own clients and the handler's record.
        let rabbit_dlq = rabbit.admin().names(&topic, None).await.map_err(fail)?.dlq;
        let kafka_dlq = kafka_broker.admin().names(&topic, None).await.map_err(fail)?.dlq;
        let left_in_rabbit = raw_rabbit.depth(&rabbit_dlq).await.map_err(fail)?;
        let mut dead: BTreeMap<usize, u32> = BTreeMap::new();
        for entry in RawKafka::new(kafka).messages(&kafka_dlq).await.map_err(fail)? {
            let mut headers = Headers::new();
            for (name, value) in entry.headers {
                headers.push(name, value);
            }
            let id = metadata::decode_lenient(&headers)
                .0
                .event_id
                .and_then(|id| id.strip_prefix('e').and_then(|n| n.parse().ok()))
                .ok_or("a DLQ entry without an event id of this test")?;
            *dead.entry(id).or_insert(0) += 1;
        }
        let handled = record.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let lost: Vec<usize> = (0..EVENTS)
            .filter(|i| !handled.contains_key(i) && !dead.contains_key(i))
            .collect();
        let wrongly_dead: Vec<&usize> = dead
            .keys()
            .filter(|&&i| !(i % 100 == 1 || i % 50 == 7))
            .collect();
        let duplicate_successes: u32 = handled.values().map(|n| n - 1).sum();
        let duplicate_dead: u32 = dead.values().map(|n| n - 1).sum();
        eprintln!(
            "live migration RabbitMQ -> Kafka, {EVENTS} events in {:.1} s: at the switch RabbitMQ had \
             {} retries scheduled ({waiting} not yet succeeded) and {} dead letters; RabbitMQ handled \
             {} and dead-lettered {}; Kafka handled {} and dead-lettered {}; migrated: {}; lost {}, \
             duplicates {duplicate_successes} successes and {duplicate_dead} DLQ entries; Kafka's DLQ \
             holds {} entries, RabbitMQ's {left_in_rabbit}",
            started.elapsed().as_secs_f64(),
            at_switch.retries_scheduled,
            at_switch.dead_lettered,
            rabbit_stats.succeeded,
            rabbit_stats.dead_lettered,
            kafka_stats.succeeded,
            kafka_stats.dead_lettered,
            migrated.lines().next().unwrap_or_default(),
            lost.len(),
            dead.values().sum::<u32>(),
        );
        if !lost.is_empty() {
            return Err(format!("lost {}: {:?}", lost.len(), &lost[..lost.len().min(20)]));
        }
        if !wrongly_dead.is_empty() || dead.len() != 300 {
            return Err(format!(
                "Kafka's DLQ holds {} distinct events, want the 300 that fail for good ({} others)",
                dead.len(),
                wrongly_dead.len()
            ));
        }
        if left_in_rabbit != 0 {
            return Err(format!("{left_in_rabbit} entries are left in RabbitMQ's DLQ"));
        }
        rabbit.admin().delete(&topic).await.map_err(fail)?;
        kafka_broker.admin().delete(&topic).await.map_err(fail)
    })
}
