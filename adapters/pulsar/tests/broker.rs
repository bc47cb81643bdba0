//! Tests against the real broker beyond the conformance suite:
//!
//! * two consumer groups on one topic retry on their own (each group has its own retry topic), and a
//!   dead letter replays to the group that dead-lettered it;
//! * a dead letter written to a group while an ordered (Key_Shared) consumer holds it, without the admin
//!   API, is written at once;
//! * a Pulsar restart (stop + start through the project's scripts, on the same data) while retries wait
//!   in the retry topic: the client reconnects, and every retry runs once, no earlier than its delay;
//! * declaring a topic for a group makes the group's subscription on its retry topic (read back from the
//!   admin API);
//! * with the admin API known (`RETRY_TEST_PULSAR_ADMIN`), the adapter reads the broker's delayed-delivery
//!   settings and a namespace's policy: a retry policy beyond the namespace's longest delay, or any delay
//!   where delayed delivery is off, is refused at start;
//! * a fresh transport on a topic whose default group and DLQ hold 2,500 messages each publishes,
//!   finishes a DLQ operation that removed one entry (the DLQ then lists every other entry, each once)
//!   and shuts a slow consumer down, each within 10 s, though the client's queue is full each time.
//!
//! They run when `RETRY_TEST_PULSAR` names a broker started by `scripts/brokers`; otherwise they are
//! listed as ignored with the reason, and fail when `RETRY_TEST_REQUIRE` names pulsar.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_retry_core::adapter::Transport;
use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{Context, ParkedAfterDead, handler_fn};
use event_retry_pulsar::{PulsarConfig, PulsarTransport};
use libtest_mimic::Arguments;
use test_support::restart::{Waits, delayed_retries_survive_restart};

const EVENTS: usize = 20;
const DELAY: Duration = Duration::from_secs(20);

fn main() {
    let mut args = Arguments::from_args();
    // The restart would disturb the other test.
    args.test_threads = Some(1);
    let tests = test_support::named_tests![
        a_fresh_transport_starts_on_a_topic_with_thousands_waiting,
        declaring_a_group_makes_its_subscription_on_its_retry_topic,
        a_batch_handler_gets_more_than_one_held_event_per_call,
        groups_retry_on_their_own,
        a_dead_letter_is_written_while_an_ordered_consumer_holds_its_group,
        a_bare_url_reads_the_brokers_tick_from_its_admin_api,
        delays_beyond_the_brokers_limit_are_refused,
        restart_keeps_delayed_retries,
    ];
    let trials = test_support::broker::trials("pulsar", "RETRY_TEST_PULSAR", &tests);
    libtest_mimic::run(&args, trials).exit();
}

/// A transport to `url` with the tests' [`config`].
async fn connect(url: &str) -> Result<PulsarTransport, String> {
    PulsarTransport::connect_with(url, config())
        .await
        .map_err(|e| e.to_string())
}

fn config() -> PulsarConfig {
    PulsarConfig {
        tick: Duration::from_millis(100),
        strict_deliver_at: true,
        ..PulsarConfig::default()
    }
}

