//! `retryctl dlq list|show|replay|purge` against every real broker the test command starts.
//!
//! For each broker (`RETRY_TEST_KAFKA`, `RETRY_TEST_AMQP`, `RETRY_TEST_SQS`, `RETRY_TEST_PULSAR`): three
//! events are dead-lettered by a consumer whose handler refuses them; then the CLI, exactly as an
//! operator runs it, lists them, shows one, replays one (which a consumer of the topic then handles, with
//! its replay count raised), refuses an unconfirmed purge, purges the rest, and lists an empty DLQ. What
//! the DLQ holds after each step is read back through the library, not from the CLI's own words. A broker
//! that is not configured is skipped loudly, or fails when `RETRY_TEST_REQUIRE` names it.

use std::time::Duration;

use event_retry::{Broker, Context, Event, HandlerError, handler_fn};
use libtest_mimic::Arguments;
use retryctl::Cli;
use test_support::broker::{Test, runtime};

fn main() {
    let args = Arguments::from_args();
    let cases: [(&str, &str); 4] = [
        ("kafka", "RETRY_TEST_KAFKA"),
        ("rabbitmq", "RETRY_TEST_AMQP"),
        ("sqs", "RETRY_TEST_SQS"),
        ("pulsar", "RETRY_TEST_PULSAR"),
    ];
    let mut trials = Vec::new();
    for (broker, env) in cases {
        let test: Test = dlq_commands;
        let name: &'static str = Box::leak(format!("{broker}::dlq_commands").into_boxed_str());
        trials.extend(test_support::broker::trials(broker, env, &[(name, test)]));
    }
    libtest_mimic::run(&args, trials).exit();
}

/// `base` followed by `rest`.
fn cmd<'a>(base: &[&'a str], rest: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(rest).copied().collect()
}

/// Runs `retryctl` with `args`; returns its output, or its error and exit code.
async fn retryctl(args: &[&str]) -> Result<String, (String, u8)> {
    let cli = <Cli as clap::Parser>::try_parse_from(
        std::iter::once("retryctl").chain(args.iter().copied()),
    )
    .map_err(|e| (e.to_string(), 2))?;
    let mut out = Vec::new();
    retryctl::run(cli, &mut out)
        .await
        .map_err(|e| (e.to_string(), e.exit_code()))?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

async fn entries(broker: &Broker, topic: &str) -> Result<Vec<String>, String> {
    Ok(broker
        .dead_letters()
        .list(topic, &event_retry::DlqFilter::all())
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|e| e.id)
        .collect())
}

fn dlq_commands(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        let broker = event_retry::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("retryctl-{}", uuid::Uuid::new_v4().simple());
        broker
            .admin()
            .declare(&topic, None)
            .await
            .map_err(|e| e.to_string())?;
        let refusing = broker
            .consumer(&topic)
            .start(handler_fn(|_e: Event, _c: Context| async {
                Err(HandlerError::non_retryable("refused by the test"))
            }))
            .await
            .map_err(|e| e.to_string())?;
        for i in 0..3 {
            broker
                .producer()
                .publish(
                    &topic,
                    Event::new(format!("payload-{i}")).with_id(format!("e{i}")),
                )
                .await
                .map_err(|e| e.to_string())?;
        }
        let dead = tokio::time::timeout(
            Duration::from_secs(60),
            refusing.wait_until(|s| s.dead_lettered >= 3),
        )
        .await
        .map_err(|_| format!("3 events not dead-lettered: {:?}", refusing.stats()))?;
        refusing.shutdown().await.map_err(|e| e.to_string())?;
        if dead.dead_lettered != 3 {
            return Err(format!("{dead:?}"));
        }
        let base = ["dlq", "--url", url.as_str(), "--topic", topic.as_str()];

        let listed = retryctl(&cmd(&base, &["list"])).await.map_err(|e| e.0)?;
        if !listed.starts_with(&format!("3 dead letters from {topic}")) {
            return Err(format!("list said:\n{listed}"));
        }
        let ids = entries(&broker, &topic).await?;
        if ids.len() != 3 || !ids.iter().all(|id| listed.contains(id.as_str())) {
            return Err(format!("list does not name the entries {ids:?}:\n{listed}"));
        }

        let shown = retryctl(&cmd(&base, &["show", &ids[0]]))
            .await
            .map_err(|e| e.0)?;
        if !(shown.contains("dead              non_retryable")
            && shown.contains("last error        refused by the test")
            && shown.contains("payload-")
            && !shown.contains("Some(")
            && !shown.contains("x-retry-"))
        {
            return Err(format!("show said:\n{shown}"));
        }
        // The same entry for a script: one JSON document with the metadata in fields.
        let json = retryctl(&cmd(&base, &["show", &ids[0], "--json"]))
            .await
            .map_err(|e| e.0)?;
        let doc: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| format!("show --json: {e}:\n{json}"))?;
        if doc["reason"] != "non_retryable" || doc["last_error"] != "refused by the test" {
            return Err(format!("show --json said:\n{json}"));
        }

        let replayed = retryctl(&cmd(&base, &["replay", "--id", &ids[0]]))
            .await
            .map_err(|e| e.0)?;
        if !replayed.contains("replayed 1 ") {
            return Err(format!("replay said:\n{replayed}"));
        }
        let left = entries(&broker, &topic).await?;
        if left.len() != 2 || left.contains(&ids[0]) {
            return Err(format!("after replaying {}: {left:?}", ids[0]));
        }
        // The replayed event is back at its origin: a consumer of the topic handles it, replayed once.
        let replays = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = replays.clone();
        let accepting = broker
            .consumer(&topic)
            .start(handler_fn(move |_e: Event, ctx: Context| {
                let seen = seen.clone();
                async move {
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(ctx.replay_count);
                    Ok(())
                }
            }))
            .await
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(
            Duration::from_secs(60),
            accepting.wait_until(|s| s.succeeded >= 1),
        )
        .await
        .map_err(|_| {
            format!(
                "the replayed event was not handled: {:?}",
                accepting.stats()
            )
        })?;
        accepting.shutdown().await.map_err(|e| e.to_string())?;
        let replays = replays.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if replays != [1] {
            return Err(format!(
                "replay counts seen by the handler: {replays:?}, want [1]"
            ));
        }

        match retryctl(&cmd(&base, &["purge", "--all"])).await {
            Err((message, 2)) if message.contains("would remove 2") => {}
            other => return Err(format!("an unconfirmed purge: {other:?}")),
        }
        if entries(&broker, &topic).await?.len() != 2 {
            return Err("the unconfirmed purge removed entries".into());
        }
        let purged = retryctl(&cmd(&base, &["purge", "--all", "--yes"]))
            .await
            .map_err(|e| e.0)?;
        if !purged.contains("purged 2") {
            return Err(format!("purge said:\n{purged}"));
        }
        let empty = retryctl(&cmd(&base, &["list"])).await.map_err(|e| e.0)?;
        if !empty.starts_with("0 dead letters") || !entries(&broker, &topic).await?.is_empty() {
            return Err(format!("after the purge, list said:\n{empty}"));
        }
        let _ = broker.admin().delete(&topic).await;
        Ok(())
    })
}
