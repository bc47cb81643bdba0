//! `retryctl migrate` between real brokers: RabbitMQ→Kafka, Kafka→SQS, SQS→Pulsar, Pulsar→RabbitMQ.
//!
//! For each pair, five entries are dead-lettered on the source — two non-retryable, two whose policy ran
//! out after two retries, and one dead-lettered, replayed by an operator and dead-lettered again — each
//! with a key and a text and a binary header. A dry run changes nothing on either broker; then the move.
//! The target's DLQ is read with the target broker's own client (rdkafka, lapin, aws-sdk-sqs, pulsar)
//! and every entry's history is compared field by field with what the source held (event id, attempts,
//! retries, first seen, origin, last error and kind, last delay, replay count and time, dead reason,
//! time and consumer, the payload bytes, and the consumer group where the target keeps one); key and
//! headers byte for byte through the SDK's reading of the target. The source is read with its own
//! client too: empty (on Kafka, where records stay, the DLQ group's committed offsets are at the end).
//!
//! On RabbitMQ→Kafka a migration of 200 entries — one of them already copied to Kafka, as by an earlier
//! run that died before removing it from RabbitMQ — is also killed (SIGKILL) part of the way through
//! and run again: the target then holds each of the 200 exactly once (read with rdkafka) and the source
//! none (read with lapin).
//!
//! A pair whose brokers are not both configured is skipped loudly, or fails when `RETRY_TEST_REQUIRE`
//! names one of them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use event_retry::{
    Broker, Context, DeadLetter, DlqFilter, Event, HandlerError, Headers, handler_fn,
};
use event_retry_core::metadata::{self, RetryMetadata};
use libtest_mimic::{Arguments, Failed, Trial};
use raw_brokers::{RawBroker, RawEntry, RawKafka, RawPulsar, RawRabbit, RawSqs};
use retryctl::Cli;
use test_support::broker::{required_brokers, runtime, url};

/// A broker of a pair: its name and the variable with its URL.
type Side = (&'static str, &'static str);

const KAFKA: Side = ("kafka", "RETRY_TEST_KAFKA");
const RABBITMQ: Side = ("rabbitmq", "RETRY_TEST_AMQP");
const SQS: Side = ("sqs", "RETRY_TEST_SQS");
const PULSAR: Side = ("pulsar", "RETRY_TEST_PULSAR");

fn main() {
    let args = Arguments::from_args();
    let pairs = [
        (RABBITMQ, KAFKA),
        (KAFKA, SQS),
        (SQS, PULSAR),
        (PULSAR, RABBITMQ),
    ];
    let mut trials = Vec::new();
    for (from, to) in pairs {
        let name = format!("{}_to_{}::history_moves_field_by_field", from.0, to.0);
        trials.push(pair_trial(name, from, to, history_moves));
    }
    trials.push(pair_trial(
        "rabbitmq_to_kafka::a_killed_migration_resumes_without_loss_or_duplicates".into(),
        RABBITMQ,
        KAFKA,
        killed_and_resumed,
    ));
    libtest_mimic::run(&args, trials).exit();
}

/// The trial of a test on a pair of brokers: run when both are configured, else skipped loudly or
/// failed when `RETRY_TEST_REQUIRE` names one of them.
fn pair_trial(name: String, from: Side, to: Side, test: fn(Pair) -> Result<(), String>) -> Trial {
    let required = required_brokers();
    match (url(from.1), url(to.1)) {
        (Some(a), Some(b)) => Trial::test(name, move || {
            test(Pair {
                from: (from.0, a),
                to: (to.0, b),
            })
            .map_err(Failed::from)
        }),
        _ if required.iter().any(|b| b == from.0 || b == to.0) => Trial::test(name, move || {
            Err(Failed::from(format!(
                "RETRY_TEST_REQUIRE names {} or {} but {} or {} is not set",
                from.0, to.0, from.1, to.1
            )))
        }),
        _ => {
            eprintln!("SKIP {name}: {} and {} are not both set", from.1, to.1);
            Trial::test(name, || Ok(())).with_ignored_flag(true)
        }
    }
}

/// The URL without its query, for the broker's own client.
fn bare(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}