/// Two consumer groups on one topic: one fails every event once and retries it, the other succeeds at
/// once. Each group handles each event as often as its own policy says, never the other group's
/// retries; a dead letter of one group replays to that group only.
fn groups_retry_on_their_own(url: String) -> Result<(), String> {
    let rt = test_support::broker::runtime()?;
    rt.block_on(async move {
        let transport = connect(&url).await?;
        let topic = format!("groups-{}", uuid::Uuid::new_v4().simple());
        let mut handles = Vec::new();
        let mut counts = Vec::new();
        for (group, flaky) in [("billing", true), ("shipping", false)] {
            let calls: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
            let seen = calls.clone();
            let handler = handler_fn(move |event: Event, _ctx: Context| {
                let seen = seen.clone();
                async move {
                    let id = event.id().unwrap_or_default().to_string();
                    let n = {
                        let mut calls = seen.lock().unwrap_or_else(|p| p.into_inner());
                        let n = calls.entry(id.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    match (flaky, id.as_str(), n) {
                        (true, "dead", _) => Err(HandlerError::non_retryable("bad")),
                        (true, _, 1) => Err(HandlerError::deferred("once")),
                        _ => Ok(()),
                    }
                }
            });
            let consumer = Broker::new(transport.clone()).consumer(&topic)
                .group(group)
                .policy(RetryPolicy::parse("500ms x2").map_err(|e| e.to_string())?)
                .build()
                .map_err(|e| e.to_string())?
                .start(handler)
                .await
                .map_err(|e| e.to_string())?;
            handles.push(consumer);
            counts.push(calls);
        }
        for id in ["a", "b", "c", "dead"] {
            transport
                .publish(&topic, &Event::new(id).with_id(id))
                .await
                .map_err(|e| e.to_string())?;
        }
        event_retry_testkit::probe::wait_for(
            "billing's 3 successes and dead letter, shipping's 4 successes",
            Duration::from_secs(30),
            || {
                handles[0].stats().succeeded >= 3
                    && handles[1].stats().succeeded >= 4
                    && handles[0].stats().dead_lettered >= 1
            },
        )
        .await
        .map_err(|e| format!("{e}: billing {:?}, shipping {:?}", handles[0].stats(), handles[1].stats()))?;
        let replayed = Broker::new(transport.clone())
            .dead_letters()
            .replay(&topic, &event_retry_core::dlq::DlqFilter::all())
            .await
            .map_err(|e| e.to_string())?;
        if replayed.replayed != 1 {
            return Err(format!("replayed {}", replayed.replayed));
        }
        // The replay reaches billing (its second dead letter: "dead" fails for good again); then 2 s
        // more for any call that should not come (shipping's of the replay, a second replay).
        event_retry_testkit::probe::wait_for(
            "the replayed dead letter to reach billing",
            Duration::from_secs(30),
            || handles[0].stats().dead_lettered >= 2,
        )
        .await
        .map_err(|e| format!("{e}: billing {:?}", handles[0].stats()))?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let billing = counts[0].lock().unwrap_or_else(|p| p.into_inner()).clone();
        let shipping = counts[1].lock().unwrap_or_else(|p| p.into_inner()).clone();
        let want_billing: HashMap<String, u32> =
            [("a", 2), ("b", 2), ("c", 2), ("dead", 2)].map(|(k, v)| (k.to_string(), v)).into();
        let want_shipping: HashMap<String, u32> =
            [("a", 1), ("b", 1), ("c", 1), ("dead", 1)].map(|(k, v)| (k.to_string(), v)).into();
        if billing != want_billing || shipping != want_shipping {
            return Err(format!(
                "calls per event: billing {billing:?} (want one retry each, and the replay), shipping {shipping:?} (want one each)"
            ));
        }
        for h in handles {
            h.shutdown().await.map_err(|e| e.to_string())?;
        }
        Ok(())
    })
}

/// Writing a dead letter (what a DLQ migration does) makes sure the group's retry topic keeps its
/// subscription. Without an admin URL that is a consumer subscribing and leaving — refused while an
/// ordered consumer holds the subscription as Key_Shared. The write must go on within seconds.
fn a_dead_letter_is_written_while_an_ordered_consumer_holds_its_group(
    url: String,
) -> Result<(), String> {
    test_support::broker::runtime()?.block_on(async move {
        let transport = connect(&url).await?;
        let topic = format!("ordered-dlq-{}", uuid::Uuid::new_v4().simple());
        let handler = handler_fn(|_event: Event, _ctx: Context| async move { Ok(()) });
        let consumer = Broker::new(transport.clone())
            .consumer(&topic)
            .group("ordered")
            .policy(RetryPolicy::parse("500ms x1").map_err(|e| e.to_string())?)
            .ordered_by_key(ParkedAfterDead::Run)
            .start(handler)
            .await
            .map_err(|e| e.to_string())?;
        let event = Event::new("moved").with_id("moved").with_key("k");
        let written = tokio::time::timeout(
            Duration::from_secs(30),
            transport.write_dead_letter(&topic, Some("ordered"), &event),
        )
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("writing the dead letter failed: {e}")),
            Err(_) => return Err("writing the dead letter took over 30 s".to_string()),
        }
        let entries = Broker::new(transport.clone())
            .dead_letters()
            .list(&topic, &event_retry_core::dlq::DlqFilter::all())
            .await
            .map_err(|e| e.to_string())?;
        let ids: Vec<_> = entries
            .iter()
            .map(|e| e.event.id().unwrap_or_default().to_string())
            .collect();
        if ids != ["moved"] {
            return Err(format!("the DLQ holds {ids:?}, want [\"moved\"]"));
        }
        consumer.shutdown().await.map_err(|e| e.to_string())
    })
}

