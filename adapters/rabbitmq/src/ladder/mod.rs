//! The delay ladder: its levels, their exchange and queue names, the routing key that carries a
//! copy's delay through them, and their declarations. What moves a copy from level to level is the
//! `mover` module beside this one; the topics' and groups' own queues, which the ladder's exit feeds,
//! are the `topics` module's.
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
//! The ladder is shared by every topic of a transport's settings: its names come from the prefix,
//! granularity and queue type. Earlier versions declared a TTL ladder named
//! `<prefix>.delay-<g>ms-<type>`; this one is `<prefix>.ladder-<g>ms-<type>`, so both live side by side
//! and copies already in the old ladder still reach their queues through its own exit.

pub(crate) mod mover;

use std::time::Duration;

use event_retry_core::error::Error;
use lapin::options::{ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions};
use lapin::types::FieldTable;
use lapin::{Channel, ExchangeKind};

use crate::config::{QueueType, RabbitConfig};
use crate::declare::{durable, failed, held_args, table, text};

/// The names of the ladder's levels and exits, and the routing keys through them, derived from the
/// configuration.
#[derive(Clone, Debug)]
pub(crate) struct Ladder {
    ladder: String,
    levels: u32,
    /// The wait of level 0; level `k` waits this × 2ᵏ.
    granularity: Duration,
}

impl Ladder {
    pub(crate) fn new(config: &RabbitConfig) -> Self {
        Self {
            ladder: format!(
                "{}.ladder-{}ms-{}",
                config.prefix,
                config.granularity.as_millis(),
                config.queue_type.as_str()
            ),
            levels: config.levels,
            granularity: config.granularity,
        }
    }

    /// How long a copy waits in level `k`, in milliseconds.
    pub(crate) fn wait_ms(&self, k: u32) -> u64 {
        let g = u64::try_from(self.granularity.as_millis()).unwrap_or(u64::MAX);
        g.saturating_mul(1 << k)
    }

    /// When a copy sent with `routing_key` out of level `below` (`levels` for one entering the ladder)
    /// at `from` (ms since the Unix epoch) leaves the next level it waits in; `None` when it leaves the
    /// ladder.
    pub(crate) fn next_due(&self, routing_key: &str, below: u32, from: u64) -> Option<u64> {
        self.next_level(routing_key, below)
            .map(|next| from.saturating_add(self.wait_ms(next)))
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
    pub(crate) fn out_binding(&self, queue: &str) -> String {
        let mut key = "*.".repeat(self.levels as usize);
        key.push_str(queue);
        key
    }
}

/// Declares the shared ladder (idempotent: the same settings declare the same things); its quorum queues
/// with their delivery limit where `held_limit`.
pub(crate) async fn declare(
    channel: &Channel,
    ladder: &Ladder,
    config: &RabbitConfig,
    held_limit: bool,
) -> Result<(), Error> {
    let topic = ExchangeKind::Topic;
    let ex_opts = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    let out = ladder.out();
    let unroutable = ladder.unroutable();
    declare_unroutable(channel, &unroutable, config.queue_type, held_limit, ex_opts).await?;
    let mut out_args = FieldTable::default();
    out_args.insert("alternate-exchange".into(), text(&unroutable));
    channel
        .exchange_declare(out.as_str().into(), topic.clone(), ex_opts, out_args)
        .await
        .map_err(failed(format!("exchange {out}")))?;
    for k in 0..config.levels {
        let level = ladder.level(k);
        let next = if k == 0 {
            out.clone()
        } else {
            ladder.level(k - 1)
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
        let args = held_args(config.queue_type, held_limit);
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
    held_limit: bool,
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
        .queue_declare(
            unroutable.into(),
            durable(),
            table(&held_args(queue_type, held_limit)),
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder(levels: u32) -> Ladder {
        Ladder::new(&RabbitConfig {
            levels,
            ..RabbitConfig::default()
        })
    }

    #[test]
    fn routing_key_spells_the_delay_lsb_first() {
        let n = ladder(4);
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
    }

    #[test]
    fn a_copy_waits_next_in_its_highest_one_below_the_level_it_left() {
        let n = ladder(4);
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
    fn a_copy_is_due_out_of_its_next_level_after_that_level_s_wait() {
        let n = ladder(4);
        let key = n.routing_key(0b1010, "q");
        assert_eq!(n.wait_ms(3), 800);
        assert_eq!(n.next_due(&key, n.levels(), 1_000), Some(1_800));
        assert_eq!(n.next_due(&key, 3, 1_000), Some(1_200));
        assert_eq!(n.next_due(&key, 1, 1_000), None);
    }
}
