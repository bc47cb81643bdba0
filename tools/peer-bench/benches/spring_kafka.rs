//! event-retry beside Spring Kafka's `@RetryableTopic` on the same local Kafka, each with its defaults —
//! but Spring's listener runs one consumer thread per partition (`spring.kafka.listener.concurrency`
//! 4), as the SDK runs its handlers concurrently by default — each in its own process, in alternating
//! rounds:
//!
//! 1. `throughput`: 100,000 records of 1 KB in 4 partitions, no-op handler, 3 rounds; records per
//!    second from each consumer's first record to its last success, and each process's peak RSS; then
//!    the same against Spring with its defaults (one consumer thread for the four partitions);
//! 2. `fixed`: 1,000 events fail once and retry after 5 s (Spring: `attempts = 2`, 5 s back-off);
//! 3. `spread`: 171 events fail seven times, retrying after 1, 2, 4, 8, 16, 32 and 60 s (Spring: its
//!    exponential back-off from 1 s, ×2, capped at 60 s; the SDK: the same delays as a policy), 1,197
//!    retries; lateness in both is a retry's start minus the due time its own framework recorded.
//!
//! `fixed` and `spread` also run twice: against Spring at concurrency 4, then with its defaults.
//!
//! ```text
//! scripts/peer-bench                      # starts Kafka, builds the Spring app, runs every part
//! scripts/peer-bench throughput           # or one part: throughput, fixed, spread
//! ```
//!
//! `PEER_ROUNDS` (default 3) sets the throughput rounds, `PEER_LATENESS_ROUNDS` (default 1) the fixed
//! and spread rounds (a Spring round of either takes minutes: see the README), `PEER_THROUGHPUT_EVENTS`
//! the happy path's record count. The ratio lines come last.

use std::path::{Path, PathBuf};
use std::time::Duration;

use peer_bench::process::{self, Outcome, Side};
use peer_bench::report::Lateness;
use peer_bench::workload::Workload;
use peer_bench::{Error, kafka, sdk};
use test_support::bench;
use test_support::bench::spread;

const PARTITIONS: i32 = 4;

fn main() -> Result<(), Error> {
    if let Some(orders) = sdk::Orders::from_env()? {
        return tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(sdk::consume(orders));
    }
    bench::main(
        "RETRY_TEST_KAFKA",
        "kafka",
        |url| async move { run(&url).await },
    )
}

fn env_number(name: &str, default: u64) -> Result<u64, Error> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|e| format!("{name}={v:?} is not a number: {e}").into()),
        Err(_) => Ok(default),
    }
}

fn spring_jar() -> Result<PathBuf, Error> {
    let jar = std::env::var_os("PEER_SPRING_JAR").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("spring-kafka/target/spring-kafka-peer.jar")
        },
        PathBuf::from,
    );
    if jar.is_file() {
        Ok(jar)
    } else {
        Err(format!(
            "the Spring app is not built ({}): run scripts/peer-bench, which builds it with Maven",
            jar.display()
        )
        .into())
    }
}

/// One consumer, one round: a fresh topic filled for the workload, the consumer's process run until it
/// reports done, every topic of the round deleted.
async fn round(url: &str, side: Side, workload: &Workload, jar: &Path) -> Result<Outcome, Error> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("peer-{}-{}-{}", workload.name, side.name(), &id[..12]);
    kafka::create_topic(url, &topic, PARTITIONS).await?;
    kafka::fill(url, &topic, workload.events, workload.payload_bytes).await?;
    let command = match side {
        Side::Sdk => {
            let mut c = tokio::process::Command::new(std::env::current_exe()?);
            let orders = sdk::Orders {
                url: url.to_string(),
                topic: topic.clone(),
                events: workload.events,
                failures: workload.failures,
                policy: workload.sdk_policy(),
            };
            c.envs(orders.to_env());
            c
        }
        Side::Spring => {
            let java = std::env::var_os("JAVA_HOME").map_or_else(
                || PathBuf::from("java"),
                |h| PathBuf::from(h).join("bin/java"),
            );
            let mut c = tokio::process::Command::new(java);
            c.arg("-jar").arg(jar);
            c.arg(format!(
                "--spring.kafka.bootstrap-servers={}",
                kafka::bootstrap(url)
            ));
            c.arg(format!("--peer.topic={topic}"));
            c.arg(format!("--peer.group={topic}-group"));
            for (k, v) in workload.spring_properties() {
                c.arg(format!("--{k}={v}"));
            }
            c
        }
    };
    let log = process::log_dir()?.join(format!("{topic}.log"));
    let outcome = process::run(command, &log, workload.deadline).await;
    kafka::delete_topics(url, &topic).await?;
    let outcome = outcome?;
    if outcome.late_ms.len() as u64 != workload.retries() {
        return Err(format!(
            "{}: {} retries measured, the workload makes {} (log: {})",
            side.name(),
            outcome.late_ms.len(),
            workload.retries(),
            log.display()
        )
        .into());
    }
    Ok(outcome)
}

