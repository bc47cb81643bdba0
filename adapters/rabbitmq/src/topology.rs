//! The fixed topology: one shared ladder of binary delay levels; per topic a fanout exchange and a DLQ;
//! per consumer group of a topic a work queue (`<topic>:<group>`) bound to the topic's exchange.
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
//!
//! Level `k` is a topic exchange and a durable queue of the same name where a copy waits granularity ×
//! 2ᵏ. A delay of `u` granularity units travels with a routing key that spells `u` in binary, least
//! significant bit first, then the destination queue: `1.0.1.<queue>` is 5 units. Level `k`'s exchange
//! sends a key whose word `k` is `1` into its queue and a `0` straight on to level `k − 1`'s exchange;
//! level 0 hands on to the `out` exchange, which routes by destination to the group's retry queue (work
//! queues stay bound too). Every copy in one level waits the same time, so a level's head is always the
//! next due: nothing waits behind a copy that is not due, delays exact to the granularity with `levels`
//! queues. This is the scheme NServiceBus uses, with the routing key's bit order fixed so that levels
//! never depend on the ladder's depth.
//!
//! The hops between levels are the SDK's, not the broker's (see the `mover` module): a level is a plain
//! queue, and a consumer process takes a copy whose time at its level is up (`x-retry-hop-due`), sends it
//! on to the next level's exchange with a publisher confirm and only then acknowledges it. RabbitMQ's own
//! way — a TTL per level that dead-letters into the next — is at most once on classic queues (a broker
//! crash mid-hop loses the copy) and, on quorum queues, goes through a dead-letter worker that after a
//! crash or a node loss held copies for minutes; both were measured losing or holding copies (see the
//! adapter README's Limits). The ladder's `out` exchange has an alternate exchange: a due copy whose
//! retry queue no longer exists (its topic deleted while the copy waited) goes to the ladder's
//! `unroutable` queue, kept for an operator, and the level moves on.
//!
//! Earlier versions declared a TTL ladder named `<prefix>.delay-<g>ms-<type>`; this one is
//! `<prefix>.ladder-<g>ms-<type>`, so both live side by side and copies already in the old ladder still
//! reach their queues through its own exit.

use event_retry_core::error::{Error, Kind};
use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, ExchangeKind};

use crate::config::{QueueType, RabbitConfig};

/// What a group's work queue name gets to name its retry queue.
const RETRY_QUEUE_SUFFIX: &str = ":retries";

/// Names of everything the adapter declares, derived from the configuration.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    ladder: String,
    dlq_suffix: String,
    levels: u32,
}

impl Names {
    pub(crate) fn new(config: &RabbitConfig) -> Self {
        Self {
            ladder: format!(
                "{}.ladder-{}ms-{}",
                config.prefix,
                config.granularity.as_millis(),
                config.queue_type.as_str()
            ),
            dlq_suffix: config.dlq_suffix.clone(),
            levels: config.levels,
        }
    }

    /// The exchange and queue of delay level `k`.
    pub(crate) fn level(&self, k: u32) -> String {
        format!("{}.{k:02}", self.ladder)
    }

    /// The exchange a delayed copy is published to: the top level.
    pub(crate) fn entry(&self) -> String {
        self.level(self.levels - 1)
    }

    /// The exchange a copy leaving level `k` is sent to: level `k − 1`'s, or the exit after level 0.
    pub(crate) fn below(&self, k: u32) -> String {
        match k.checked_sub(1) {
            Some(next) => self.level(next),
            None => self.out(),
        }
    }

    /// How many levels the ladder has.
    pub(crate) fn levels(&self) -> u32 {
        self.levels
    }

    /// The exchange that routes a due copy to its work queue.
    pub(crate) fn out(&self) -> String {
        format!("{}.out", self.ladder)
    }

