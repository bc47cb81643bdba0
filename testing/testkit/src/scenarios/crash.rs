//! Scenario 8 with a real crash: a consumer in a child process is killed with SIGKILL while handlers are
//! running and retries wait in the broker, and a new consumer of its group must finish every event.
//!
//! The child is the adapter's own test binary, started again with `CHILD_ENV` set: `suite::run` sees
//! the variable before anything else and runs `child_main` instead of the tests. The child connects to
//! the same broker through the adapter's own connect function, consumes the topic in the named group,
//! and reports every handler call on its standard output (`call <id> <attempt> <wall ms>`, `ok <id>`,
//! and `stats <retries scheduled>`), so the parent knows what was in flight and what succeeded before it
//! pulls the plug. Counts: lost (an event that never succeeded anywhere) must be 0; duplicates (a success
//! repeated, because an acknowledgement died with the child) are counted and reported.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_retry_core::event::Event;
use event_retry_core::time::Timestamp;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::support::*;
use super::{ScenarioResult, Verdict};
use crate::fixture::Fixture;
use crate::probe::{Act, Probe, ensure, wait_for};
use crate::suite::Adapter;

/// The variable that makes a test binary a crash child: `<topic> <group> <delay ms>`.
pub(crate) const CHILD_ENV: &str = "EVENT_RETRY_CONFORMANCE_CHILD";

const HELD: usize = 3;
const RETRIED: usize = 3;
const PLAIN: usize = 14;

/// What every consumer of the scenario does: `held-*` never returns in the child (and succeeds
/// afterwards), `retry-*` fails once (deferred), the rest succeed.
fn script(e: &Event, hang: bool) -> Act {
    let id = e.id().unwrap_or_default();
    if id.starts_with("held-") && hang {
        Act::Hang
    } else if id.starts_with("retry-") && e.metadata().attempts == 0 {
        deferred("fails once")
    } else {
        Act::Ok
    }
}

/// The child's side: consume, report, and wait to be killed.
pub(crate) fn child_main(adapter: Adapter, spec: &str) -> ! {
    let result = (|| -> Result<(), String> {
        let mut parts = spec.split(' ');
        let (Some(topic), Some(group), Some(delay)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "{CHILD_ENV}={spec:?}: want `<topic> <group> <delay ms>`"
            ));
        };
        let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let url = match adapter.url_env {
                Some(env) => crate::env::url(env).ok_or(format!("{env} is not set"))?,
                None => String::new(),
            };
            let f = Arc::new((adapter.connect)(url).await?);
            let probe = Probe::new(|e, _| script(e, true));
            let handler = ChildHandler(probe.handler());
            let c = builder(&f, topic, "doomed")
                .group(group)
                .policy(policy(&format!("{delay}ms x3")))
                .concurrency(8);
            let c = start_with(&f, c, handler).await?;
            loop {
                println!("stats {}", c.stats().retries_scheduled);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    })();
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("crash child: {e}");
            std::process::exit(3)
        }
    }
}

/// The child's handler: the scenario's script, with every call and success printed, a line each
/// (standard output is line-buffered, so the parent reads each line as soon as it is written).
struct ChildHandler(crate::probe::ProbeHandler);

#[async_trait::async_trait]
impl event_retry_core::runtime::Handler for ChildHandler {
    async fn handle(
        &self,
        event: &Event,
        ctx: &event_retry_core::runtime::Context,
    ) -> Result<(), event_retry_core::classify::HandlerError> {
        println!(
            "call {} {} {}",
            ctx.event_id,
            ctx.attempt,
            Timestamp::now().as_millis()
        );
        let result = self.0.handle(event, ctx).await;
        if result.is_ok() {
            println!("ok {}", ctx.event_id);
        }
        result
    }
}

