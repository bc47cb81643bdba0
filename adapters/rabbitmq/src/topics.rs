//! The topology of topics and consumer groups: per topic a fanout exchange and a DLQ; per consumer group
//! of a topic a work queue (`<topic>:<group>`) bound to the topic's exchange and a retry queue
//! (`<topic>:<group>:retries`) bound to the delay ladder's exit. Their names, the checks that a topic or
//! group can name them, and their declarations; the shared ladder itself is the `ladder` module's.
//!
//! A topic's exchange copies every event into the queue of each of its groups, so each group receives
//! every event, as on Kafka and Pulsar; the consumers of one group share its queue. A topic is declared
//! with its default group's queue, so that events published before the first consumer starts are kept;
//! another group's queue is declared when its first consumer subscribes (or by `Admin::declare`), and it
//! receives what is published from then on.
//!
//! Each group also has a retry queue (`<topic>:<group>:retries`) where its due retries come back: the
//! group's consumers read it beside the work queue and take from it first, so a retry that fell due runs
//! at the next free handler slot instead of waiting at the tail of the work queue behind a backlog of
//! healthy events (what sending it back to the work queue meant: seconds late under a backlog of
//! seconds, hours under an outage's). The work queue stays bound to the ladder's exit too, so copies sent
//! there by an earlier version of the adapter still arrive.

use event_retry_core::error::{Error, Kind};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

use crate::config::{QueueType, RabbitConfig};
use crate::declare::{durable, failed, held_args, table, text, type_args};
use crate::ladder::Ladder;

/// What a group's work queue name gets to name its retry queue.
const RETRY_QUEUE_SUFFIX: &str = ":retries";

/// Names of everything the adapter declares, derived from the configuration.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    /// The shared delay ladder's names.
    pub(crate) ladder: Ladder,
    dlq_suffix: String,
}

impl Names {
    pub(crate) fn new(config: &RabbitConfig) -> Self {
        Self {
            ladder: Ladder::new(config),
            dlq_suffix: config.dlq_suffix.clone(),
        }
    }

    /// The DLQ queue of `topic`.
    pub(crate) fn dlq(&self, topic: &str) -> String {
        format!("{topic}{}", self.dlq_suffix)
    }

    /// The work queue of consumer group `group` of `topic`: `<topic>:<group>` (a topic name has no `:`,
    /// so no two pairs share a queue).
    pub(crate) fn group_queue(&self, topic: &str, group: &str) -> String {
        format!("{topic}:{group}")
    }

    /// The retry queue of consumer group `group` of `topic`: `<topic>:<group>:retries`, where the group's
    /// due retries come back (no group's name ends in `:retries`, so no work queue has this name).
    pub(crate) fn retry_queue(&self, topic: &str, group: &str) -> String {
        format!("{topic}:{group}{RETRY_QUEUE_SUFFIX}")
    }

    /// The group whose work queue or retry queue `queue` of `topic` is, if it is one.
    pub(crate) fn group_of_queue<'q>(&self, topic: &str, queue: &'q str) -> Option<&'q str> {
        let group = queue.strip_prefix(topic)?.strip_prefix(':')?;
        Some(group.strip_suffix(RETRY_QUEUE_SUFFIX).unwrap_or(group))
    }
}

/// Checks that `topic` can name a queue and travel in a routing key.
pub(crate) fn check_topic(names: &Names, topic: &str) -> Result<(), Error> {
    let bad = |why: &str| Err(Error::new(Kind::Config, format!("topic {topic:?}: {why}")));
    let longest = topic.len() + names.dlq_suffix.len();
    if topic.is_empty() {
        return bad("empty");
    }
    if topic.starts_with("amq.") {
        return bad("the amq. prefix is reserved by RabbitMQ");
    }
    if topic.contains(':') {
        return bad("`:` separates a topic from its consumer group in queue names");
    }
    if topic
        .split('.')
        .any(|w| w.is_empty() || w == "*" || w == "#")
    {
        return bad(
            "dot-separated words must be non-empty and not `*` or `#` (it travels in a routing key)",
        );
    }
    if longest > 255 || topic.len() + 2 * names.ladder.levels() as usize > 255 {
        return bad("too long for a queue name or routing key (255 bytes with the ladder's bits)");
    }
    Ok(())
}

/// Checks that `group`'s queue of `topic` can be named and travel in a routing key.
pub(crate) fn check_group(names: &Names, topic: &str, group: &str) -> Result<(), Error> {
    let bad = |why: String| {
        Err(Error::new(
            Kind::Config,
            format!("consumer group {group:?} of topic {topic:?}: {why}"),
        ))
    };
    // The longer of the group's two queues.
    let queue = names.retry_queue(topic, group);
    if group.ends_with(RETRY_QUEUE_SUFFIX) {
        return bad(format!(
            "a group's name cannot end in `{RETRY_QUEUE_SUFFIX}` (another group's retry queue ends so)"
        ));
    }
    if group
        .split('.')
        .any(|w| w.is_empty() || w == "*" || w == "#")
    {
        return bad(
            "dot-separated words must be non-empty and not `*` or `#` (its queue's name travels in a \
             routing key)"
                .into(),
        );
    }
    if names.group_queue(topic, group) == names.dlq(topic) {
        return bad(format!(
            "its queue would be the topic's DLQ, {}",
            names.dlq(topic)
        ));
    }
    if group.is_empty() {
        return bad("empty".into());
    }
    if queue.len() > 255 || queue.len() + 2 * names.ladder.levels() as usize > 255 {
        return bad(format!(
            "{queue} is too long for a queue name or routing key (255 bytes with the ladder's bits)"
        ));
    }
    Ok(())
}

