//! One fault run, from producing the events to counting them, and the matrix of runs.
//!
//! The order of a run: declare a fresh topic, produce every event (confirmed by the broker), start the
//! consumer process, wait until 30 % of the events were handled, inject the fault, end it, produce a few
//! probe events (the stream must carry new work after the fault, not only the backlog), wait until every
//! event is accounted for or nothing moves for a minute, stop the consumer with SIGTERM, and count.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use event_retry::{Broker, Event};
use futures::StreamExt;

use crate::account::account;
use crate::effects::{self, InboxDb};
use crate::faults::{AT_SHARE, Fault};
use crate::netns::Namespace;
use crate::outage::{OutageHalf, first_ids};
use crate::process::{Consumer, Launch, Pace};
use crate::record::{RecordReader, now_ms};
use crate::report::Row;
use crate::target::{BrokerName, Target};
use crate::workload;
use raw_brokers::BoxError;

mod inject;

/// Events produced after the fault ended, which the consumer must handle too.
const PROBES: usize = 20;
/// How long a fresh consumer reads the group after the run, to find what the broker still holds.
const DRAIN: Duration = Duration::from_secs(10);

/// How long a run waits with nothing moving before it counts what it has.
const QUIET: Duration = Duration::from_secs(60);

/// The longest a run waits after the fault ended.
const AFTER_FAULT: Duration = Duration::from_secs(300);

/// What every run of a matrix shares.
pub(crate) struct Settings {
    /// Events per run (before the probes).
    pub(crate) events: usize,
    /// Adapter options for every run.
    pub(crate) options: Vec<(String, String)>,
    /// How long a stall, cut or DLQ outage lasts.
    pub(crate) outage: Duration,
    /// How long a failing-once event waits before its retry.
    pub(crate) retry_after: Duration,
    /// How long the handler works on each event.
    pub(crate) work: Duration,
    /// Where the consumer's inbox and side effects live.
    pub(crate) inbox: InboxDb,
}

/// Runs every fault on every broker (F6 on the Kafka cluster alone) and writes the report; `true` when
/// every row passed.
pub(crate) async fn matrix(
    brokers: &[BrokerName],
    faults: &[Fault],
    settings: &Settings,
    out: &Path,
) -> Result<bool, Box<dyn std::error::Error>> {
    for dir in ["rows", "records", "logs"] {
        std::fs::create_dir_all(out.join(dir))?;
    }
    let mut all_passed = true;
    for &fault in faults {
        let mut cells: Vec<BrokerName> = match fault.cluster() {
            Some(cluster) => vec![cluster],
            None => brokers
                .iter()
                .copied()
                .filter(|b| !matches!(b, BrokerName::KafkaCluster | BrokerName::RabbitmqCluster))
                .collect(),
        };
        // A broker named twice runs once: two cells of one broker and fault share their record, inbox
        // and row files (and at the same time, with F1, would clear each other's).
        let mut named = Vec::with_capacity(cells.len());
        cells.retain(|b| {
            let first = !named.contains(b);
            named.push(*b);
            first
        });
        let rows = if fault.runs_beside_other_brokers() {
            futures::future::join_all(
                cells
                    .iter()
                    .map(|&broker| reported_cell(broker, fault, settings, out)),
            )
            .await
        } else {
            let mut rows = Vec::with_capacity(cells.len());
            for &broker in &cells {
                rows.push(reported_cell(broker, fault, settings, out).await);
            }
            rows
        };
        for row in rows {
            all_passed &= row?.passed();
        }
    }
    let report = crate::report::write(out)?;
    println!("{report}");
    Ok(all_passed)
}