/// Publishes the scenario's events to `topic`. With a batch handler the failing-once events go first,
/// until `scheduled` says their retries are scheduled, and the rest after them: a batch settles when its
/// call returns, so a hanging event in the same batch would hold their retries back.
async fn publish_events(
    f: &Arc<Fixture>,
    topic: &str,
    ids: &[String],
    scheduled: impl Fn() -> bool,
) -> Result<(), String> {
    let (first, rest): (Vec<&String>, Vec<&String>) = ids
        .iter()
        .partition(|id| f.batch_handler() && id.starts_with("retry-"));
    for id in &first {
        publish(f, topic, Event::new((*id).clone()).with_id(id.as_str())).await?;
    }
    if !first.is_empty() {
        wait_for(
            "the failing-once events' retries scheduled, before the rest is published",
            patience(f, 30),
            scheduled,
        )
        .await?;
    }
    for id in &rest {
        publish(f, topic, Event::new((*id).clone()).with_id(id.as_str())).await?;
    }
    Ok(())
}

/// The log, whole even if a reader panicked while holding it.
fn lock(log: &Mutex<ChildLog>) -> std::sync::MutexGuard<'_, ChildLog> {
    log.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the parent read from the child.
#[derive(Default)]
struct ChildLog {
    /// (id, attempt, wall ms) of every call.
    calls: Vec<(String, u32, u64)>,
    /// Ids that succeeded in the child.
    ok: Vec<String>,
    /// Retries the child's runtime had scheduled (durably, through the broker), at its last report.
    scheduled: u64,
}