/// Two brokers, each by name and URL.
struct Pair {
    from: (&'static str, String),
    to: (&'static str, String),
}

/// The broker's own client.
async fn raw(name: &str, url: &str) -> Result<Box<dyn RawBroker>, String> {
    Ok(match name {
        "kafka" => Box::new(RawKafka::new(bare(url))),
        "rabbitmq" => Box::new(RawRabbit::new(bare(url))),
        "sqs" => Box::new(RawSqs::new(bare(url))),
        "pulsar" => {
            let admin = std::env::var("RETRY_TEST_PULSAR_ADMIN")
                .map_err(|_| "RETRY_TEST_PULSAR_ADMIN is not set")?;
            Box::new(
                RawPulsar::connect(bare(url), &admin)
                    .await
                    .map_err(|e| e.to_string())?,
            )
        }
        other => return Err(format!("no raw client for {other}")),
    })
}

/// Runs `retryctl` with `args`; its output, or its error.
async fn retryctl(args: &[&str]) -> Result<String, String> {
    let cli = <Cli as clap::Parser>::try_parse_from(
        std::iter::once("retryctl").chain(args.iter().copied()),
    )
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    retryctl::run(cli, &mut out)
        .await
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn fail<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// A fresh topic on `broker`, declared.
async fn topic_on(broker: &Broker, prefix: &str) -> Result<String, String> {
    let topic = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
    broker.admin().declare(&topic, None).await.map_err(fail)?;
    Ok(topic)
}

/// Dead-letters the five entries of the module docs on `topic`.
async fn seed(broker: &Broker, topic: &str) -> Result<(), String> {
    let consumer = broker
        .consumer(topic)
        .name("migrate-seed")
        .policy(event_retry::RetryPolicy::parse("10ms x2").map_err(fail)?)
        .start(handler_fn(|event: Event, _c: Context| async move {
            let id = event.id().unwrap_or_default().to_string();
            if id.starts_with("late") {
                Err(HandlerError::deferred(format!(
                    "{id}: stock service unavailable"
                )))
            } else {
                Err(HandlerError::non_retryable(format!("{id}: quantity is -1")))
            }
        }))
        .await
        .map_err(fail)?;
    let producer = broker.producer();
    for id in ["bad-0", "bad-1", "late-0", "late-1", "again-0"] {
        let event = Event::new(format!("payload of {id}"))
            .with_id(id)
            .with_key(format!("key-{id}"))
            .with_header("h-text", format!("text of {id}"))
            .with_header("h-bin", vec![0xff, 0x00, 0x7f]);
        producer.publish(topic, event).await.map_err(fail)?;
    }
    let dead = |n: u64| consumer.wait_until(move |s| s.dead_lettered >= n);
    tokio::time::timeout(Duration::from_secs(60), dead(5))
        .await
        .map_err(|_| "the five events were not dead-lettered within 60 s")?;
    // One replayed by an operator, then dead-lettered again: its replay count is 1.
    let replayed = broker
        .dead_letters()
        .list(topic, &DlqFilter::all())
        .await
        .map_err(fail)?
        .into_iter()
        .find(|e| e.event.id() == Some("again-0"))
        .ok_or("again-0 is not in the DLQ")?;
    broker
        .dead_letters()
        .replay(topic, &DlqFilter::id(replayed.id))
        .await
        .map_err(fail)?;
    tokio::time::timeout(Duration::from_secs(60), dead(6))
        .await
        .map_err(|_| "the replayed event was not dead-lettered again within 60 s")?;
    consumer.shutdown().await.map_err(fail)
}

/// How many messages the broker holds in `dlq`, read with its own client.
async fn count(raw: &dyn RawBroker, dlq: &str) -> Result<usize, String> {
    raw.messages(dlq).await.map(|m| m.len()).map_err(fail)
}

/// How many entries the source DLQ `dlq` still holds, read with the broker's own client: where a
/// removal is a mark rather than a deletion, what lies beyond the DLQ group's committed offsets (Kafka)
/// or its subscription's backlog (Pulsar); elsewhere the messages themselves.
async fn left_in_source(
    name: &str,
    url: &str,
    raw: &dyn RawBroker,
    dlq: &str,
) -> Result<usize, String> {
    match name {
        "kafka" => {
            let (url, dlq) = (bare(url).to_string(), dlq.to_string());
            tokio::task::spawn_blocking(move || {
                RawKafka::new(&url).uncommitted("event-retry-dlq", &dlq)
            })
            .await
            .map_err(fail)?
            .map(|n| n as usize)
            .map_err(fail)
        }
        "pulsar" => {
            let admin = std::env::var("RETRY_TEST_PULSAR_ADMIN").map_err(fail)?;
            let pulsar = RawPulsar::connect(bare(url), &admin).await.map_err(fail)?;
            pulsar
                .backlog(dlq, "event-retry-dlq")
                .await
                .map(|n| n as usize)
                .map_err(fail)
        }
        _ => count(raw, dlq).await,
    }
}

/// The SDK's metadata in a message as the broker holds it.
fn meta_of(entry: &RawEntry) -> RetryMetadata {
    let mut headers = Headers::new();
    for (name, value) in &entry.headers {
        headers.push(name.clone(), value.clone());
    }
    metadata::decode_lenient(&headers).0
}

/// The history fields compared between source and target, in words.
fn history(m: &RetryMetadata) -> BTreeMap<&'static str, String> {
    let dead = m.dead.as_ref();
    BTreeMap::from([
        ("event id", format!("{:?}", m.event_id)),
        ("attempts", m.attempts.to_string()),
        ("retries", m.retries.to_string()),
        ("first seen", format!("{:?}", m.first_seen)),
        (
            "origin topic",
            format!("{:?}", m.origin.as_ref().map(|o| &o.topic)),
        ),
        (
            "origin partition",
            format!("{:?}", m.origin.as_ref().map(|o| o.partition)),
        ),
        (
            "origin offset",
            format!("{:?}", m.origin.as_ref().map(|o| o.offset)),
        ),
        ("last error", format!("{:?}", m.last_error)),
        ("error kind", format!("{:?}", m.error_kind)),
        ("last delay", format!("{:?}", m.last_delay)),
        ("replay count", m.replay_count.to_string()),
        ("replayed at", format!("{:?}", m.replayed_at)),
        ("dead reason", format!("{:?}", dead.map(|d| d.reason))),
        ("dead at", format!("{:?}", dead.map(|d| d.at))),
        ("dead consumer", format!("{:?}", dead.map(|d| &d.consumer))),
    ])
}

fn by_id(entries: &[DeadLetter]) -> BTreeMap<String, &DeadLetter> {
    entries
        .iter()
        .map(|e| (e.event.id().unwrap_or_default().to_string(), e))
        .collect()
}

/// Whether the broker `name` keeps the group that dead-lettered an entry.
fn keeps_groups(name: &str) -> bool {
    name != "sqs"
}

fn history_moves(pair: Pair) -> Result<(), String> {
    runtime()?.block_on(async move {
        let (from_name, from_url) = (pair.from.0, pair.from.1.as_str());
        let (to_name, to_url) = (pair.to.0, pair.to.1.as_str());
        let source = event_retry::connect(from_url).await.map_err(fail)?;
        let target = event_retry::connect(to_url).await.map_err(fail)?;
        let topic = topic_on(&source, "migrate").await?;
        target.admin().declare(&topic, None).await.map_err(fail)?;
        seed(&source, &topic).await?;
        let before = source
            .dead_letters()
            .list(&topic, &DlqFilter::all())
            .await
            .map_err(fail)?;
        if before.len() != 5 {
            return Err(format!(
                "the source DLQ holds {} entries, want 5",
                before.len()
            ));
        }
        let replays: Vec<u32> = before
            .iter()
            .map(|e| e.event.metadata().replay_count)
            .collect();
        if !replays.contains(&1) || !before.iter().any(|e| e.event.metadata().retries == 2) {
            return Err(format!(
                "the seeded history is not varied: replays {replays:?}"
            ));
        }
        let source_raw = raw(from_name, from_url).await?;
        let target_raw = raw(to_name, to_url).await?;
        let source_dlq = source.admin().names(&topic, None).await.map_err(fail)?.dlq;
        let target_dlq = target.admin().names(&topic, None).await.map_err(fail)?.dlq;
        // (On Kafka the replayed entry stays a record, marked removed in the DLQ group's commit
        // metadata: its records are counted after the move only, when every one is behind the mark.)
        if from_name != "kafka" {
            let before_raw =
                left_in_source(from_name, from_url, source_raw.as_ref(), &source_dlq).await?;
            if before_raw != 5 {
                return Err(format!(
                    "the source's own client sees {before_raw} entries, want 5"
                ));
            }
        }

        let args = [
            "migrate", "--from", from_url, "--to", to_url, "--topic", &topic,
        ];
        let dry = retryctl(&[&args[..], &["--dry-run"]].concat()).await?;
        if !dry.contains("5 would be copied") {
            return Err(format!("the dry run said: {dry}"));
        }
        let after_dry = count(target_raw.as_ref(), &target_dlq).await?;
        if after_dry != 0 {
            return Err(format!("a dry run wrote {after_dry} entries to the target"));
        }

        let done = retryctl(&args).await?;
        if !done.contains("5 copied") {
            return Err(format!("the migration said: {done}"));
        }
        if keeps_groups(from_name) && !keeps_groups(to_name) && !done.contains("keeps no group") {
            return Err(format!("the lost group is not reported: {done}"));
        }

        // The target, read with its own client: every entry's history, field by field.
        let moved = target_raw.messages(&target_dlq).await.map_err(fail)?;
        if moved.len() != 5 {
            return Err(format!("the target holds {} entries, want 5", moved.len()));
        }
        let expected = by_id(&before);
        let mut seen = BTreeSet::new();
        for entry in &moved {
            let meta = meta_of(entry);
            let id = meta
                .event_id
                .as_deref()
                .map(str::to_string)
                .ok_or("an entry without an event id")?;
            let want = expected
                .get(&id)
                .ok_or(format!("{id} was not in the source"))?;
            if !seen.insert(id.clone()) {
                return Err(format!("{id} is in the target twice"));
            }
            let mark = event_retry_core::dlq::migration_mark(from_name, &topic, &want.id);
            if meta.migrated_from.as_deref() != Some(mark.as_str()) {
                return Err(format!(
                    "{id}: the copy says it came from {:?}, want {mark}",
                    meta.migrated_from
                ));
            }
            let (got, exp) = (history(&meta), history(want.event.metadata()));
            for (field, value) in &exp {
                if got.get(field) != Some(value) {
                    return Err(format!(
                        "{id}: {field} is {:?} on the target, {value} on the source",
                        got.get(field)
                    ));
                }
            }
            if entry.payload != want.event.payload.as_ref() {
                return Err(format!("{id}: the payload changed"));
            }
            let group = entry
                .header("x-retry-group")
                .map(|g| String::from_utf8_lossy(g).into_owned());
            let want_group = if keeps_groups(to_name) {
                want.group.clone()
            } else {
                None
            };
            if group != want_group {
                return Err(format!(
                    "{id}: group {group:?} on the target, want {want_group:?}"
                ));
            }
        }
        // Key, headers and payload byte for byte, as the SDK reads the target.
        let after = target
            .dead_letters()
            .list(&topic, &DlqFilter::all())
            .await
            .map_err(fail)?;
        for (id, e) in by_id(&after) {
            let want = expected.get(&id).ok_or(format!("{id} unexpected"))?;
            if e.event.key != want.event.key
                || e.event.headers != want.event.headers
                || e.event.payload != want.event.payload
            {
                return Err(format!(
                    "{id}: key/headers/payload differ: {:?} {:?} vs {:?} {:?}",
                    e.event.key, e.event.headers, want.event.key, want.event.headers
                ));
            }
        }

        // The source, read with its own client: nothing left.
        let left = left_in_source(from_name, from_url, source_raw.as_ref(), &source_dlq).await?;
        if left != 0 {
            return Err(format!("{left} entries are left in the source"));
        }
        // Run again: nothing to move, nothing duplicated.
        let again = retryctl(&args).await?;
        if !again.starts_with("migrated 0 dead letters") {
            return Err(format!("a second run said: {again}"));
        }
        if count(target_raw.as_ref(), &target_dlq).await? != 5 {
            return Err("a second run changed the target".into());
        }
        cleanup(&source, &topic).await?;
        cleanup(&target, &topic).await
    })
}

/// Deletes `topic` where the broker lets the SDK delete (Pulsar's needs its admin API).
async fn cleanup(broker: &Broker, topic: &str) -> Result<(), String> {
    match broker.admin().delete(topic).await {
        Err(e) if e.kind() == event_retry::error::Kind::Unsupported => Ok(()),
        other => other.map_err(fail),
    }
}

/// Dead-letters `n` events on `topic` (non-retryable at once).
async fn seed_many(broker: &Broker, topic: &str, n: usize) -> Result<(), String> {
    let consumer = broker
        .consumer(topic)
        .concurrency(64)
        .start(handler_fn(|_e: Event, _c: Context| async {
            Err(HandlerError::non_retryable("refused"))
        }))
        .await
        .map_err(fail)?;
    let producer = broker.producer();
    for i in 0..n {
        producer
            .publish(topic, Event::new(format!("p{i}")).with_id(format!("e{i}")))
            .await
            .map_err(fail)?;
    }
    tokio::time::timeout(
        Duration::from_secs(120),
        consumer.wait_until(move |s| s.dead_lettered >= n as u64),
    )
    .await
    .map_err(|_| format!("{n} events were not dead-lettered within 120 s"))?;
    consumer.shutdown().await.map_err(fail)
}

fn killed_and_resumed(pair: Pair) -> Result<(), String> {
    const N: usize = 200;
    runtime()?.block_on(async move {
        let (from_url, to_url) = (pair.from.1.as_str(), pair.to.1.as_str());
        let source = event_retry::connect(from_url).await.map_err(fail)?;
        let target = event_retry::connect(to_url).await.map_err(fail)?;
        let topic = topic_on(&source, "migrate-kill").await?;
        target.admin().declare(&topic, None).await.map_err(fail)?;
        seed_many(&source, &topic, N).await?;
        // As though an earlier run had copied e0 (its copy marked as the migration marks it) and died
        // before removing it from the source.
        let e0 = source
            .dead_letters()
            .list(&topic, &DlqFilter::all())
            .await
            .map_err(fail)?
            .into_iter()
            .find(|e| e.event.id() == Some("e0"))
            .ok_or("e0 is not in the source")?;
        let mut copy = e0.event.clone();
        event_retry_core::adapter::metadata_mut(&mut copy).migrated_from = Some(
            event_retry_core::dlq::migration_mark("rabbitmq", &topic, &e0.id),
        );
        target
            .transport()
            .write_dead_letter(&topic, e0.group.as_deref(), &copy)
            .await
            .map_err(fail)?;

        // The real binary, killed once it reported a quarter of the way.
        let mut child = Command::new(env!("CARGO_BIN_EXE_retryctl"))
            .args(["migrate", "--from", from_url, "--to", to_url, "--topic", &topic])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(fail)?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let reached = tokio::task::spawn_blocking(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(done) = line
                    .strip_prefix("migrated ")
                    .and_then(|rest| rest.split('/').next())
                    .and_then(|n| n.parse::<usize>().ok())
                    && done >= N / 4
                {
                    return Some(done);
                }
            }
            None
        });
        let reached = tokio::time::timeout(Duration::from_secs(120), reached)
            .await
            .map_err(|_| "the migration did not get a quarter of the way in 120 s")?
            .map_err(fail)?;
        child.kill().map_err(fail)?;
        let status = child.wait().map_err(fail)?;
        let Some(reached) = reached else {
            return Err(format!("the migration ended ({status}) before it could be killed"));
        };
        if status.success() {
            return Err("the migration finished before the kill".into());
        }
        let target_dlq = target.admin().names(&topic, None).await.map_err(fail)?.dlq;
        let source_dlq = source.admin().names(&topic, None).await.map_err(fail)?.dlq;
        let partial = RawKafka::new(to_url).messages(&target_dlq).await.map_err(fail)?.len();
        if partial == 0 || partial >= N {
            return Err(format!("killed after {reached}, the target holds {partial} of {N}"));
        }

        let done = retryctl(&["migrate", "--from", from_url, "--to", to_url, "--topic", &topic]).await?;
        let moved = RawKafka::new(to_url).messages(&target_dlq).await.map_err(fail)?;
        let ids: BTreeSet<String> = moved
            .iter()
            .filter_map(|m| meta_of(m).event_id.as_deref().map(str::to_string))
            .collect();
        let want: BTreeSet<String> = (0..N).map(|i| format!("e{i}")).collect();
        if moved.len() != N || ids != want {
            return Err(format!(
                "after the kill at {reached} and a second run ({done}), the target holds {} entries \
                 ({} distinct) of {N}",
                moved.len(),
                ids.len()
            ));
        }
        let left = RawRabbit::new(from_url).depth(&source_dlq).await.map_err(fail)?;
        if left != 0 {
            return Err(format!("{left} entries are left in the source"));
        }
        eprintln!(
            "killed at {reached} of {N} with {partial} in the target; the second run: {}",
            done.lines().next().unwrap_or_default()
        );
        source.admin().delete(&topic).await.map_err(fail)?;
        target.admin().delete(&topic).await.map_err(fail)
    })
}