fn restart_keeps_delayed_retries(url: String) -> Result<(), String> {
    test_support::broker::runtime()?.block_on(async move {
        let transport = connect(&url).await?;
        let topic = format!("restart-{}", uuid::Uuid::new_v4().simple());
        let waits = Waits {
            scheduled: Duration::from_secs(30),
            after_due: Duration::from_secs(120),
        };
        delayed_retries_survive_restart(
            &Broker::new(transport),
            "pulsar",
            &topic,
            EVENTS,
            DELAY,
            waits,
        )
        .await
        .map(drop)
    })
}

/// Declaring a topic for a consumer group makes the group's subscription on the group's retry topic,
/// read back from the broker's admin API — through a consumer that subscribes and leaves (no admin URL)
/// and through the admin API (`admin_url` set) — so a retry sent there is kept from then on.
fn declaring_a_group_makes_its_subscription_on_its_retry_topic(url: String) -> Result<(), String> {
    let Some(admin) = test_support::broker::url("RETRY_TEST_PULSAR_ADMIN") else {
        return Err("RETRY_TEST_PULSAR_ADMIN is not set (scripts/brokers sets it)".into());
    };
    test_support::broker::runtime()?.block_on(async move {
        for admin_url in [None, Some(admin.clone())] {
            let via = if admin_url.is_some() { "the admin API" } else { "a consumer" };
            let transport = PulsarTransport::connect_with(
                &url,
                PulsarConfig {
                    admin_url,
                    ..config()
                },
            )
            .await
            .map_err(|e| e.to_string())?;
            let topic = format!("declared-{}", uuid::Uuid::new_v4().simple());
            transport
                .admin()
                .declare(&topic, Some("billing"))
                .await
                .map_err(|e| format!("declaring through {via}: {e}"))?;
            let retry = transport.config().retry_topic(&topic, "billing");
            let path = retry.replacen("://", "/", 1);
            let listed = admin_call("GET", &format!("{admin}/admin/v2/{path}/subscriptions"), None)
                .map_err(|e| format!("declared through {via}: {e}"))?;
            let subscriptions: Vec<String> =
                serde_json::from_str(&listed).map_err(|e| format!("{listed:?}: {e}"))?;
            if subscriptions != ["billing"] {
                return Err(format!(
                    "declared through {via}: {retry} has the subscriptions {subscriptions:?}, want [\"billing\"]"
                ));
            }
        }
        Ok(())
    })
}

