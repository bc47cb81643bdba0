//! The adapter's clients against their only broker paused longer than the broker's session timeout
//! (`RETRY_TEST_KAFKA`, the single-node cluster `scripts/brokers` starts): on resume the controller
//! fences the broker for a moment, the metadata answered then lists no broker, and librdkafka drops its
//! connection to the only broker it knew; its own re-bootstrap can be lost, and a client left so sends
//! nothing again (see the adapter's `stranding` module).
//!
//! - The producer: right after the resume the test reads metadata through the producer many times
//!   over (declaring fresh topics: the producer looks each one up), so one answer lands while the
//!   broker is fenced, and publishes events; its clients never re-bootstrap by themselves
//!   (`metadata.recovery.strategy=none`, as the consumers' below). They must all be confirmed well within the message
//!   timeout: the adapter finds the stranded producer and replaces it.
//! - The consumers: a consumer whose clients refresh their metadata every 10 ms (so answers land while
//!   the broker is fenced) and never re-bootstrap by themselves (`metadata.recovery.strategy=none`:
//!   what a lost re-bootstrap leaves, every time instead of now and then) must handle every event
//!   published after the resume, each failing once and coming back through the retry ladder — the
//!   source's consumer and the ladder's both read again.
//!
//! Handling in time is not enough: a client can come through a stall unstranded (then the test proves
//! nothing about the heal), and an unhealed one now and then finds its broker again anyway. So each
//! test also reads the adapter's heal counter (`CLIENT_HEALS`, through a recorder installed for the
//! binary) and requires at least one heal of the clients it watches. A stall that healed none stalls
//! again, up to three times, every stall's events held to the same test; none healed after the third
//! is reported as inconclusive, and fails.
//!
//! A binary of its own, its tests one at a time: a stall stops the broker every other test uses. It
//! fails when `RETRY_TEST_REQUIRE` names `kafka` and the variable is unset, and is skipped loudly
//! otherwise.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::producer::Producer;
use event_retry_core::runtime::{Context, handler_fn};
use event_retry_kafka::{KafkaConfig, KafkaTransport};
use libtest_mimic::Arguments;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use test_support::broker::runtime;
use test_support::stall::Stall;

/// Longer than the broker's session timeout (`broker.session.timeout.ms`, 9 s): fenced on resume.
const STALL: Duration = Duration::from_secs(12);
/// Metadata reads and publishes started right after the resume, one of each every [`SPACING`], so
/// some land while the broker is fenced (about 50–120 ms after the resume here).
const PUBLISHES: usize = 40;
const SPACING: Duration = Duration::from_millis(10);
/// Every publish must be confirmed within this, well inside librdkafka's 30 s message timeout.
const CONFIRMED_WITHIN: Duration = Duration::from_secs(20);

/// Events published after the resume, and how soon after it every one must have been handled twice
/// (failed once, then succeeded from the retry topic). A stranded consumer would never handle them.
const EVENTS_AFTER: usize = 20;
const HANDLED_WITHIN: Duration = Duration::from_secs(40);
/// Stalls a test makes at most, until one strands a client it watches (not every stall does: the
/// metadata answer must land in the moment the broker is fenced).
const STALLS: u32 = 3;

/// Reads the metrics the adapter records (the recorder `main` installs).
static METRICS: OnceLock<Snapshotter> = OnceLock::new();

fn main() {
    let recorder = DebuggingRecorder::new();
    let _ = METRICS.set(recorder.snapshotter());
    if let Err(e) = metrics::set_global_recorder(recorder) {
        eprintln!("no recorder for the heal counter: {e}");
        std::process::exit(1);
    }
    // The adapter's warnings (a stranded client found and healed) on stderr; RUST_LOG overrides.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,rdkafka=off,librdkafka=off".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let mut args = Arguments::from_args();
    // Each test stalls the one broker: never two at once.
    args.test_threads = Some(1);
    let tests = test_support::named_tests![
        publishes_go_on_after_the_only_broker_comes_back_fenced,
        consumers_read_again_after_the_only_broker_comes_back_fenced,
    ];
    let trials = test_support::broker::trials("kafka", "RETRY_TEST_KAFKA", &tests);
    libtest_mimic::run(&args, trials).exit();
}