/// Runs `fault` on `broker`, saves its row and says so on the terminal, at its start and with the row; a
/// run that could not be carried out is a failed row that says why.
async fn reported_cell(
    broker: BrokerName,
    fault: Fault,
    settings: &Settings,
    out: &Path,
) -> std::io::Result<Row> {
    eprintln!("== {broker}: {}", fault.describe(settings.outage));
    let mut row = cell(broker, fault, settings, out)
        .await
        .unwrap_or_else(|e| Row {
            broker: broker.to_string(),
            fault: fault.describe(settings.outage),
            error: Some(e.to_string()),
            ..Row::default()
        });
    if fault.runs_beside_other_brokers() && row.error.is_none() {
        // Its recovery time and duplicates were measured on a machine the other cells shared.
        let beside = "ran beside the other brokers' cells of this fault";
        row.note = if row.note.is_empty() {
            beside.to_string()
        } else {
            format!("{}; {beside}", row.note)
        };
    }
    row.save(out)?;
    eprintln!("   {}", row.summary());
    Ok(row)
}

/// Publishes the events at `indices`, each until the broker confirms it (a publish that failed is sent
/// again, for up to two minutes); returns how many were confirmed and how many were sent again.
async fn produce(
    broker: &Broker,
    topic: &str,
    indices: std::ops::Range<usize>,
) -> Result<(usize, usize), BoxError> {
    let producer = broker.producer();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut pending: Vec<usize> = indices.collect();
    let mut confirmed = 0;
    let mut resent = 0;
    while !pending.is_empty() {
        let results: Vec<(usize, bool)> = futures::stream::iter(pending.iter().copied())
            .map(|i| {
                let producer = producer.clone();
                async move {
                    let id = workload::event_id(i);
                    let event = Event::new(id.clone())
                        .with_id(id)
                        .with_key(workload::key(i));
                    (i, producer.publish(topic, event).await.is_ok())
                }
            })
            .buffer_unordered(128)
            .collect()
            .await;
        pending = results
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(i, _)| *i)
            .collect();
        confirmed += results.len() - pending.len();
        if !pending.is_empty() {
            if Instant::now() > deadline {
                return Err(format!("{} publishes were never confirmed", pending.len()).into());
            }
            resent += pending.len();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    Ok((confirmed, resent))
}

/// How fast the consumer works and how long its failed events wait.
/// Everything one run needs.
struct Run<'a> {
    target: &'a Target,
    fault: Fault,
    events: usize,
    outage: Duration,
    pace: Pace,
    topic: String,
    group: String,
    record: PathBuf,
    /// The consumer's inbox database, if it has one.
    inbox: Option<String>,
    logs: PathBuf,
    broker: Broker,
    namespace: Option<Namespace>,
    consumer: Option<Consumer>,
    started: usize,
    /// DLQ entries a fault switch had to take out of the broker (counted as DLQ entries).
    moved: Vec<String>,
    /// F5: what the broker and the record showed in the second half of the DLQ outage.
    outage_half: Option<OutageHalf>,
    notes: Vec<String>,
}

/// Runs `fault` on `name` and counts.
async fn cell(
    name: BrokerName,
    fault: Fault,
    settings: &Settings,
    out: &Path,
) -> Result<Row, BoxError> {
    let mut target = Target::find(name).await?;
    target.options.extend(settings.options.iter().cloned());
    let code = fault.code().to_lowercase();
    let record = out.join("records").join(format!("{name}-{code}.log"));
    let _ = std::fs::remove_file(&record);
    let broker = event_retry::connect_with(&target.url, target.harness_sdk_options()).await?;
    let inbox = effects::fresh(settings.inbox, out, &format!("{name}-{code}")).await?;
    let mut run = Run {
        target: &target,
        fault,
        events: settings.events,
        outage: settings.outage,
        pace: Pace {
            work: settings.work,
            retry_after: settings.retry_after,
        },
        topic: format!("faults-{code}-{}", now_ms() % 100_000_000),
        group: "faults".to_string(),
        record,
        inbox,
        logs: out.join("logs"),
        broker,
        namespace: None,
        consumer: None,
        started: 0,
        moved: Vec::new(),
        outage_half: None,
        notes: Vec::new(),
    };
    let row = run.go().await;
    if let Some(consumer) = &mut run.consumer {
        let _ = consumer.kill().await;
    }
    // The harness's own topics go; a failed cleanup only leaves a topic behind.
    if let Err(e) = run.broker.admin().delete(&run.topic).await {
        eprintln!("   {name} cleanup: deleting {} failed: {e}", run.topic);
    }
    row
}

