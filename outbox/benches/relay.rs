//! Relay throughput against the raw producer, and commit-to-publish latency with notifications and with
//! polling alone — on SQLite, and on PostgreSQL when `RETRY_TEST_POSTGRES` is set.
//!
//! ```text
//! scripts/brokers start kafka rabbitmq postgres && source target/brokers/env.sh
//! cargo bench -p event-retry-outbox --bench relay            # everything
//! cargo bench -p event-retry-outbox --bench relay -- latency # one part: throughput or latency
//! ```
//!
//! Throughput: 20,000 rows of ~230 bytes enqueued in transactions of 1,000, then one relay (defaults:
//! batch 100, 100 publishes in flight) publishes them all; the raw round sends the same events with the
//! broker's own client (rdkafka `FutureProducer`, lapin with publisher confirms) with 100 in flight, and
//! the SDK's `Producer` alone (what the relay publishes through) with 100 in flight.
//! Latency: 200 events committed one at a time, 20 ms apart; `published_at − created_at` from the rows.

use std::time::{Duration, Instant};

use event_retry::Broker;
use event_retry_core::event::Event;
use event_retry_outbox::{Outbox, RowFilter, State};
use futures::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::Connection as _;

type Error = Box<dyn std::error::Error + Send + Sync>;

const ROWS: usize = 20_000;
const IN_FLIGHT: usize = 100;

fn payload(i: usize) -> String {
    format!(
        "{{\"order\":{i},\"customer\":\"c-{}\",\"lines\":[{{\"sku\":\"sku-{i}\",\"qty\":1,\"price\":1999}}],\"note\":\"{}\"}}",
        i % 97,
        "x".repeat(120)
    )
}

fn main() -> Result<(), Error> {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return Ok(());
    }
    let parts: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |p: &str| parts.is_empty() || parts.iter().any(|a| a == p);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut dbs = vec![("sqlite", None)];
        if let Some(pg) = test_support::broker::url("RETRY_TEST_POSTGRES") {
            dbs.push(("postgres", Some(pg)));
        }
        let brokers: Vec<(&str, String)> = [("kafka", "RETRY_TEST_KAFKA"), ("rabbitmq", "RETRY_TEST_AMQP")]
            .into_iter()
            .filter_map(|(name, env)| test_support::broker::url(env).map(|u| (name, u)))
            .collect();
        if brokers.is_empty() {
            eprintln!("neither RETRY_TEST_KAFKA nor RETRY_TEST_AMQP is set: scripts/brokers start kafka rabbitmq");
            std::process::exit(2);
        }
        let mut ratios = Vec::new();
        for (broker_name, url) in &brokers {
            let broker = event_retry::connect(url).await?;
            for (db_name, pg) in &dbs {
                if wants("throughput") {
                    let raw = raw_round(broker_name, url, &broker).await?;
                    let sdk = sdk_round(&broker).await?;
                    let relay = relay_round(&broker, pg.as_deref()).await?;
                    println!(
                        "throughput {db_name} → {broker_name}: relay {relay:.0} rows/s, SDK producer {sdk:.0} msgs/s, raw producer {raw:.0} msgs/s"
                    );
                    ratios.push(format!("ratio outbox/raw {db_name} {broker_name}: {:.2}", relay / raw));
                    ratios.push(format!(
                        "ratio outbox/sdk-producer {db_name} {broker_name}: {:.2}",
                        relay / sdk
                    ));
                }
                if wants("latency") {
                    for notify in [true, false] {
                        let (p50, p99) = latency_round(&broker, pg.as_deref(), notify).await?;
                        let mode = if notify { "notification" } else { "polling every 100 ms" };
                        println!(
                            "commit-to-publish {db_name} → {broker_name}, {mode}: p50 {p50} ms, p99 {p99} ms"
                        );
                    }
                }
            }
        }
        for line in ratios {
            println!("{line}");
        }
        Ok::<(), Error>(())
    })
}

async fn fresh_db(pg: Option<&str>) -> Result<String, Error> {
    match pg {
        None => {
            let dir =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/outbox-bench");
            std::fs::create_dir_all(&dir)?;
            Ok(format!(
                "sqlite:{}",
                dir.join(format!("{}.db", uuid::Uuid::new_v4())).display()
            ))
        }
        Some(admin) => {
            let name = format!("bench_{}", uuid::Uuid::new_v4().simple());
            let mut conn = sqlx::PgConnection::connect(admin).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut conn)
                .await?;
            Ok(test_support::broker::postgres_database(admin, &name, None))
        }
    }
}