/// The adapter's heals so far, per `client` label.
fn heals() -> HashMap<String, u64> {
    let Some(snapshotter) = METRICS.get() else {
        return HashMap::new();
    };
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == event_retry_kafka::CLIENT_HEALS)
        .filter_map(|(key, _, _, value)| {
            let client = key.key().labels().find(|l| l.key() == "client")?;
            match value {
                DebugValue::Counter(n) => Some((client.value().to_string(), n)),
                _ => None,
            }
        })
        .collect()
}

/// The heals of `clients` since `before` (a [`heals`] read earlier), and all of them for the report;
/// an error when `clients` were not healed at all.
fn require_heals(before: &HashMap<String, u64>, clients: &[&str]) -> Result<String, String> {
    let now = heals();
    let since = |client: &str| {
        now.get(client)
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.get(client).copied().unwrap_or(0))
    };
    let mut all: Vec<String> = now.keys().map(|c| format!("{c} {}", since(c))).collect();
    all.sort();
    let report = if all.is_empty() {
        "none".to_string()
    } else {
        all.join(", ")
    };
    if clients.iter().map(|c| since(c)).sum::<u64>() == 0 {
        return Err(format!(
            "inconclusive: no heal of {clients:?} was counted during the test (heals: {report}): no \
             client stranded in this stall, so the test says nothing about the heal, or one stranded \
             and the adapter did not heal it"
        ));
    }
    Ok(report)
}

/// The settings that strand the adapter's clients in a stall: metadata asked for every 10 ms, so some
/// answers land while the broker is fenced, and librdkafka's own re-bootstrap off — it stands in for
/// the re-bootstrap librdkafka loses now and then, every time.
fn stranding_config() -> KafkaConfig {
    KafkaConfig {
        client: vec![
            ("topic.metadata.refresh.interval.ms".into(), "10".into()),
            ("metadata.recovery.strategy".into(), "none".into()),
        ],
        ..KafkaConfig::default()
    }
}

/// Publishes the event `before` to `topic`: the clients work before the stall.
async fn publish_before(producer: &Producer, topic: &str) -> Result<(), String> {
    producer
        .publish(topic, Event::new("before").with_id("before"))
        .await
        .map(drop)
        .map_err(|e| format!("publish before the stall: {e}"))
}

/// Stops the broker for [`STALL`] and lets it run again; returns when it was resumed.
async fn stall_then_resume() -> Result<Instant, String> {
    let mut stall = Stall::start("kafka", "pid")?;
    tokio::time::sleep(STALL).await;
    stall.resume()?;
    Ok(Instant::now())
}

fn publishes_go_on_after_the_only_broker_comes_back_fenced(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        let transport = KafkaTransport::connect_with(&url, stranding_config())
            .await
            .map_err(|e| e.to_string())?;
        let broker = Broker::new(transport);
        let topic = format!("stall-{}", uuid::Uuid::new_v4().simple());
        broker
            .admin()
            .declare(&topic, None)
            .await
            .map_err(|e| e.to_string())?;
        let producer = broker.producer();
        publish_before(&producer, &topic).await?;

        let before = heals();
        for stall in 1..=STALLS {
            let resumed = stall_then_resume().await?;
            let mut sends = Vec::new();
            let mut lookups = Vec::new();
            for i in 0..PUBLISHES {
                let b = broker.clone();
                let fresh = format!("{topic}-{stall}-{i}");
                lookups.push(tokio::spawn(async move { b.admin().declare(&fresh, None).await }));
                let producer = producer.clone();
                let topic = topic.clone();
                let id = format!("after-{stall}-{i}");
                sends.push(tokio::spawn(async move {
                    let sent = producer.publish(&topic, Event::new(id.clone()).with_id(id)).await;
                    (i, sent.map(drop), resumed.elapsed())
                }));
                tokio::time::sleep(SPACING).await;
            }
            let mut slowest = Duration::ZERO;
            for send in sends {
                let (i, sent, took) = tokio::time::timeout(CONFIRMED_WITHIN * 3, send)
                    .await
                    .map_err(|_| "a publish neither confirmed nor failed within 60 s".to_string())?
                    .map_err(|e| e.to_string())?;
                sent.map_err(|e| {
                    format!(
                        "publish {i} after resume {stall}: {e}; heals so far {:?}",
                        heals()
                    )
                })?;
                slowest = slowest.max(took);
            }
            for lookup in lookups {
                // Only the metadata reads matter; a declare that failed while the broker was fenced
                // is no finding of this test.
                let _ = tokio::time::timeout(CONFIRMED_WITHIN, lookup).await;
            }
            if slowest > CONFIRMED_WITHIN {
                return Err(format!(
                    "the last of {PUBLISHES} publishes after resume {stall} was confirmed {slowest:?} \
                     after it, want within {CONFIRMED_WITHIN:?}"
                ));
            }
            match require_heals(&before, &["producer"]) {
                Ok(healed) => {
                    println!(
                        "  {PUBLISHES} publishes after each of {stall} stalls of {STALL:?}: all \
                         confirmed, the last {:.1} s after the resume; heals: {healed}",
                        slowest.as_secs_f64()
                    );
                    return Ok(());
                }
                Err(inconclusive) if stall == STALLS => return Err(inconclusive),
                Err(_) => {}
            }
        }
        Ok(())
    })
}

