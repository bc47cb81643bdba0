//! What the ladder's and the topics' declarations share: argument tables, a queue type's arguments,
//! durable queues, and the error of a refused declare, which says how to upgrade when an earlier version
//! declared the same name otherwise. Separate so that neither of the two depends on the other for it.

use event_retry_core::error::Error;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::config::QueueType;

/// A field table of `entries`.
pub(crate) fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

/// `s` as an AMQP long string.
pub(crate) fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// The options of a durable queue.
pub(crate) fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

/// The error of a refused declaration of `what`, with how to upgrade where the refusal says it.
pub(crate) fn failed(what: String) -> impl FnOnce(lapin::Error) -> Error {
    move |e| {
        let hint = upgrade_hint(&e.to_string());
        crate::error::amqp_error(e, format!("declare {what}{hint}"))
    }
}

/// What to do when the broker refuses a declare because an earlier version (or other settings) declared
/// the same name with other arguments, which RabbitMQ never changes in place.
pub(crate) fn upgrade_hint(refusal: &str) -> &'static str {
    if refusal.contains("inequivalent arg 'x-queue-type'") {
        " (it exists with another queue type, and a queue's type never changes: set queue_type to the \
         type it has, or drain and delete it so that it is declared again)"
    } else if declared_without_limit(refusal) {
        " (it exists without an explicit delivery limit, declared by an earlier version)"
    } else {
        ""
    }
}

/// Whether `refusal` (a declare's error) says the queue exists without the `x-delivery-limit` asked for:
/// a quorum queue declared by an earlier version, which is then declared as it is (see
/// [`HELD_WITHOUT_LIMIT`]).
pub(crate) fn declared_without_limit(refusal: &str) -> bool {
    refusal.contains("inequivalent arg 'x-delivery-limit'")
        && refusal.contains("but current is none")
}

/// What the log says when a quorum queue whose messages are given back (the DLQ, the ladder) exists
/// without a delivery limit and is declared as it is.
pub(crate) const HELD_WITHOUT_LIMIT: &str = "a quorum queue exists without an explicit \
    x-delivery-limit (declared by an earlier version) and is used as it is: RabbitMQ 4 drops a message \
    such a queue has given back 20 times (a DLQ entry listed 20 times). Give it a limit with a policy: \
    rabbitmqctl set_policy --apply-to quorum_queues event-retry-held '<its name>' \
    '{\"delivery-limit\":2147483647}'";

/// The arguments that give a queue `queue_type`.
pub(crate) fn type_args(queue_type: QueueType) -> Vec<(&'static str, AMQPValue)> {
    match queue_type {
        QueueType::Classic => vec![],
        QueueType::Quorum => vec![("x-queue-type", text("quorum"))],
    }
}

/// The delivery limit of the quorum queues whose messages the adapter gives back rather than fails:
/// the DLQ (listing it takes each entry and gives it back) and the delay ladder's levels and
/// unroutable queue (a mover gives back what it holds when it stops). A return is no failure there,
/// so the limit is out of reach: RabbitMQ 4 gives a quorum queue without one a limit of 20 and then
/// drops the message, and RabbitMQ 3, which has no default, reads RabbitMQ 4's "no limit" (-1) as a
/// limit of none at all, so one value must mean the same on both.
pub(crate) const HELD_DELIVERY_LIMIT: i64 = i32::MAX as i64;

/// The arguments of a queue of `queue_type` whose messages are given back rather than failed (see
/// [`HELD_DELIVERY_LIMIT`]): on quorum queues, an explicit delivery limit out of reach, unless `limit`
/// is false (the queue exists without one: [`declared_without_limit`]).
pub(crate) fn held_args(queue_type: QueueType, limit: bool) -> Vec<(&'static str, AMQPValue)> {
    let mut args = type_args(queue_type);
    if queue_type == QueueType::Quorum && limit {
        args.push((
            "x-delivery-limit",
            AMQPValue::LongLongInt(HELD_DELIVERY_LIMIT),
        ));
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_quorum_queues_get_the_held_delivery_limit() {
        assert!(held_args(QueueType::Classic, true).is_empty());
        assert_eq!(
            held_args(QueueType::Quorum, false),
            type_args(QueueType::Quorum)
        );
        let quorum = held_args(QueueType::Quorum, true);
        assert_eq!(quorum[0].0, "x-queue-type");
        assert_eq!(
            quorum[1],
            ("x-delivery-limit", AMQPValue::LongLongInt(2_147_483_647))
        );
    }

    #[test]
    fn a_refused_redeclare_says_how_to_upgrade() {
        let queue = "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'orders:billing' \
                     in vhost '/': received the value 'quorum' of type 'longstr' but current is none";
        assert!(upgrade_hint(queue).contains("set queue_type"));
        let none = "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue \
                    'orders.dlq' in vhost '/': received the value '2147483647' of type 'long' but \
                    current is none";
        assert!(declared_without_limit(none));
        assert!(upgrade_hint(none).contains("declared by an earlier version"));
        // Another limit than the one asked for is a setting changed, not an earlier version's queue.
        let other = "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue \
                     'orders:billing' in vhost '/': received the value '50' of type 'long' but current \
                     is the value '1000' of type 'long'";
        assert!(!declared_without_limit(other));
        assert_eq!(upgrade_hint(other), "");
        assert_eq!(upgrade_hint("NOT_FOUND - no queue 'x'"), "");
    }
}
