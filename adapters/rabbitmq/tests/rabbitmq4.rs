//! Tests against RabbitMQ 4 (`RETRY_TEST_AMQP4`, started by `scripts/brokers start rabbitmq4`) of what
//! 4.x changed and the conformance suite does not read, each read with the node's own `rabbitmqctl`
//! (`RETRY_TEST_AMQP4_CTL`):
//!
//! * every quorum queue the adapter declares — the group's work and retry queues, the DLQ, each level
//!   of the delay ladder and its unroutable queue — carries an explicit `x-delivery-limit` (RabbitMQ 4
//!   gives a quorum queue without one a limit of 20, then drops the message): the configured limit on
//!   the queues a consumer fails messages in, one out of reach where messages are only given back;
//! * a quorum DLQ listed 25 times still holds every entry (its depth then read with lapin): listing takes each entry and gives it back,
//!   which RabbitMQ 4 counts as a delivery, and with its default limit the 22nd listing found the DLQ
//!   empty;
//! * a quorum DLQ an earlier version declared without a limit (RabbitMQ never changes a queue's
//!   arguments) is used as it is: a consumer starts, and its dead letter lands there;
//! * the control that makes the DLQ listing test able to fail: a quorum queue declared without a limit
//!   (with lapin) loses a message taken and given back 20 times.
//!
//! Each first reads, through the node, that the URL is a RabbitMQ 4.x node's AMQP listener.
//!
//! Without the broker they are listed as ignored with the reason, and fail when `RETRY_TEST_REQUIRE`
//! names rabbitmq4.

use std::collections::BTreeMap;
use std::time::Duration;

use event_retry_core::adapter::Admin;
use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::dlq::DlqFilter;
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{Context, handler_fn};
use event_retry_rabbitmq::{QueueType, RabbitConfig, RabbitTransport};
use libtest_mimic::Arguments;
use raw_brokers::Rabbitmqctl;
use test_support::broker::runtime;

fn main() {
    let args = Arguments::from_args();
    let tests = test_support::named_tests![
        every_quorum_queue_declares_an_explicit_delivery_limit,
        a_quorum_dlq_listed_25_times_keeps_its_entries,
        a_quorum_queue_without_a_limit_drops_a_message_given_back_20_times,
        an_earlier_versions_dlq_without_a_limit_is_used_as_it_is,
    ];
    let trials = test_support::broker::trials("rabbitmq4", "RETRY_TEST_AMQP4", &tests);
    libtest_mimic::run(&args, trials).exit();
}

/// The delivery limit the adapter gives the queues whose messages it only gives back (i32::MAX).
const OUT_OF_REACH: i64 = 2_147_483_647;

/// The RabbitMQ 4 node's own `rabbitmqctl`, after reading from the node's status that it runs RabbitMQ
/// 4.x and that `url`'s port is its AMQP listener.
async fn ctl(url: &str) -> Result<Rabbitmqctl, String> {
    let ctl = Rabbitmqctl::from_env("RETRY_TEST_AMQP4")
        .ok_or("RETRY_TEST_AMQP4_NODE is not set (scripts/brokers writes it)")?;
    let status = ctl
        .run(&["status", "--formatter", "json"])
        .await
        .map_err(|e| e.to_string())?;
    let status: serde_json::Value =
        serde_json::from_str(&status).map_err(|e| format!("read the node's status: {e}"))?;
    let version = status["rabbitmq_version"].as_str().unwrap_or_default();
    if !version.starts_with("4.") {
        return Err(format!("the node runs RabbitMQ {version:?}, not 4.x"));
    }
    let port = url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse::<u64>().ok())
        .ok_or_else(|| format!("no port in {url}"))?;
    let listens = status["listeners"].as_array().is_some_and(|listeners| {
        listeners
            .iter()
            .any(|l| l["port"].as_u64() == Some(port) && l["protocol"] == "amqp")
    });
    if !listens {
        return Err(format!(
            "the RabbitMQ {version} node does not listen for AMQP on {port}: {}",
            status["listeners"]
        ));
    }
    Ok(ctl)
}

