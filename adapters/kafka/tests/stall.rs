//! The adapter's producer against its only broker paused longer than the broker's session timeout
//! (`RETRY_TEST_KAFKA`, the single-node cluster `scripts/brokers` starts): on resume the controller
//! fences the broker for a moment, the metadata answered then lists no broker, and librdkafka drops its
//! connection to the only broker it knew — a producer left so sends nothing again (every record waits
//! for its 30 s timeout, for ever). Right after the resume the test reads metadata through the
//! producer many times over (declaring fresh topics: the producer looks each one up), so one answer
//! lands while the broker is fenced, and publishes events. They must all be confirmed well within the
//! message timeout: the adapter finds the stranded producer and replaces it.
//!
//! A binary of its own: the stall stops the broker every other test uses. It fails when
//! `RETRY_TEST_REQUIRE` names `kafka` and the variable is unset, and is skipped loudly otherwise.

use std::time::{Duration, Instant};

use event_retry_core::broker::Broker;
use event_retry_core::event::Event;
use event_retry_kafka::KafkaTransport;
use libtest_mimic::Arguments;
use test_support::broker::{Test, runtime};
use test_support::stall::Stall;

/// Longer than the broker's session timeout (`broker.session.timeout.ms`, 9 s): fenced on resume.
const STALL: Duration = Duration::from_secs(12);
/// Metadata reads and publishes started right after the resume, one of each every [`SPACING`], so
/// some land while the broker is fenced (about 50–120 ms after the resume here).
const PUBLISHES: usize = 40;
const SPACING: Duration = Duration::from_millis(10);
/// Every publish must be confirmed within this, well inside librdkafka's 30 s message timeout.
const CONFIRMED_WITHIN: Duration = Duration::from_secs(20);

fn main() {
    let args = Arguments::from_args();
    let tests: [(&str, Test); 1] = [(
        "publishes_go_on_after_the_only_broker_comes_back_fenced",
        publishes_go_on_after_the_only_broker_comes_back_fenced,
    )];
    let trials = test_support::broker::trials("kafka", "RETRY_TEST_KAFKA", &tests);
    libtest_mimic::run(&args, trials).exit();
}

fn publishes_go_on_after_the_only_broker_comes_back_fenced(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        let transport = KafkaTransport::connect(&url)
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
        producer
            .publish(&topic, Event::new("before").with_id("before"))
            .await
            .map_err(|e| format!("publish before the stall: {e}"))?;

        let mut stall = Stall::start("kafka", "pid")?;
        tokio::time::sleep(STALL).await;
        stall.resume()?;
        let resumed = Instant::now();
        let mut sends = Vec::new();
        let mut lookups = Vec::new();
        for i in 0..PUBLISHES {
            let b = broker.clone();
            let fresh = format!("{topic}-{i}");
            lookups.push(tokio::spawn(async move { b.admin().declare(&fresh, None).await }));
            let producer = producer.clone();
            let topic = topic.clone();
            sends.push(tokio::spawn(async move {
                let sent = producer
                    .publish(&topic, Event::new(format!("after-{i}")).with_id(format!("after-{i}")))
                    .await;
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
            sent.map_err(|e| format!("publish {i} after the resume: {e}"))?;
            slowest = slowest.max(took);
        }
        for lookup in lookups {
            // Only the metadata reads matter; a declare that failed while the broker was fenced is no
            // finding of this test.
            let _ = tokio::time::timeout(CONFIRMED_WITHIN, lookup).await;
        }
        if slowest > CONFIRMED_WITHIN {
            return Err(format!(
                "the last of {PUBLISHES} publishes after the resume was confirmed {slowest:?} after it, \
                 want within {CONFIRMED_WITHIN:?}"
            ));
        }
        println!(
            "  {PUBLISHES} publishes after a {STALL:?} stall: all confirmed, the last {:.1} s after the resume",
            slowest.as_secs_f64()
        );
        Ok(())
    })
}