/// Scenario 8: a consumer process is killed with SIGKILL while its handlers run and its retries wait in
/// the broker; a new consumer of the group handles every event to success: none lost, duplicates counted.
/// Without a child process to kill (the in-process broker dies with its process), the consumer is
/// aborted instead, and the report says so.
pub async fn crash_mid_handle_redelivered(f: Arc<Fixture>) -> ScenarioResult {
    let topic = f.fresh_topic("s08").await.map_err(|e| e.to_string())?;
    let group = "g08";
    f.broker()
        .admin()
        .declare(&topic, Some(group))
        .await
        .map_err(|e| format!("declare the group: {e}"))?;
    let u = unit(&f);
    let delay = u * 4;
    let mut ids = Vec::new();
    ids.extend((1..=HELD).map(|i| format!("held-{i}")));
    ids.extend((1..=RETRIED).map(|i| format!("retry-{i}")));
    ids.extend((1..=PLAIN).map(|i| format!("plain-{i:02}")));
    let log = Arc::new(Mutex::new(ChildLog::default()));

    let (crashed_how, process_killed) = match f.child_exe() {
        Some((exe, env)) => {
            let mut child = tokio::process::Command::new(exe)
                .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .env(CHILD_ENV, format!("{topic} {group} {}", delay.as_millis()))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("start the child consumer: {e}"))?;
            let stdout = child.stdout.take().ok_or("the child has no stdout")?;
            let reader_log = log.clone();
            let reader = tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut words = line.split(' ');
                    let mut log = lock(&reader_log);
                    match (words.next(), words.next(), words.next(), words.next()) {
                        (Some("call"), Some(id), Some(attempt), Some(wall)) => log.calls.push((
                            id.to_string(),
                            attempt.parse().unwrap_or(0),
                            wall.parse().unwrap_or(0),
                        )),
                        (Some("ok"), Some(id), None, None) => log.ok.push(id.to_string()),
                        (Some("stats"), Some(n), None, None) => {
                            log.scheduled = n.parse().unwrap_or(0)
                        }
                        _ => {}
                    }
                }
            });
            publish_events(&f, &topic, &ids, || lock(&log).scheduled >= RETRIED as u64).await?;
            let ready = wait_for(
                "the child holding 3 events in its handler with 3 retries scheduled",
                patience(&f, 30),
                || {
                    let log = lock(&log);
                    let held = (1..=HELD)
                        .filter(|i| log.calls.iter().any(|c| c.0 == format!("held-{i}")))
                        .count();
                    held == HELD && log.scheduled >= RETRIED as u64
                },
            )
            .await;
            if let Err(e) = ready {
                let _ = child.start_kill();
                return Err(e);
            }
            child
                .start_kill()
                .map_err(|e| format!("kill the child: {e}"))?;
            let status = child.wait().await.map_err(|e| e.to_string())?;
            let _ = reader.await;
            ensure(!status.success(), || {
                format!("the child was not killed: it exited with {status}")
            })?;
            ("the consumer process was killed with SIGKILL", true)
        }
        None => {
            // The in-process broker lives in this process: the consumer is aborted instead.
            let probe = Probe::new(|e, _| script(e, true));
            let c = start(
                &f,
                builder(&f, &topic, "doomed")
                    .group(group)
                    .policy(policy(&format!("{}ms x3", delay.as_millis())))
                    .concurrency(8),
                &probe,
            )
            .await?;
            publish_events(&f, &topic, &ids, || {
                c.stats().retries_scheduled >= RETRIED as u64
            })
            .await?;
            wait_for(
                "3 events in the handler with 3 retries scheduled",
                patience(&f, 30),
                || {
                    probe
                        .calls()
                        .iter()
                        .filter(|c| c.id.starts_with("held-"))
                        .count()
                        == HELD
                        && c.stats().retries_scheduled >= RETRIED as u64
                },
            )
            .await?;
            let scheduled = c.stats().retries_scheduled;
            // Stopped first, so nothing succeeds between the snapshot and the crash.
            c.abort().await;
            {
                let mut log = lock(&log);
                for call in probe.calls() {
                    log.calls
                        .push((call.id.clone(), call.attempt, call.wall.as_millis()));
                }
                log.ok = probe.successes();
                log.scheduled = scheduled;
            }
            (
                "in-process broker: the consumer was aborted, not killed",
                false,
            )
        }
    };
    let (in_flight, scheduled, child_ok) = {
        let log = lock(&log);
        let started: Vec<&str> = log.calls.iter().map(|c| c.0.as_str()).collect();
        let in_flight = ids
            .iter()
            .filter(|id| {
                id.starts_with("held-") && started.contains(&id.as_str()) && !log.ok.contains(id)
            })
            .count();
        (in_flight, log.scheduled, log.ok.clone())
    };

    // The survivor: the same group, the same script (but nothing hangs).
    let survivor = Probe::new(|e, _| script(e, false));
    let c2 = start(
        &f,
        builder(&f, &topic, "survivor")
            .group(group)
            .policy(policy(&format!("{}ms x3", delay.as_millis()))),
        &survivor,
    )
    .await?;
    // Long enough for the broker to notice the dead consumer (a Kafka session timeout, an SQS
    // visibility timeout) and hand its work on.
    let patience = patience(&f, 60) + Duration::from_secs(60);
    let done = wait_for("every event succeeded somewhere", patience, || {
        let survived = survivor.successes();
        ids.iter()
            .all(|id| child_ok.contains(id) || survived.contains(id))
    })
    .await;
    let survived = survivor.successes();
    let lost: Vec<&String> = ids
        .iter()
        .filter(|id| !child_ok.contains(id) && !survived.contains(id))
        .collect();
    ensure(done.is_ok() && lost.is_empty(), || {
        format!("lost {} events after the crash: {lost:?}", lost.len())
    })?;
    // The retries waited in the broker, and came back as retries, never early. A redelivered original
    // (a duplicate) fails again in the survivor and brings a retry of its own a delay later: wait for
    // those before counting.
    let killed: HashMap<String, Vec<u32>> = (1..=RETRIED)
        .map(|i| {
            let id = format!("retry-{i}");
            let attempts = lock(&log)
                .calls
                .iter()
                .filter(|c| c.0 == id)
                .map(|c| c.1)
                .collect();
            (id, attempts)
        })
        .collect();
    let _ = wait_for(
        "the killed consumer's retries run in the survivor",
        unit(&f) * 20 + Duration::from_secs(15) + delay * 2,
        || {
            killed.iter().all(|(id, attempts)| {
                let survived: Vec<u32> = survivor.calls_of(id).iter().map(|c| c.attempt).collect();
                retry_survived(attempts, &survived)
            })
        },
    )
    .await;
    check_retries(&lock(&log), &survivor, delay)?;
    let mut successes: HashMap<&str, usize> = HashMap::new();
    for id in child_ok.iter().chain(survived.iter()) {
        *successes.entry(id.as_str()).or_default() += 1;
    }
    let duplicates: usize = successes.values().map(|n| n.saturating_sub(1)).sum();
    ensure(dlq(&f, &topic).await?.is_empty(), || "DLQ not empty".into())?;
    finish(&f, &topic, vec![c2]).await?;
    let note = format!(
        "{crashed_how} with {in_flight} events in its handler and {scheduled} retries waiting in the \
         broker: lost 0 of {}, {duplicates} duplicate successes",
        ids.len()
    );
    // An abort drops the consumer's tasks but not its process: what a kill would lose (buffers,
    // unflushed acknowledgements, sockets the kernel closes) was not exercised. The cell says so in
    // words that do not change from run to run (the page showing it is checked against each run).
    Ok(if process_killed {
        Verdict::Pass(Some(note))
    } else {
        Verdict::Partial(
            "the consumer was aborted, not killed: the in-process broker lives in the test's process"
                .to_string(),
        )
    })
}