/// `rounds` rounds of both sides, the first side alternating.
async fn rounds(
    url: &str,
    workload: &Workload,
    rounds: u64,
    jar: &Path,
) -> Result<Vec<(Outcome, Outcome)>, Error> {
    let mut results = Vec::new();
    for r in 0..rounds {
        let order = if r % 2 == 0 {
            [Side::Spring, Side::Sdk]
        } else {
            [Side::Sdk, Side::Spring]
        };
        let (mut sdk, mut spring) = (None, None);
        for side in order {
            let outcome = round(url, side, workload, jar).await?;
            let figures = match Lateness::of(&outcome.late_ms) {
                None => format!("{:>9.0} events/s", outcome.rate()),
                Some(l) => format!(
                    "done {:.1} s after its first record, lateness p50/p99/max {}",
                    outcome.millis as f64 / 1000.0,
                    l.cell()
                ),
            };
            println!(
                "{} round {}: {:<12} {figures}, peak RSS {} MiB",
                workload.name,
                r + 1,
                side.name(),
                outcome.peak_rss_kib / 1024,
            );
            match side {
                Side::Sdk => sdk = Some(outcome),
                Side::Spring => spring = Some(outcome),
            }
        }
        results.push((sdk.ok_or("no SDK round")?, spring.ok_or("no Spring round")?));
    }
    Ok(results)
}

fn summary(name: &str, values: &[f64], unit: &str) -> String {
    spread(values).map_or_else(String::new, |(min, median, max)| {
        format!("{name}: median {median:.0} {unit} (min {min:.0}, max {max:.0})")
    })
}

async fn run(url: &str) -> Result<(), Error> {
    let jar = spring_jar()?;
    let rounds_n = env_number("PEER_ROUNDS", 3)?;
    let mut ratios = Vec::new();
    if bench::wants("throughput") {
        let events = env_number("PEER_THROUGHPUT_EVENTS", 100_000)?;
        // Spring with as many consumer threads as partitions (the SDK runs its handlers concurrently
        // by default), then with its defaults (one thread for the four partitions).
        let configurations = [
            (
                "spring",
                format!("Spring at concurrency {PARTITIONS}"),
                Workload::throughput(events, 1024).with_spring_concurrency(PARTITIONS as u32),
            ),
            (
                "spring-defaults",
                "Spring with its defaults (concurrency 1)".to_string(),
                Workload::throughput(events, 1024),
            ),
        ];
        for (label, describe, w) in configurations {
            println!(
                "== throughput: {} in {PARTITIONS} partitions, {describe}, {rounds_n} alternating rounds",
                w.describe()
            );
            let results = rounds(url, &w, rounds_n, &jar).await?;
            let rates = |pick: fn(&(Outcome, Outcome)) -> &Outcome| -> Vec<f64> {
                results.iter().map(|r| pick(r).rate()).collect()
            };
            let rss = |pick: fn(&(Outcome, Outcome)) -> &Outcome| -> Vec<f64> {
                results
                    .iter()
                    .map(|r| pick(r).peak_rss_kib as f64 / 1024.0)
                    .collect()
            };
            let (sdk_rates, spring_rates) = (rates(|r| &r.0), rates(|r| &r.1));
            let (sdk_rss, spring_rss) = (rss(|r| &r.0), rss(|r| &r.1));
            println!(
                "{}",
                summary("event-retry throughput", &sdk_rates, "events/s")
            );
            println!(
                "{}",
                summary(&format!("{label} throughput"), &spring_rates, "events/s")
            );
            println!("{}", summary("event-retry peak RSS", &sdk_rss, "MiB"));
            println!(
                "{}",
                summary(&format!("{label} peak RSS"), &spring_rss, "MiB")
            );
            let median = |v: &[f64]| spread(v).map_or(0.0, |s| s.1);
            ratios.push(format!(
                "ratio sdk/{label} kafka throughput: {:.2}",
                median(&sdk_rates) / median(&spring_rates)
            ));
            ratios.push(format!(
                "ratio sdk/{label} kafka peak rss: {:.2}",
                median(&sdk_rss) / median(&spring_rss)
            ));
        }
    }
    let lateness_rounds = env_number("PEER_LATENESS_ROUNDS", 1)?;
    // Each lateness part runs Spring as the throughput part does: one consumer thread per partition,
    // then its defaults.
    let lateness_parts = [
        (
            "fixed",
            Workload::fixed_delay(1_000, Duration::from_secs(5)),
        ),
        ("spread", Workload::spread(171)),
    ];
    for (part, workload) in lateness_parts {
        if !bench::wants(part) {
            continue;
        }
        let configurations = [
            (
                "spring",
                format!("Spring at concurrency {PARTITIONS}"),
                workload.clone().with_spring_concurrency(PARTITIONS as u32),
            ),
            (
                "spring-defaults",
                "Spring with its defaults (concurrency 1)".to_string(),
                workload.clone(),
            ),
        ];
        for (label, describe, w) in configurations {
            let n = lateness_rounds;
            println!(
                "== retry lateness, {}, {describe}: {n} alternating rounds",
                w.describe()
            );
            let results = rounds(url, &w, n, &jar).await?;
            let all = |pick: fn(&(Outcome, Outcome)) -> &Outcome| -> Vec<i64> {
                results
                    .iter()
                    .flat_map(|r| pick(r).late_ms.clone())
                    .collect()
            };
            let sdk = Lateness::of(&all(|r| &r.0)).ok_or("no SDK retry measured")?;
            let spring = Lateness::of(&all(|r| &r.1)).ok_or("no Spring retry measured")?;
            println!("event-retry  lateness p50 / p99 / max: {}", sdk.cell());
            println!("{label:<15} lateness p50 / p99 / max: {}", spring.cell());
            for (name, s, p) in [("p50", sdk.p50, spring.p50), ("p99", sdk.p99, spring.p99)] {
                ratios.push(format!(
                    "ratio sdk/{label} kafka lateness {part} {name}: {:.2} ({s} ms / {p} ms)",
                    s as f64 / (p as f64).max(1.0)
                ));
            }
            if sdk.early > 0 {
                return Err(format!("{} SDK retries ran before their due time", sdk.early).into());
            }
        }
    }
    for line in ratios {
        println!("{line}");
    }
    Ok(())
}