/// Declares `topic`'s exchange and its DLQ (a quorum DLQ with its delivery limit where `held_limit`).
pub(crate) async fn declare_topic(
    channel: &Channel,
    names: &Names,
    config: &RabbitConfig,
    topic: &str,
    held_limit: bool,
) -> Result<(), Error> {
    declare_dlq(channel, names, config, topic, held_limit).await?;
    channel
        .exchange_declare(
            topic.into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(failed(format!("exchange {topic}")))
}

/// Declares the work queue of `group` of `topic`, bound to the topic's exchange and to the ladder's exit,
/// and its retry queue, bound to the ladder's exit.
pub(crate) async fn declare_group(
    channel: &Channel,
    names: &Names,
    config: &RabbitConfig,
    topic: &str,
    group: &str,
) -> Result<(), Error> {
    let queue = names.group_queue(topic, group);
    declare_consumed_queue(channel, names, config, topic, &queue).await?;
    channel
        .queue_bind(
            queue.as_str().into(),
            topic.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(failed(format!("binding of {queue} to {topic}")))?;
    let retries = names.retry_queue(topic, group);
    declare_consumed_queue(channel, names, config, topic, &retries).await
}

/// Declares `queue`, which a group's consumers read, and binds it to the ladder's exit. On quorum queues
/// it gets an explicit delivery limit over which the broker dead-letters into `topic`'s DLQ.
async fn declare_consumed_queue(
    channel: &Channel,
    names: &Names,
    config: &RabbitConfig,
    topic: &str,
    queue: &str,
) -> Result<(), Error> {
    let dlq = names.dlq(topic);
    let mut args = type_args(config.queue_type);
    if config.queue_type == QueueType::Quorum {
        // RabbitMQ 4 gives quorum queues a delivery limit of 20 and drops what exceeds it; an explicit
        // limit whose overflow dead-letters into our DLQ means the broker never drops a message.
        args.push((
            "x-delivery-limit",
            AMQPValue::LongLongInt(i64::from(config.delivery_limit)),
        ));
        args.push(("x-dead-letter-exchange", text("")));
        args.push(("x-dead-letter-routing-key", text(&dlq)));
        args.push(("x-dead-letter-strategy", text("at-least-once")));
        args.push(("x-overflow", text("reject-publish")));
    }
    channel
        .queue_declare(queue.into(), durable(), table(&args))
        .await
        .map_err(failed(format!("queue {queue}")))?;
    channel
        .queue_bind(
            queue.into(),
            names.ladder.out().as_str().into(),
            names.ladder.out_binding(queue).into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(failed(format!(
            "binding of {queue} to {}",
            names.ladder.out()
        )))
}

/// Declares `topic`'s DLQ queue (on quorum queues with its delivery limit where `held_limit`).
pub(crate) async fn declare_dlq(
    channel: &Channel,
    names: &Names,
    config: &RabbitConfig,
    topic: &str,
    held_limit: bool,
) -> Result<(), Error> {
    let dlq = names.dlq(topic);
    channel
        .queue_declare(
            dlq.as_str().into(),
            durable(),
            table(&held_args(config.queue_type, held_limit)),
        )
        .await
        .map(drop)
        .map_err(failed(format!("DLQ {dlq}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(levels: u32) -> Names {
        Names::new(&RabbitConfig {
            levels,
            ..RabbitConfig::default()
        })
    }

    #[test]
    fn a_topic_s_dlq_is_named_after_it() {
        assert_eq!(names(4).dlq("orders"), "orders.dlq");
    }

    #[test]
    fn groups_get_queues_of_their_own() {
        let n = names(24);
        assert_eq!(n.group_queue("orders", "billing"), "orders:billing");
        assert_eq!(
            n.group_of_queue("orders", "orders:eu.billing"),
            Some("eu.billing")
        );
        assert_eq!(n.group_of_queue("orders", "orders.dlq"), None);
        assert_eq!(n.retry_queue("orders", "billing"), "orders:billing:retries");
        assert_eq!(
            n.group_of_queue("orders", "orders:eu.billing:retries"),
            Some("eu.billing")
        );
        // A group whose work queue would be another group's retry queue is refused.
        assert!(check_group(&n, "orders", "billing:retries").is_err());
        assert!(check_group(&n, "orders", "billing:retries.eu").is_ok());
        // The longer retry queue's name counts towards the limit.
        assert!(check_group(&n, "orders", &"x".repeat(190)).is_ok());
        assert!(check_group(&n, "orders", &"x".repeat(200)).is_err());
        // No two (topic, group) pairs share a queue: a topic name has no `:`.
        assert_ne!(
            n.group_queue("orders", "eu.billing"),
            n.group_queue("orders.eu", "billing")
        );
        assert!(check_topic(&n, "orders:eu").is_err());
        assert!(check_group(&n, "orders", "orders-consumers").is_ok());
        assert!(check_group(&n, "orders", "com.acme.billing").is_ok());
        for bad in ["", "a..b", "*", &"x".repeat(240)] {
            assert!(check_group(&n, "orders", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn topics_that_cannot_route_are_refused() {
        let n = names(24);
        assert!(check_topic(&n, "orders.v1").is_ok());
        for bad in ["", "a..b", "a.*", "#", ".a", "amq.x", &"x".repeat(220)] {
            assert!(check_topic(&n, bad).is_err(), "{bad:?}");
        }
    }
}
