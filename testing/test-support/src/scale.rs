//! The scale-out part of every adapter's bench: 1, 2 and 4 consumer processes in one group on one topic
//! (4 partitions on Kafka; a shared queue or subscription elsewhere), each process a copy of the bench
//! binary (part `scale-consumer`).
//!
//! The consumers start first, with their handlers held at a gate; once each says it is running and the
//! group has had a few seconds to settle, the bench publishes `RETRY_BENCH_SCALE_EVENTS` events
//! (100,000 when unset), then opens every gate at once (a line on each process's standard input). The
//! rate is the events over the time from the gate's opening to the last one handled, so neither the
//! publisher nor the group's start-up is in it. Everything — broker, bench, consumers — shares this
//! machine's cores.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use event_retry_core::adapter::Admin;
use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::runtime::{Context, handler_fn};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::mpsc;

use crate::bench::{Error, work};
use crate::child;

/// The part name the bench binary is run again with, as one consumer.
pub const CONSUMER_PART: &str = "scale-consumer";
const TOPIC_ENV: &str = "RETRY_BENCH_SCALE_TOPIC";
const PROCESSES: [usize; 3] = [1, 2, 4];
const SETTLE: Duration = Duration::from_secs(8);

/// The consumer process: consumes the topic named in its environment until killed, printing
/// `SCALE ready` once started and `SCALE handled <n>` as its count grows.
pub async fn consumer(broker: &Broker) -> Result<(), Error> {
    let topic = std::env::var(TOPIC_ENV).map_err(|_| format!("{TOPIC_ENV} is not set"))?;
    let (open, gate) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = stdin.next_line().await {
            if line.trim() == "go" {
                let _ = open.send(true);
            }
        }
    });
    let handler = handler_fn(move |event: Event, _ctx: Context| {
        let mut gate = gate.clone();
        async move {
            if !*gate.borrow() {
                let _ = gate.wait_for(|open| *open).await;
            }
            std::hint::black_box(work(&event.payload));
            Ok::<(), HandlerError>(())
        }
    });
    let consumer = broker.consumer(&topic).start(handler).await?;
    println!("SCALE ready");
    let mut last = 0;
    loop {
        let handled = consumer.stats().succeeded;
        if handled != last {
            println!("SCALE handled {handled}");
            last = handled;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn parse(line: &str) -> Option<Option<u64>> {
    match line.trim().strip_prefix("SCALE ")? {
        "ready" => Some(None),
        rest => rest.strip_prefix("handled ")?.parse().ok().map(Some),
    }
}

/// The bench side: for 1, 2 and 4 processes, a fresh topic declared through `admin` (which sets its
/// partitions), the consumers started, the events published, the rate measured. Prints a line per
/// count and `ratio scale-out <broker> <n>/1: x`.
pub async fn run(broker: &Broker, name: &str, admin: &dyn Admin) -> Result<(), Error> {
    let events = crate::bench::count_from_env("RETRY_BENCH_SCALE_EVENTS", 100_000, 0)? as u64;
    let size = crate::bench::payload_bytes()?;
    let mut rates = Vec::new();
    for processes in PROCESSES {
        let topic = format!(
            "bench-scale-{processes}-{:x}",
            event_retry_core::time::Timestamp::now().as_millis()
        );
        admin.declare(&topic, None).await?;
        let (tx, mut counts) = mpsc::unbounded_channel::<(usize, Option<u64>)>();
        let mut helpers = Vec::new();
        for i in 0..processes {
            let log = child::log_path(&format!("scale-consumer-{name}-{processes}-{i}.log"))?;
            let mut helper =
                child::spawn_with_input(CONSUMER_PART, &[(TOPIC_ENV, topic.clone())], &log)?;
            let mut lines = std::mem::replace(&mut helper.lines, mpsc::unbounded_channel().1);
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(line) = lines.recv().await {
                    if let Some(report) = parse(&line)
                        && tx.send((i, report)).is_err()
                    {
                        break;
                    }
                }
            });
            helpers.push(helper);
        }
        drop(tx);
        let mut ready = 0;
        tokio::time::timeout(Duration::from_secs(120), async {
            while ready < processes {
                match counts.recv().await {
                    Some((_, None)) => ready += 1,
                    Some(_) => {}
                    None => return Err::<(), Error>("a consumer process exited".into()),
                }
            }
            Ok(())
        })
        .await
        .map_err(|_| format!("{ready} of {processes} consumers started within 120 s"))??;
        tokio::time::sleep(SETTLE).await;

        let producer = broker.producer();
        let published = Instant::now();
        futures::stream::iter(0..events)
            .map(|i| {
                let producer = producer.clone();
                let topic = topic.clone();
                async move {
                    let body = format!("{i:0>width$}", width = size);
                    producer
                        .publish(&topic, Event::new(body).with_id(format!("s{i}")))
                        .await
                        .map(drop)
                }
            })
            .buffer_unordered(256)
            .try_collect::<Vec<()>>()
            .await?;
        let publish_time = published.elapsed();
        let opened = Instant::now();
        for helper in &mut helpers {
            helper.tell("go").await?;
        }
        let mut handled: HashMap<usize, u64> = HashMap::new();
        let finished = tokio::time::timeout(Duration::from_secs(600), async {
            while handled.values().sum::<u64>() < events {
                match counts.recv().await {
                    Some((i, Some(n))) => {
                        handled.insert(i, n);
                    }
                    Some(_) => {}
                    None => return Err::<(), Error>("a consumer process exited".into()),
                }
            }
            Ok(())
        })
        .await;
        finished.map_err(|_| {
            format!(
                "{processes} processes handled {} of {events} within 600 s",
                handled.values().sum::<u64>()
            )
        })??;
        let elapsed = opened.elapsed();
        let rate = events as f64 / elapsed.as_secs_f64().max(1e-3);
        let mut shares: Vec<u64> = (0..processes)
            .map(|i| handled.get(&i).copied().unwrap_or(0))
            .collect();
        shares.sort_unstable_by(|a, b| b.cmp(a));
        println!(
            "scale-out {name}: {processes} process(es): {rate:.0} events/s ({events} events of {size} B; per process {shares:?}; published beforehand in {:.1} s)",
            publish_time.as_secs_f64()
        );
        rates.push((processes, rate));
        for mut helper in helpers {
            helper.child.kill().await.ok();
        }
        crate::bench::tidy(admin, &topic).await;
    }
    let one = rates.first().map_or(1.0, |r| r.1);
    for (processes, rate) in &rates[1..] {
        println!("ratio scale-out {name} {processes}/1: {:.2}", rate / one);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_lines_parse_and_others_do_not() {
        assert_eq!(parse("SCALE ready"), Some(None));
        assert_eq!(parse("SCALE handled 42"), Some(Some(42)));
        for other in ["", "SCALE", "SCALE handled", "SCALE handled x", "ready"] {
            assert_eq!(parse(other), None, "{other:?}");
        }
    }
}