/// Each `retry-*` event failed once in the first consumer and its retry survived the crash in the
/// broker ([`retry_survived`]), running again no sooner than `delay` after that failure (wall clock).
fn check_retries(log: &ChildLog, survivor: &Probe, delay: Duration) -> Result<(), String> {
    for i in 1..=RETRIED {
        let id = format!("retry-{i}");
        let child: Vec<u32> = log
            .calls
            .iter()
            .filter(|c| c.0 == id)
            .map(|c| c.1)
            .collect();
        let survived: Vec<u32> = survivor.calls_of(&id).iter().map(|c| c.attempt).collect();
        ensure(retry_survived(&child, &survived), || {
            format!(
                "{id}'s retry did not survive the crash: attempts in the killed consumer {child:?}, \
                 in the survivor {survived:?} (every retry the survivor ran is explained by its own \
                 failures of a redelivered original)"
            )
        })?;
        let first = log
            .calls
            .iter()
            .find(|c| c.0 == id && c.1 == 1)
            .map(|c| c.2)
            .ok_or_else(|| format!("{id} never failed in the first consumer"))?;
        let again = log
            .calls
            .iter()
            .filter(|c| c.0 == id && c.1 >= 2)
            .map(|c| c.2)
            .chain(
                survivor
                    .calls_of(&id)
                    .iter()
                    .filter(|c| c.attempt >= 2)
                    .map(|c| c.wall.as_millis()),
            )
            .min()
            .ok_or_else(|| {
                format!("{id}'s retry did not survive the crash (no call with attempt 2)")
            })?;
        ensure(again >= first + delay.as_millis() as u64, || {
            format!(
                "{id}'s retry ran {} ms after its failure, before its delay of {} ms",
                again.saturating_sub(first),
                delay.as_millis()
            )
        })?;
    }
    Ok(())
}

/// Whether the retry the killed consumer scheduled reached the survivor, from the attempt numbers of
/// the event's calls in each. The script fails an event's first attempt only, so each first attempt the
/// survivor ran (a redelivered original: a duplicate, not a loss) schedules exactly one retry of its
/// own; the killed consumer's retry is there if it ran in the killed consumer itself, or if the
/// survivor ran more retries than its own first attempts explain. An original redelivered while its
/// retry was lost shows as `[1, 2]` in the survivor and is caught; any call of attempt 2 alone was not.
fn retry_survived(killed: &[u32], survivor: &[u32]) -> bool {
    let ran_in_killed = killed.iter().any(|&a| a >= 2);
    let firsts = survivor.iter().filter(|&&a| a == 1).count();
    let retries = survivor.iter().filter(|&&a| a >= 2).count();
    ran_in_killed || retries > firsts
}

#[cfg(test)]
mod tests {
    use super::retry_survived;

    #[test]
    fn a_lost_retry_is_told_from_a_duplicate() {
        // The retry came back in the survivor.
        assert!(retry_survived(&[1], &[2]));
        // The retry came back and the original was redelivered too (a duplicate): both ran.
        assert!(retry_survived(&[1], &[1, 2, 2]));
        assert!(retry_survived(&[1], &[2, 1, 2]));
        // The retry ran before the kill.
        assert!(retry_survived(&[1, 2], &[]));
        // The retry was lost and the original redelivered: the survivor's retry is its own.
        assert!(!retry_survived(&[1], &[1, 2]));
        // Nothing came back at all.
        assert!(!retry_survived(&[1], &[]));
    }
}