async fn enqueue(
    outbox: &Outbox,
    url: &str,
    topic: &str,
    from: usize,
    n: usize,
) -> Result<(), Error> {
    if url.starts_with("sqlite") {
        let mut conn = sqlx::SqliteConnection::connect(url).await?;
        let mut tx = conn.begin().await?;
        for i in from..from + n {
            outbox
                .enqueue(
                    &mut *tx,
                    topic,
                    Event::new(payload(i)).with_key(format!("k{i}")),
                )
                .await?;
        }
        tx.commit().await?;
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        let mut tx = conn.begin().await?;
        for i in from..from + n {
            outbox
                .enqueue(
                    &mut *tx,
                    topic,
                    Event::new(payload(i)).with_key(format!("k{i}")),
                )
                .await?;
        }
        tx.commit().await?;
    }
    Ok(())
}

async fn topic(broker: &Broker) -> Result<String, Error> {
    let topic = format!(
        "outbox-bench-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    broker.admin().declare(&topic, None).await?;
    Ok(topic)
}

async fn relay_round(broker: &Broker, pg: Option<&str>) -> Result<f64, Error> {
    let url = fresh_db(pg).await?;
    let outbox = Outbox::connect(&url).await?;
    let topic = topic(broker).await?;
    for chunk in 0..ROWS / 1000 {
        enqueue(&outbox, &url, &topic, chunk * 1000, 1000).await?;
    }
    let started = Instant::now();
    let relay = outbox.relay(broker.producer()).start()?;
    loop {
        if outbox.counts().await?.published == ROWS as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    relay.shutdown().await?;
    broker.admin().delete(&topic).await?;
    Ok(ROWS as f64 / took.as_secs_f64())
}

/// The SDK's own `Producer` alone, 100 in flight: what the relay publishes through.
async fn sdk_round(broker: &Broker) -> Result<f64, Error> {
    let topic = topic(broker).await?;
    let producer = broker.producer();
    let started = Instant::now();
    let results: Vec<bool> = futures::stream::iter(0..ROWS)
        .map(|i| {
            let (producer, topic) = (&producer, &topic);
            async move {
                let event = Event::new(payload(i)).with_key(format!("k{i}"));
                producer.publish(topic, event).await.is_ok()
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let took = started.elapsed();
    if results.iter().any(|ok| !ok) {
        return Err("an SDK publish failed".into());
    }
    broker.admin().delete(&topic).await?;
    Ok(ROWS as f64 / took.as_secs_f64())
}

async fn raw_round(name: &str, url: &str, broker: &Broker) -> Result<f64, Error> {
    let topic = topic(broker).await?;
    let started = Instant::now();
    if name == "kafka" {
        let bootstrap = url
            .trim_start_matches("kafka://")
            .split('?')
            .next()
            .unwrap_or_default();
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .create()?;
        let results: Vec<bool> = futures::stream::iter(0..ROWS)
            .map(|i| {
                let (producer, topic) = (&producer, &topic);
                async move {
                    let (body, key) = (payload(i), format!("k{i}"));
                    let record = FutureRecord::to(topic).payload(&body).key(&key);
                    producer.send(record, Duration::from_secs(30)).await.is_ok()
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        if results.iter().any(|ok| !ok) {
            return Err("a raw Kafka send failed".into());
        }
    } else {
        let names = broker.admin().names(&topic, None).await?;
        let conn = Connection::connect(url, ConnectionProperties::default()).await?;
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let results: Vec<bool> = futures::stream::iter(0..ROWS)
            .map(|i| {
                let (channel, queue) = (&channel, &names.topic);
                async move {
                    let body = payload(i);
                    match channel
                        .basic_publish(
                            "".into(),
                            queue.as_str().into(),
                            BasicPublishOptions::default(),
                            body.as_bytes(),
                            BasicProperties::default().with_delivery_mode(2),
                        )
                        .await
                    {
                        Ok(confirm) => confirm.await.is_ok(),
                        Err(_) => false,
                    }
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        if results.iter().any(|ok| !ok) {
            return Err("a raw RabbitMQ publish failed".into());
        }
        let _ = conn.close(200, "done".into()).await;
    }
    let took = started.elapsed();
    broker.admin().delete(&topic).await?;
    Ok(ROWS as f64 / took.as_secs_f64())
}

async fn latency_round(
    broker: &Broker,
    pg: Option<&str>,
    notify: bool,
) -> Result<(u64, u64), Error> {
    const EVENTS: usize = 200;
    let url = fresh_db(pg).await?;
    let outbox = Outbox::connect(&url).await?;
    let topic = topic(broker).await?;
    let mut relay = outbox.relay(broker.producer()).notifications(notify);
    if !notify {
        relay = relay.poll_interval(Duration::from_millis(100));
    }
    let relay = relay.start()?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..EVENTS {
        enqueue(&outbox, &url, &topic, i, 1).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while outbox.counts().await?.published < EVENTS as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.shutdown().await?;
    let mut latencies: Vec<u64> = outbox
        .list(&RowFilter::state(State::Published))
        .await?
        .iter()
        .filter_map(|r| {
            r.published_at
                .map(|p| p.since(r.created_at).as_millis() as u64)
        })
        .collect();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q).round() as usize];
    broker.admin().delete(&topic).await?;
    Ok((at(0.5), at(0.99)))
}