/// Quorum settings with a ladder of their own (`prefix`), so the test reads queues it declared.
fn quorum(prefix: &str, delivery_limit: u32) -> RabbitConfig {
    RabbitConfig {
        queue_type: QueueType::Quorum,
        delivery_limit,
        prefix: prefix.to_string(),
        levels: 8,
        ..RabbitConfig::default()
    }
}

/// Each queue's type and `x-delivery-limit` (`None` without one), by name.
async fn limits(ctl: &Rabbitmqctl) -> Result<BTreeMap<String, (String, Option<i64>)>, String> {
    let queues = ctl
        .queues(&["name", "type", "arguments"])
        .await
        .map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for q in &queues {
        let name = q["name"].as_str().unwrap_or_default().to_string();
        let kind = q["type"].as_str().unwrap_or_default().to_string();
        // Arguments come as [name, type, value] triples.
        let limit = q["arguments"].as_array().and_then(|args| {
            args.iter()
                .find(|a| a[0] == "x-delivery-limit")
                .and_then(|a| a[2].as_i64())
        });
        out.insert(name, (kind, limit));
    }
    Ok(out)
}

/// A quorum consumer retries one event through the ladder and dead-letters another; then every queue of
/// its topic and its ladder, read with `rabbitmqctl`, is a quorum queue with an explicit delivery limit:
/// 77 (the setting) on the group's work and retry queues, out of reach on the DLQ and the ladder.
fn every_quorum_queue_declares_an_explicit_delivery_limit(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        let ctl = ctl(&url).await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let prefix = format!("limits-{id}");
        let topic = format!("limits-{id}");
        let transport = RabbitTransport::connect_with(&url, quorum(&prefix, 77))
            .await
            .map_err(|e| e.to_string())?;
        let broker = Broker::new(transport.clone());
        let handler = handler_fn(|event: Event, ctx: Context| async move {
            match (event.id(), ctx.attempt) {
                (Some("bad"), _) => Err(HandlerError::non_retryable("bad input")),
                (_, 1) => Err(HandlerError::deferred("not yet")),
                _ => Ok(()),
            }
        });
        let consumer = broker
            .consumer(&topic)
            .group("g")
            .policy(RetryPolicy::parse("300ms x2").map_err(|e| e.to_string())?)
            .start(handler)
            .await
            .map_err(|e| e.to_string())?;
        for id in ["flaky", "bad"] {
            broker
                .producer()
                .publish(&topic, Event::new(id).with_id(id))
                .await
                .map_err(|e| e.to_string())?;
        }
        let done = tokio::time::timeout(
            Duration::from_secs(30),
            consumer.wait_until(|s| s.succeeded_after_retry >= 1 && s.dead_lettered >= 1),
        )
        .await;
        let stats = consumer.stats();
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        done.map_err(|_| format!("the retry and the dead letter did not happen: {stats:?}"))?;

        // The queues consumers fail messages in: group g's, and the default group's, which collects
        // events from the topic's declaration on.
        let mut want: BTreeMap<String, i64> = BTreeMap::new();
        for group in [Some("g"), None] {
            let names = transport
                .names(&topic, group)
                .await
                .map_err(|e| e.to_string())?;
            let retry = names
                .retry
                .clone()
                .ok_or("the adapter names no retry queue")?;
            want.insert(names.topic.clone(), 77);
            want.insert(retry, 77);
            want.insert(names.dlq.clone(), OUT_OF_REACH);
            for level in &names.delay {
                want.insert(level.clone(), OUT_OF_REACH);
            }
        }
        let found = limits(&ctl).await?;
        // Every queue of the topic or the ladder, including any the names above do not list (the
        // ladder's unroutable queue): none may lack a limit.
        let ours: BTreeMap<&String, &(String, Option<i64>)> = found
            .iter()
            .filter(|(name, _)| name.starts_with(&prefix) || name.contains(&topic))
            .collect();
        if ours.len() <= want.len() {
            return Err(format!(
                "only {} queues of the topic and ladder on the broker, want more than {} \
                 (the unroutable queue too): {ours:?}",
                ours.len(),
                want.len()
            ));
        }
        for (name, (kind, limit)) in &ours {
            let expected = want.get(*name).copied().unwrap_or(OUT_OF_REACH);
            if kind != "quorum" || *limit != Some(expected) {
                return Err(format!(
                    "queue {name}: type {kind}, x-delivery-limit {limit:?}; want quorum with \
                     {expected} (every queue: {ours:?})"
                ));
            }
        }
        for name in want.keys() {
            if !ours.contains_key(name) {
                return Err(format!("queue {name} is not on the broker: {ours:?}"));
            }
        }
        transport.delete(&topic).await.map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// Two events dead-lettered into a quorum DLQ; the DLQ listed 25 times through the SDK shows both every
/// time, and the broker then counts 2 messages in it.
fn a_quorum_dlq_listed_25_times_keeps_its_entries(url: String) -> Result<(), String> {
    runtime()?.block_on(async move {
        ctl(&url).await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let topic = format!("listed-{id}");
        let transport = RabbitTransport::connect_with(&url, quorum(&format!("listed-{id}"), 1_000))
            .await
            .map_err(|e| e.to_string())?;
        let broker = Broker::new(transport.clone());
        let handler = handler_fn(|_event: Event, _ctx: Context| async move {
            Err::<(), _>(HandlerError::non_retryable("bad input"))
        });
        let consumer = broker
            .consumer(&topic)
            .policy(RetryPolicy::parse("1s x1").map_err(|e| e.to_string())?)
            .start(handler)
            .await
            .map_err(|e| e.to_string())?;
        for id in ["a", "b"] {
            broker
                .producer()
                .publish(&topic, Event::new(id).with_id(id))
                .await
                .map_err(|e| e.to_string())?;
        }
        let done = tokio::time::timeout(
            Duration::from_secs(30),
            consumer.wait_until(|s| s.dead_lettered >= 2),
        )
        .await;
        let stats = consumer.stats();
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        done.map_err(|_| format!("the two dead letters did not happen: {stats:?}"))?;

        let dlq = transport
            .names(&topic, None)
            .await
            .map_err(|e| e.to_string())?
            .dlq;
        // Each listing starts once the previous one's entries are back (the DLQ's depth read with
        // lapin), and the depth is read once more after the last.
        let raw = raw_brokers::RawRabbit::new(&url);
        for listing in 1..=25 {
            let depth = ready_again(&raw, &dlq, 2).await?;
            if depth != 2 {
                return Err(format!(
                    "before listing {listing} {dlq} holds {depth} messages, want 2"
                ));
            }
            let entries = broker
                .dead_letters()
                .list(&topic, &DlqFilter::all())
                .await
                .map_err(|e| e.to_string())?;
            if entries.len() != 2 {
                return Err(format!(
                    "listing {listing} of the DLQ found {} entries, want 2",
                    entries.len()
                ));
            }
        }
        let depth = ready_again(&raw, &dlq, 2).await?;
        if depth != 2 {
            return Err(format!(
                "after 25 listings {dlq} holds {depth} messages, want 2"
            ));
        }
        transport.delete(&topic).await.map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// Waits up to 5 s until `queue` holds `want` messages ready, read with lapin; the depth last read.
/// A message given back by a closed channel returns to a quorum queue a moment after the close, so a
/// take right after one could find the queue short: each take waits for this first.
async fn ready_again(raw: &raw_brokers::RawRabbit, queue: &str, want: u32) -> Result<u32, String> {
    let mut depth = 0;
    for _ in 0..50 {
        depth = raw.depth(queue).await.map_err(|e| e.to_string())?;
        if depth == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(depth)
}

/// Declares `queue` with lapin as a durable quorum queue without `x-delivery-limit` (as an earlier
/// version of the adapter declared its DLQ), on a channel it returns.
async fn declare_quorum_without_limit(
    connection: &lapin::Connection,
    queue: &str,
) -> Result<lapin::Channel, String> {
    use lapin::options::QueueDeclareOptions;
    use lapin::types::{AMQPValue, FieldTable, LongString};

    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(channel)
}

/// A quorum queue declared with lapin without `x-delivery-limit`, one message in it, taken and given back
/// (its channel closed) until it does not come back: RabbitMQ 4 drops it at its 21st give-back.
/// Without this, the DLQ test above would pass on a broker that never counts a message given back.
fn a_quorum_queue_without_a_limit_drops_a_message_given_back_20_times(
    url: String,
) -> Result<(), String> {
    use lapin::options::{
        BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions,
    };
    use lapin::{BasicProperties, Connection, ConnectionProperties};

    runtime()?.block_on(async move {
        ctl(&url).await?;
        let e = |e: lapin::Error| e.to_string();
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .map_err(e)?;
        let queue = format!("no-limit-{}", uuid::Uuid::new_v4().simple());
        let channel = declare_quorum_without_limit(&connection, &queue).await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(e)?;
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                b"given back",
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .map_err(e)?
            .await
            .map_err(e)?;
        // Each take waits until the message is back from the last give-back; the give-back after which
        // it never comes back is the one the broker dropped it at.
        let raw = raw_brokers::RawRabbit::new(&url);
        let mut dropped_after = None;
        for take in 1..=25 {
            let channel = connection.create_channel().await.map_err(e)?;
            let got = channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
                .await
                .map_err(e)?;
            if got.is_none() {
                return Err(format!(
                    "take {take} found the queue empty, the message ready before it"
                ));
            }
            // Closing the channel gives the message back.
            channel.close(200, "given back".into()).await.map_err(e)?;
            if ready_again(&raw, &queue, 1).await? == 0 {
                dropped_after = Some(take);
                break;
            }
        }
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .map_err(e)?;
        let _ = connection.close(200, "done".into()).await;
        // The 21st give-back is over the default limit of 20.
        match dropped_after {
            Some(21) => Ok(()),
            other => Err(format!(
                "the message without a delivery limit was dropped after give-back {other:?}, want \
                 21 (RabbitMQ 4's default limit of 20)"
            )),
        }
    })
}

/// A topic whose quorum DLQ exists without `x-delivery-limit`, as an earlier version declared it
/// (declared here with lapin): a quorum consumer of the topic starts (the refused redeclare falls back to
/// the queue as it is, with a warning) and its dead letter lands in that DLQ, which still has no limit.
fn an_earlier_versions_dlq_without_a_limit_is_used_as_it_is(url: String) -> Result<(), String> {
    use lapin::{Connection, ConnectionProperties};

    runtime()?.block_on(async move {
        let ctl = ctl(&url).await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let topic = format!("earlier-{id}");
        let transport =
            RabbitTransport::connect_with(&url, quorum(&format!("earlier-{id}"), 1_000))
                .await
                .map_err(|e| e.to_string())?;
        let dlq = transport
            .names(&topic, None)
            .await
            .map_err(|e| e.to_string())?
            .dlq;
        let e = |e: lapin::Error| e.to_string();
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .map_err(e)?;
        declare_quorum_without_limit(&connection, &dlq).await?;
        let _ = connection.close(200, "declared".into()).await;

        let broker = Broker::new(transport.clone());
        let handler = handler_fn(|_event: Event, _ctx: Context| async move {
            Err::<(), _>(HandlerError::non_retryable("bad input"))
        });
        let consumer = broker
            .consumer(&topic)
            .policy(RetryPolicy::parse("1s x1").map_err(|e| e.to_string())?)
            .start(handler)
            .await
            .map_err(|e| format!("the consumer did not start on the earlier DLQ: {e}"))?;
        broker
            .producer()
            .publish(&topic, Event::new("x").with_id("x"))
            .await
            .map_err(|e| e.to_string())?;
        let done = tokio::time::timeout(
            Duration::from_secs(30),
            consumer.wait_until(|s| s.dead_lettered >= 1),
        )
        .await;
        let stats = consumer.stats();
        consumer.shutdown().await.map_err(|e| e.to_string())?;
        done.map_err(|_| format!("the dead letter did not happen: {stats:?}"))?;
        let entries = broker
            .dead_letters()
            .list(&topic, &DlqFilter::all())
            .await
            .map_err(|e| e.to_string())?;
        if entries.len() != 1 {
            return Err(format!("{} DLQ entries, want 1", entries.len()));
        }
        let limit = limits(&ctl).await?.get(&dlq).cloned();
        if limit != Some(("quorum".to_string(), None)) {
            return Err(format!(
                "{dlq} is {limit:?}, want the earlier version's quorum queue without a limit"
            ));
        }
        transport.delete(&topic).await.map_err(|e| e.to_string())?;
        Ok(())
    })
}