/// Calls the admin API; `body` as JSON when given. Its answer's body.
fn admin_call(method: &str, url: &str, body: Option<&str>) -> Result<String, String> {
    let mut args = vec!["-sS", "--fail", "--max-time", "30", "-X", method];
    if let Some(body) = body {
        args.extend(["-H", "Content-Type: application/json", "-d", body]);
    }
    args.push(url);
    let out = std::process::Command::new("curl")
        .args(&args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{method} {url}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A bare service URL (no `admin_url`): the adapter reads the broker's delayed-delivery settings from the
/// admin API the URL implies (the same host, port 8080) — the 100 ms strict tick `scripts/brokers`
/// configures — instead of assuming a 1 s tick that may dispatch early.
fn a_bare_url_reads_the_brokers_tick_from_its_admin_api(url: String) -> Result<(), String> {
    let rt = test_support::broker::runtime()?;
    rt.block_on(async {
        let transport = PulsarTransport::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let config = transport.config();
        if config.admin_url.is_some() {
            return Err("a bare URL set admin_url".into());
        }
        match (config.tick, config.strict_deliver_at) {
            (tick, true) if tick == Duration::from_millis(100) => Ok(()),
            (tick, strict) => Err(format!(
                "with {url} the adapter assumes a {tick:?} tick, strict {strict}; the broker ticks \
                 every 100 ms, strictly"
            )),
        }
    })
}

/// A namespace of its own whose policy limits delays to one minute, then turns delayed delivery off:
/// the adapter, reading the policy through the admin API, refuses what the broker would not honour.
fn delays_beyond_the_brokers_limit_are_refused(url: String) -> Result<(), String> {
    let Some(admin) = test_support::broker::url("RETRY_TEST_PULSAR_ADMIN") else {
        return Err("RETRY_TEST_PULSAR_ADMIN is not set (scripts/brokers sets it)".into());
    };
    let rt = test_support::broker::runtime()?;
    let namespace = format!("public/limited-{}", uuid::Uuid::new_v4().simple());
    let ns_url = format!("{admin}/admin/v2/namespaces/{namespace}");
    admin_call("PUT", &ns_url, None)?;
    let result = rt.block_on(async {
        let refused = |policy: &'static str| {
            let (url, admin, namespace) = (url.clone(), admin.clone(), namespace.clone());
            async move {
                let config = PulsarConfig {
                    namespace,
                    admin_url: Some(admin),
                    ..PulsarConfig::default()
                };
                let transport = PulsarTransport::connect_with(&url, config)
                    .await
                    .map_err(|e| e.to_string())?;
                let built = Broker::new(transport)
                    .consumer("limited")
                    .policy(RetryPolicy::parse(policy).map_err(|e| e.to_string())?)
                    .build();
                Ok::<_, String>(built.err().map(|e| e.to_string()))
            }
        };
        admin_call(
            "POST",
            &format!("{ns_url}/delayedDelivery"),
            Some(r#"{"active":true,"tickTime":100,"maxDeliveryDelayInMillis":60000}"#),
        )?;
        if let Some(e) = refused("30s x2").await? {
            return Err(format!(
                "a 30 s policy under a 1 min limit was refused: {e}"
            ));
        }
        match refused("30s, 2m").await? {
            Some(e) if e.contains("refused") || e.contains("cannot honour") => {}
            other => return Err(format!("a 2 min delay under a 1 min limit: {other:?}")),
        }
        admin_call(
            "POST",
            &format!("{ns_url}/delayedDelivery"),
            Some(r#"{"active":false,"tickTime":100,"maxDeliveryDelayInMillis":0}"#),
        )?;
        match refused("1s").await? {
            Some(e) if e.contains("cannot honour") => Ok(()),
            Some(e) => Err(format!(
                "a delay where delayed delivery is off failed, but not as one the broker cannot \
                 honour: {e}"
            )),
            None => Err("a delay was accepted where delayed delivery is off".into()),
        }
    });
    let deleted = admin_call("DELETE", &ns_url, None);
    result.and(deleted.map(drop))
}

/// With 300 events waiting, a batch handler gets each once, none in a call above the batch size, and at
/// least one call of more than one event: the subscription hands over what it holds together
/// (`test_support::batch`).
fn a_batch_handler_gets_more_than_one_held_event_per_call(url: String) -> Result<(), String> {
    test_support::broker::runtime()?.block_on(async move {
        let transport = connect(&url).await?;
        let topic = format!("batch-{}", uuid::Uuid::new_v4().simple());
        test_support::batch::batches_take_more_than_one_held_event(&Broker::new(transport), &topic)
            .await
    })
}

/// How many messages the topic's default group and its DLQ hold before a fresh transport starts on it:
/// more than the client queues for one consumer (1,000), so a consumer nobody reads fills its queue.
const WAITING: usize = 2_500;

/// A fresh transport (a new process: nothing declared yet) on a topic whose default group and DLQ each
/// hold 2,500 messages: publishing (which makes the subscriptions through consumers that leave at
/// once), a DLQ operation that reads and removes one entry and finishes after its consumer's queue
/// filled up, and the shutdown of a slow consumer with the backlog behind it each succeed within 10 s;
/// the DLQ then lists every entry it listed before but the one removed, each once. The client's
/// consumer answers a close or a request only once its queue has room; each of these stops reading
/// with the queue full. (On the way to publishing, a close that does not get through gives up after
/// 10 s; the shutdown's, after 3 s, and drops the consumer.)
fn a_fresh_transport_starts_on_a_topic_with_thousands_waiting(url: String) -> Result<(), String> {
    use futures::StreamExt;
    test_support::broker::runtime()?.block_on(async move {
        let first = connect(&url).await?;
        let topic = format!("waiting-{}", uuid::Uuid::new_v4().simple());
        let failed = futures::stream::iter(0..WAITING)
            .map(|i| {
                let (first, topic) = (first.clone(), topic.clone());
                async move {
                    let event = Event::new(format!("e{i}")).with_id(format!("e{i}"));
                    let published = first.publish(&topic, &event).await.map(drop);
                    let dead = first.write_dead_letter(&topic, None, &event).await;
                    published.and(dead)
                }
            })
            .buffer_unordered(64)
            .filter_map(|r| async move { r.err() })
            .collect::<Vec<_>>()
            .await;
        if let Some(e) = failed.first() {
            return Err(format!(
                "{} of {WAITING} sends failed, first: {e}",
                failed.len()
            ));
        }
        let fresh = connect(&url).await?;
        within("publishing", fresh.publish(&topic, &Event::new("one"))).await?;

        let dlq = Broker::new(fresh.clone()).dead_letters();
        let all = event_retry_core::dlq::DlqFilter::all();
        let before = entry_ids(within("listing the DLQ", dlq.list(&topic, &all)).await?)?;
        if before.len() < WAITING {
            return Err(format!(
                "the DLQ lists {} entries, want at least {WAITING}",
                before.len()
            ));
        }
        let mut session = within("opening the DLQ", fresh.open_dead_letters(&topic))
            .await?
            .ok_or("the transport has no DLQ")?;
        let Some(first) = within("reading the DLQ", session.next()).await? else {
            return Err("the DLQ gave no entry".to_string());
        };
        within("removing a DLQ entry", session.remove(&[0])).await?;
        // Time for the broker to fill the consumer's queue.
        tokio::time::sleep(Duration::from_secs(1)).await;
        within("finishing the DLQ operation", session.finish()).await?;
        let after = entry_ids(within("listing the DLQ again", dlq.list(&topic, &all)).await?)?;
        let mut want = before.clone();
        want.remove(&first.id);
        if after != want {
            return Err(format!(
                "after removing {} the DLQ lists {} entries, want the other {} of {}",
                first.id,
                after.len(),
                want.len(),
                before.len()
            ));
        }
        let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = handled.clone();
        let handler = handler_fn(move |_event: Event, _ctx: Context| {
            let count = count.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
        });
        let start = Broker::new(fresh.clone())
            .consumer(&topic)
            .group("late")
            .policy(RetryPolicy::parse("500ms x1").map_err(|e| e.to_string())?)
            .start(handler);
        let consumer = within("starting a consumer", start).await?;
        event_retry_testkit::probe::wait_for("50 events handled", Duration::from_secs(30), || {
            handled.load(std::sync::atomic::Ordering::SeqCst) >= 50
        })
        .await?;
        within("shutting down", consumer.shutdown()).await
    })
}

/// The ids of a DLQ listing's entries, or an error naming one listed twice.
fn entry_ids(
    entries: Vec<event_retry_core::dlq::DeadLetter>,
) -> Result<std::collections::BTreeSet<String>, String> {
    let mut ids = std::collections::BTreeSet::new();
    for entry in entries {
        if !ids.insert(entry.id.clone()) {
            return Err(format!("the DLQ listed entry {} twice", entry.id));
        }
    }
    Ok(ids)
}

/// `work`'s result, or an error naming `step` if it failed or took over 10 s.
async fn within<T, E: std::fmt::Display>(
    step: &str,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(Duration::from_secs(10), work).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(format!("{step} failed: {e}")),
        Err(_) => Err(format!("{step} took over 10 s")),
    }
}