impl Run<'_> {
    fn log(&self, what: &str) -> PathBuf {
        self.logs.join(format!(
            "{}-{}-{what}.log",
            self.target.name,
            self.fault.code().to_lowercase()
        ))
    }

    async fn start_consumer(&mut self) -> Result<(), BoxError> {
        self.started += 1;
        let log = self.log(&format!("consumer-{}", self.started));
        // F1 through the inbox: the first process holds one event after its commit, so the kill lands
        // between a commit and its acknowledgement and the inbox is shown at work.
        let hold = (self.fault == Fault::ConsumerKill && self.inbox.is_some() && self.started == 1)
            .then_some((self.events as f64 * AT_SHARE) as usize);
        let launch = Launch {
            target: self.target,
            topic: &self.topic,
            group: &self.group,
            record: &self.record,
            inbox: self.inbox.as_deref(),
            pace: self.pace,
            namespace: self.namespace.as_ref(),
        };
        let consumer = Consumer::start(launch, &log, hold).await?;
        self.consumer = Some(consumer);
        Ok(())
    }

    async fn go(&mut self) -> Result<Row, BoxError> {
        if let Some(url) = &self.target.declare_url {
            // Declared through another node than the consumer's, which then leads the queues.
            let leader = event_retry::connect_with(url, self.target.harness_sdk_options()).await?;
            leader
                .admin()
                .declare(&self.topic, Some(&self.group))
                .await?;
        }
        let admin = self.broker.admin();
        admin.declare(&self.topic, Some(&self.group)).await?;
        let names = admin.names(&self.topic, Some(&self.group)).await?;
        let (source, dlq) = (names.topic, names.dlq);
        let (mut produced, resent) = produce(&self.broker, &self.topic, 0..self.events).await?;
        if resent > 0 {
            self.notes
                .push(format!("{resent} publishes sent again before confirmed"));
        }
        if self.fault == Fault::NetworkCut {
            self.namespace = Some(Namespace::up(&[self.target.port()?]).await?);
        }
        self.start_consumer().await?;
        let mut reader = RecordReader::new(&self.record);
        self.wait_for_share(&mut reader).await?;

        let fault_start = now_ms();
        self.inject(&source, &dlq).await?;
        let healed = now_ms();
        let tally = reader.refresh()?;
        let during = tally.calls_between(fault_start, healed);
        let refused_during = tally
            .refusal_times
            .iter()
            .filter(|&&t| t >= fault_start && t < healed)
            .count();

        let total = self.events + PROBES;
        let (probes, _) = produce(&self.broker, &self.topic, self.events..total).await?;
        produced += probes;
        self.wait_until_accounted(&mut reader, &dlq, total).await?;
        // Late duplicates still arrive for a moment after the last event was handled.
        tokio::time::sleep(Duration::from_secs(5)).await;

        let mut consumer = self.consumer.take().ok_or("no consumer")?;
        let alive_at_end = consumer.alive();
        let clean_exit = consumer.stop().await;
        let tally = reader.refresh()?;
        let (inbox_skips, held) = (tally.inbox_skips, tally.held);
        let mut dlq_payloads = self.target.raw.dlq_payloads(&dlq).await?;
        dlq_payloads.extend(self.moved.iter().cloned());

        let counted = account(total, self.events, tally, &dlq_payloads);
        let dlq_expected = workload::dlq_expected(total);

        let mut notes = std::mem::take(&mut self.notes);
        if !self.target.options.is_empty() {
            let options: Vec<String> = self
                .target
                .options
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            notes.insert(0, format!("options {}", options.join(", ")));
        }
        if self.pace.retry_after != workload::RETRY_AFTER
            || self.pace.work != workload::DEFAULT_WORK
        {
            notes.insert(
                0,
                format!(
                    "failing events retry after {} s, {} ms of work per event",
                    self.pace.retry_after.as_secs_f64(),
                    self.pace.work.as_millis()
                ),
            );
        }
        notes.push(format!(
            "duplicates: {} extra handler calls, {} extra DLQ entries",
            counted.extra_calls, counted.extra_dlq
        ));
        notes.push(format!("{during} handler calls during the fault"));
        if self.fault == Fault::DlqOutage {
            notes.push(format!(
                "{refused_during} non-retryable events handled while the DLQ was unwritable"
            ));
        }
        let paused = self.outage_half.map(|half| {
            let (paused, words) = half.verdict(tally, fault_start);
            notes.push(words);
            paused
        });
        if !counted.misrouted.is_empty() {
            notes.push(format!(
                "{} events that should have succeeded are in the DLQ: {}",
                counted.misrouted.len(),
                first_ids(&counted.misrouted)
            ));
        }
        if !counted.lost.is_empty() {
            notes.push(format!("lost: {}", first_ids(&counted.lost)));
        }
        if !counted.refused_not_in_dlq.is_empty() {
            notes.push(format!(
                "refused but not in the DLQ: {}",
                first_ids(&counted.refused_not_in_dlq)
            ));
        }
        let side_effects = match &self.inbox {
            Some(url) => {
                let rows = effects::count(url).await?;
                let (distinct, extra) = effects::tally(&rows);
                let missing = tally
                    .by_id
                    .iter()
                    .filter(|(id, calls)| calls.oks > 0 && !rows.contains_key(*id))
                    .count();
                notes.push(format!(
                    "side effects through the inbox: {distinct} events, {extra} repeated"
                ));
                if missing > 0 {
                    notes.push(format!(
                        "{missing} events succeeded without a side effect row"
                    ));
                }
                Some((distinct, extra, missing))
            }
            None => None,
        };
        if side_effects.is_some() {
            notes.push(format!(
                "{inbox_skips} redeliveries found done by the inbox{}",
                if held > 0 {
                    " (one event held after its commit at the kill)"
                } else {
                    ""
                }
            ));
        }
        // The processes of the run proper: the draining consumer below is not one of them.
        let processes = self.started;
        let (waiting, drained) = self.left_on_broker(&source).await?;
        notes.push(format!(
            "after the stop the broker counted {waiting} of the group's messages in {source}; a fresh \
             consumer was handed {drained} events in {} s",
            DRAIN.max(self.pace.retry_after * 3).as_secs()
        ));
        if tally.pids.len() > 1 {
            notes.push(format!("{} consumer processes", tally.pids.len()));
        }
        if !self.moved.is_empty() {
            notes.push(format!(
                "{} DLQ entries taken out by the fault switch and counted",
                self.moved.len()
            ));
        }
        if !clean_exit {
            notes.push("the consumer did not exit cleanly on SIGTERM".into());
        }
        if counted.probes_missing > 0 {
            notes.push(format!(
                "{} of the {PROBES} events produced after the fault never handled",
                counted.probes_missing
            ));
        }
        // Surviving is more than a live process: the same consumer handled the events produced after
        // the fault.
        let survived = self
            .fault
            .consumer_must_survive()
            .then_some(alive_at_end && processes == 1 && counted.probes_missing == 0);
        Ok(Row {
            broker: self.target.name.to_string(),
            fault: self.fault.describe(self.outage),
            produced,
            handled: counted.handled,
            lost: counted.lost.len(),
            misrouted: counted.misrouted.len(),
            duplicates: counted.extra_calls + counted.extra_dlq,
            dlq_expected,
            dlq_actual: counted.dlq_distinct,
            dlq_copies: counted.extra_dlq,
            survived,
            paused,
            recovery_s: tally
                .first_call_since(healed)
                .map(|t| (t.saturating_sub(healed)) as f64 / 1000.0),
            side_effects: side_effects.map(|(distinct, _, _)| distinct),
            side_effect_duplicates: side_effects.map(|(_, extra, _)| extra),
            side_effects_missing: side_effects.map_or(0, |(_, _, missing)| missing),
            inbox_skips: side_effects.map(|_| inbox_skips),
            left_on_broker: Some(usize::try_from(waiting).unwrap_or(usize::MAX).max(drained)),
            note: notes.join("; "),
            error: None,
        })
    }

    /// Waits until the share of events at which the fault lands was handled.
    async fn wait_for_share(&mut self, reader: &mut RecordReader) -> Result<(), BoxError> {
        let goal = (self.events as f64 * AT_SHARE) as usize;
        let deadline = Instant::now() + Duration::from_secs(300);
        while reader.refresh()?.succeeded() < goal {
            if Instant::now() > deadline {
                return Err(format!(
                    "only {} of {goal} events handled within 300 s, before any fault",
                    reader.tally().succeeded()
                )
                .into());
            }
            if let Some(c) = &mut self.consumer
                && !c.alive()
            {
                return Err("the consumer exited before any fault".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Waits (up to 30 s) until the consumer holds an event after its commit; notes it if none came, so
    /// a kill that missed the window shows in the row (its inbox skips are then left to chance).
    async fn wait_for_held(&mut self) -> Result<(), BoxError> {
        let mut reader = RecordReader::new(&self.record);
        let deadline = Instant::now() + Duration::from_secs(30);
        while reader.refresh()?.held == 0 {
            if Instant::now() > deadline {
                self.notes
                    .push("no event was held after its commit: the kill was not timed".into());
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// What the broker still holds for the group once the consumer stopped: the source's messages as
    /// the broker's own client counts them, then every event a fresh consumer of the group is handed
    /// within [`DRAIN`] (the retry route and the delay ladder included). A real service would handle
    /// each of those again.
    async fn left_on_broker(&mut self, source: &str) -> Result<(u64, usize), BoxError> {
        let waiting = self.target.raw.waiting(source, &self.group).await?;
        let mut reader = RecordReader::new(&self.record);
        let before = reader.refresh()?.calls();
        self.start_consumer().await?;
        tokio::time::sleep(DRAIN.max(self.pace.retry_after * 3)).await;
        let mut consumer = self.consumer.take().ok_or("no consumer")?;
        if !consumer.stop().await {
            self.notes
                .push("the draining consumer did not exit cleanly on SIGTERM".into());
        }
        let after = reader.refresh()?.calls();
        Ok((waiting, after - before))
    }

    /// Waits until every event is handled or in the DLQ, nothing moved for a minute, or five minutes
    /// passed since the fault ended.
    async fn wait_until_accounted(
        &mut self,
        reader: &mut RecordReader,
        dlq: &str,
        total: usize,
    ) -> Result<(), BoxError> {
        let deadline = Instant::now() + AFTER_FAULT;
        let dlq_share = workload::dlq_expected(total);
        let mut last_calls = 0;
        let mut last_move = Instant::now();
        let mut last_dlq_read = Instant::now() - Duration::from_secs(60);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let tally = reader.refresh()?;
            if tally.calls() != last_calls {
                last_calls = tally.calls();
                last_move = Instant::now();
            }
            let succeeded = tally.succeeded();
            if succeeded + dlq_share >= total && last_dlq_read.elapsed() >= Duration::from_secs(3) {
                last_dlq_read = Instant::now();
                let mut in_dlq = self.target.raw.dlq_payloads(dlq).await?;
                in_dlq.extend(self.moved.iter().cloned());
                let accounted = account(total, self.events, reader.tally(), &in_dlq)
                    .lost
                    .is_empty();
                if accounted {
                    return Ok(());
                }
            }
            if last_move.elapsed() > QUIET {
                self.notes
                    .push("stopped waiting: no handler call for 60 s".into());
                return Ok(());
            }
            if Instant::now() > deadline {
                self.notes
                    .push("stopped waiting: 300 s after the fault".into());
                return Ok(());
            }
        }
    }
}