fn consumers_read_again_after_the_only_broker_comes_back_fenced(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        let transport = KafkaTransport::connect_with(&url, stranding_config())
            .await
            .map_err(|e| e.to_string())?;
        let broker = Broker::new(transport);
        let topic = format!("stall-consume-{}", uuid::Uuid::new_v4().simple());
        broker
            .admin()
            .declare(&topic, Some("stall"))
            .await
            .map_err(|e| e.to_string())?;
        // Every event fails its first attempt and succeeds from its retry.
        let attempts: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        let seen = attempts.clone();
        let handler = handler_fn(move |event: Event, _ctx: Context| {
            let seen = seen.clone();
            async move {
                let id = event.id().unwrap_or_default().to_string();
                let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                let n = seen.entry(id).or_insert(0);
                *n += 1;
                if *n == 1 {
                    Err(HandlerError::deferred("the first attempt fails"))
                } else {
                    Ok(())
                }
            }
        });
        let policy = RetryPolicy::parse("100ms x1").map_err(|e| e.to_string())?;
        let consumer = broker
            .consumer(&topic)
            .group("stall")
            .policy(policy)
            .build()
            .map_err(|e| e.to_string())?
            .start(handler)
            .await
            .map_err(|e| e.to_string())?;
        let producer = broker.producer();
        publish_before(&producer, &topic).await?;
        tokio::time::timeout(
            HANDLED_WITHIN,
            consumer.wait_until(|s| s.succeeded_after_retry >= 1),
        )
        .await
        .map_err(|_| {
            format!(
                "the event before the stall was not retried and handled: {:?}",
                consumer.stats()
            )
        })?;

        let before = heals();
        let mut published = 0;
        for stall in 1..=STALLS {
            let resumed = stall_then_resume().await?;
            for i in 0..EVENTS_AFTER {
                let id = format!("after-{stall}-{i}");
                producer
                    .publish(&topic, Event::new(id.clone()).with_id(id))
                    .await
                    .map_err(|e| format!("publish {i} after resume {stall}: {e}"))?;
            }
            published += EVENTS_AFTER as u64;
            let all = 1 + published;
            let done = tokio::time::timeout(
                HANDLED_WITHIN.saturating_sub(resumed.elapsed()),
                consumer.wait_until(|s| s.succeeded_after_retry >= all),
            )
            .await;
            let took = resumed.elapsed();
            if done.is_err() {
                let stats = consumer.stats();
                let _ = consumer.shutdown().await;
                let handled: Vec<String> = attempts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .filter(|(id, _)| id.starts_with(&format!("after-{stall}-")))
                    .map(|(id, n)| format!("{id}:{n}"))
                    .collect();
                return Err(format!(
                    "{} of {EVENTS_AFTER} events published after resume {stall} were not handled \
                     from their retry within {HANDLED_WITHIN:?} of it; attempts seen {handled:?}; \
                     {stats:?}; heals so far {:?}",
                    all - stats.succeeded_after_retry.min(all),
                    heals()
                ));
            }
            match require_heals(&before, &["consumer", "ladder"]) {
                Ok(healed) => {
                    let _ = consumer.shutdown().await;
                    println!(
                        "  {EVENTS_AFTER} events after each of {stall} stalls of {STALL:?}: each \
                         failed once and was handled from its retry, the last {:.1} s after the \
                         resume; heals: {healed}",
                        took.as_secs_f64()
                    );
                    return Ok(());
                }
                Err(inconclusive) if stall == STALLS => {
                    let _ = consumer.shutdown().await;
                    return Err(inconclusive);
                }
                Err(_) => {}
            }
        }
        Ok(())
    })
}