    /// The alternate exchange of a quorum ladder's exit, and the queue behind it: where a due copy whose
    /// work queue no longer exists is kept.
    pub(crate) fn unroutable(&self) -> String {
        format!("{}.unroutable", self.ladder)
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

    /// The routing key that carries a copy `units` granularity steps to `queue`.
    pub(crate) fn routing_key(&self, units: u64, queue: &str) -> String {
        let mut key = String::with_capacity(2 * self.levels as usize + queue.len());
        for k in 0..self.levels {
            key.push(if units >> k & 1 == 1 { '1' } else { '0' });
            key.push('.');
        }
        key.push_str(queue);
        key
    }

    /// The level a copy sent with `routing_key` waits in next, below level `below` (`levels` for a copy
    /// entering the ladder): its highest `1` word under `below`, or `None` when it leaves the ladder.
    pub(crate) fn next_level(&self, routing_key: &str, below: u32) -> Option<u32> {
        let words: Vec<&str> = routing_key
            .splitn(self.levels as usize + 1, '.')
            .take(self.levels as usize)
            .collect();
        (0..below.min(words.len() as u32))
            .rev()
            .find(|&k| words[k as usize] == "1")
    }

    /// The binding of `queue` to the `out` exchange: any bits, then exactly the queue's name.
    fn out_binding(&self, queue: &str) -> String {
        let mut key = "*.".repeat(self.levels as usize);
        key.push_str(queue);
        key
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
    if longest > 255 || topic.len() + 2 * names.levels as usize > 255 {
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
    if queue.len() > 255 || queue.len() + 2 * names.levels as usize > 255 {
        return bad(format!(
            "{queue} is too long for a queue name or routing key (255 bytes with the ladder's bits)"
        ));
    }
    Ok(())
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

fn failed(what: String) -> impl FnOnce(lapin::Error) -> Error {
    move |e| {
        let hint = upgrade_hint(&e.to_string());
        crate::error::amqp_error(e, format!("declare {what}{hint}"))
    }
}

/// What to do when the broker refuses a declare because an earlier version (or other settings) declared
/// the same name with other arguments, which RabbitMQ never changes in place.
fn upgrade_hint(refusal: &str) -> &'static str {
    if refusal.contains("inequivalent arg 'x-queue-type'") {
        " (it exists with another queue type, and a queue's type never changes: set queue_type to the \
         type it has, or drain and delete it so that it is declared again)"
    } else {
        ""
    }
}

fn type_args(queue_type: QueueType) -> Vec<(&'static str, AMQPValue)> {
    match queue_type {
        QueueType::Classic => vec![],
        QueueType::Quorum => vec![("x-queue-type", text("quorum"))],
    }
}

/// Declares the shared ladder (idempotent: the same settings declare the same things).
pub(crate) async fn declare_ladder(
    channel: &Channel,
    names: &Names,
    config: &RabbitConfig,
) -> Result<(), Error> {
    let topic = ExchangeKind::Topic;
    let ex_opts = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    let out = names.out();
    let unroutable = names.unroutable();
    declare_unroutable(channel, &unroutable, config.queue_type, ex_opts).await?;
    let mut out_args = FieldTable::default();
    out_args.insert("alternate-exchange".into(), text(&unroutable));
    channel
        .exchange_declare(out.as_str().into(), topic.clone(), ex_opts, out_args)
        .await
        .map_err(failed(format!("exchange {out}")))?;
    for k in 0..config.levels {
        let level = names.level(k);
        let next = if k == 0 {
            out.clone()
        } else {
            names.level(k - 1)
        };
        channel
            .exchange_declare(
                level.as_str().into(),
                topic.clone(),
                ex_opts,
                FieldTable::default(),
            )
            .await
            .map_err(failed(format!("exchange {level}")))?;
        // No TTL and no dead-lettering: the SDK moves a copy on (the `mover` module).
        let args = type_args(config.queue_type);
        channel
            .queue_declare(level.as_str().into(), durable(), table(&args))
            .await
            .map_err(failed(format!("delay level {level}")))?;
        let skip = "*.".repeat(k as usize);
        channel
            .queue_bind(
                level.as_str().into(),
                level.as_str().into(),
                format!("{skip}1.#").into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(failed(format!("binding of {level}")))?;
        channel
            .exchange_bind(
                next.as_str().into(),
                level.as_str().into(),
                format!("{skip}0.#").into(),
                ExchangeBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(failed(format!("binding {level} → {next}")))?;
    }
    Ok(())
}

/// Declares the ladder's `unroutable` fanout exchange and the queue bound to it.
async fn declare_unroutable(
    channel: &Channel,
    unroutable: &str,
    queue_type: QueueType,
    ex_opts: ExchangeDeclareOptions,
) -> Result<(), Error> {
    channel
        .exchange_declare(
            unroutable.into(),
            ExchangeKind::Fanout,
            ex_opts,
            FieldTable::default(),
        )
        .await
        .map_err(failed(format!("exchange {unroutable}")))?;
    channel
        .queue_declare(unroutable.into(), durable(), table(&type_args(queue_type)))
        .await
        .map_err(failed(format!("queue {unroutable}")))?;
    channel
        .queue_bind(
            unroutable.into(),
            unroutable.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(failed(format!("binding of {unroutable}")))
}

/// Declares `topic`'s exchange and its DLQ.
pub(crate) async fn declare_topic(
    channel: &Channel,
    names: &Names,
    config: &RabbitConfig,
    topic: &str,
) -> Result<(), Error> {
    declare_dlq(channel, names, config, topic).await?;
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
            names.out().as_str().into(),
            names.out_binding(queue).into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(failed(format!("binding of {queue} to {}", names.out())))
}

/// Declares `topic`'s DLQ queue.
pub(crate) async fn declare_dlq(
    channel: &Channel,
    names: &Names,
    config: &RabbitConfig,
    topic: &str,
) -> Result<(), Error> {
    let dlq = names.dlq(topic);
    channel
        .queue_declare(
            dlq.as_str().into(),
            durable(),
            table(&type_args(config.queue_type)),
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
    fn routing_key_spells_the_delay_lsb_first() {
        let n = names(4);
        assert_eq!(n.routing_key(5, "orders"), "1.0.1.0.orders");
        assert_eq!(n.routing_key(0, "a.b"), "0.0.0.0.a.b");
        assert_eq!(n.routing_key(15, "q"), "1.1.1.1.q");
        assert_eq!(n.out_binding("a.b"), "*.*.*.*.a.b");
        assert_eq!(n.entry(), "event-retry.ladder-100ms-classic.03");
        assert_eq!(
            n.unroutable(),
            "event-retry.ladder-100ms-classic.unroutable"
        );
        assert_eq!(n.below(2), "event-retry.ladder-100ms-classic.01");
        assert_eq!(n.below(0), "event-retry.ladder-100ms-classic.out");
        assert_eq!(n.dlq("orders"), "orders.dlq");
    }

    #[test]
    fn a_copy_waits_next_in_its_highest_one_below_the_level_it_left() {
        let n = names(4);
        let key = n.routing_key(0b1011, "a.1.b");
        assert_eq!(n.next_level(&key, n.levels()), Some(3));
        assert_eq!(n.next_level(&key, 3), Some(1));
        assert_eq!(n.next_level(&key, 1), Some(0));
        assert_eq!(n.next_level(&key, 0), None);
        // The destination's own words are never read as bits.
        assert_eq!(n.next_level(&n.routing_key(0, "1.1"), 4), None);
        assert_eq!(n.next_level("garbage", 4), None);
    }

    #[test]
    fn a_refused_redeclare_says_how_to_upgrade() {
        let queue = "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'orders:billing' \
                     in vhost '/': received the value 'quorum' of type 'longstr' but current is none";
        assert!(upgrade_hint(queue).contains("set queue_type"));
        assert_eq!(upgrade_hint("NOT_FOUND - no queue 'x'"), "");
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
