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
    } else {
        ""
    }
}

/// The arguments that give a queue `queue_type`.
pub(crate) fn type_args(queue_type: QueueType) -> Vec<(&'static str, AMQPValue)> {
    match queue_type {
        QueueType::Classic => vec![],
        QueueType::Quorum => vec![("x-queue-type", text("quorum"))],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_redeclare_says_how_to_upgrade() {
        let queue = "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'orders:billing' \
                     in vhost '/': received the value 'quorum' of type 'longstr' but current is none";
        assert!(upgrade_hint(queue).contains("set queue_type"));
        assert_eq!(upgrade_hint("NOT_FOUND - no queue 'x'"), "");
    }
}
