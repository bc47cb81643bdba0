//! Metadata header names, identical on every broker.
//!
//! Separate from the codec because more than the codec reads them: every adapter writes its own
//! headers under these names, and a broker codec that interns names builds on the full list here.

/// Event id, used for idempotency and tracing.
pub const EVENT_ID: &str = "x-retry-event-id";
/// Handler calls that failed so far.
pub const ATTEMPTS: &str = "x-retry-attempts";
/// Retries scheduled through the broker so far.
pub const RETRIES: &str = "x-retry-retries";
/// When the SDK first saw the event (ms since the epoch).
pub const FIRST_SEEN: &str = "x-retry-first-seen";
/// When the event is due for its next attempt (ms since the epoch).
pub const DUE_AT: &str = "x-retry-due-at";
/// Topic or queue the event was first consumed from.
pub const ORIGIN_TOPIC: &str = "x-retry-origin-topic";
/// Partition of the origin, where the broker has partitions.
pub const ORIGIN_PARTITION: &str = "x-retry-origin-partition";
/// Offset of the origin, where the broker has offsets.
pub const ORIGIN_OFFSET: &str = "x-retry-origin-offset";
/// The origin record's own timestamp (ms since the epoch), where the broker stamps records (Kafka):
/// a copy is stamped anew (the broker's retention counts from a record's stamp), so the original's
/// travels here.
pub const ORIGIN_TIMESTAMP: &str = "x-retry-origin-timestamp";
/// What the origin's timestamp is: `create-time` (the producer's) or `log-append-time` (the broker's).
pub const ORIGIN_TIMESTAMP_TYPE: &str = "x-retry-origin-timestamp-type";
/// The last handler error, bounded in length.
pub const LAST_ERROR: &str = "x-retry-last-error";
/// The kind of the last handler error.
pub const ERROR_KIND: &str = "x-retry-error-kind";
/// The last delay applied, in ms (decorrelated jitter needs it).
pub const LAST_DELAY: &str = "x-retry-last-delay-ms";
/// How many times an operator replayed the event from a DLQ.
pub const REPLAY_COUNT: &str = "x-retry-replay-count";
/// When an operator last replayed the event (ms since the epoch); a policy's time budget counts from it.
pub const REPLAYED_AT: &str = "x-retry-replayed-at";
/// Event id of the event this one is parked behind (per-key ordering).
pub const PARKED_BEHIND: &str = "x-retry-parked-behind";
/// Why the event was dead-lettered.
pub const DEAD_REASON: &str = "x-retry-dead-reason";
/// When it was dead-lettered (ms since the epoch).
pub const DEAD_AT: &str = "x-retry-dead-at";
/// Which consumer dead-lettered it.
pub const DEAD_CONSUMER: &str = "x-retry-dead-consumer";
/// On a DLQ entry moved from another broker: the entry it was copied from (`<transport>:<topic>:<id>`).
pub const MIGRATED_FROM: &str = "x-retry-migrated-from";

/// Every metadata field's header, in the order the codec writes them.
pub const FIELDS: [&str; 20] = [
    EVENT_ID,
    ATTEMPTS,
    RETRIES,
    FIRST_SEEN,
    DUE_AT,
    ORIGIN_TOPIC,
    ORIGIN_PARTITION,
    ORIGIN_OFFSET,
    ORIGIN_TIMESTAMP,
    ORIGIN_TIMESTAMP_TYPE,
    LAST_ERROR,
    ERROR_KIND,
    LAST_DELAY,
    REPLAY_COUNT,
    REPLAYED_AT,
    PARKED_BEHIND,
    MIGRATED_FROM,
    DEAD_REASON,
    DEAD_AT,
    DEAD_CONSUMER,
];

/// All metadata in one header holding a JSON object (SQS, whose messages carry ten attributes).
pub const PACKED: &str = super::PACKED;
/// The order and repeats of a producer's headers on a broker whose headers are a map
/// ([`crate::layout`]).
pub const LAYOUT: &str = "x-retry-layout";

/// The consumer group that dead-lettered an entry, or that a retry copy returns to (Kafka, RabbitMQ,
/// Pulsar).
pub const GROUP: &str = "x-retry-group";
/// The event's key, where the broker's own message has no key field (RabbitMQ, SQS).
pub const KEY: &str = "x-retry-key";
/// A DLQ entry's id, where the broker gives a message none that survives a read (RabbitMQ).
pub const DLQ_ENTRY: &str = "x-retry-dlq-entry";
/// How the body was written, where the broker's body is text (SQS: base64 for binary payloads).
pub const BODY: &str = "x-retry-body";
/// Names the properties whose values were base64-encoded, where the broker's properties are text
/// (Pulsar).
pub const BINARY: &str = "x-retry-binary";
/// Marks a copy that carries a delay the broker's own mechanism could not (SQS).
pub const COPY: &str = "x-retry-copy";
/// The topic a copy in the delay ladder returns to (Kafka).
pub const ROUTE_TO: &str = "x-retry-route-to";
/// When a copy in the delay ladder is due back (Kafka).
pub const ROUTE_DUE: &str = "x-retry-route-due";
/// When a copy is due out of its current ladder level (Kafka).
pub const HOP_DUE: &str = "x-retry-hop-due";
/// An AMQP `expiration` kept as a header, so the broker does not drop the copy (RabbitMQ).
pub const AMQP_EXPIRATION: &str = "x-retry-amqp-expiration";
/// An AMQP `user-id` naming another user than the SDK's connection (RabbitMQ).
pub const AMQP_USER_ID: &str = "x-retry-amqp-user-id";

/// The header names the SDK writes besides the metadata fields: the packed form, the layout and
/// the adapters' own.
pub const OTHERS: [&str; 13] = [
    PACKED,
    LAYOUT,
    GROUP,
    KEY,
    DLQ_ENTRY,
    BODY,
    BINARY,
    COPY,
    ROUTE_TO,
    ROUTE_DUE,
    HOP_DUE,
    AMQP_EXPIRATION,
    AMQP_USER_ID,
];

/// Every header name the SDK writes on any broker: [`FIELDS`], then [`OTHERS`]. A producer may not
/// use them (they would be overwritten), and a broker codec that interns names builds on this list.
pub const ALL: [&str; FIELDS.len() + OTHERS.len()] = concat(FIELDS, OTHERS);

/// The SDK's own static name equal to `name`, if it is one of [`ALL`]: what a broker codec that
/// interns names (so the SDK's headers cost no allocation per message) looks up for every header
/// of every message. A name outside the namespace — most of a producer's — is told from its first
/// bytes, without a comparison with each of the SDK's names.
///
/// ```
/// use event_retry_core::metadata::names;
///
/// assert_eq!(names::interned("x-retry-attempts"), Some(names::ATTEMPTS));
/// assert_eq!(names::interned("content-type"), None);
/// assert_eq!(names::interned("x-retry-unknown"), None);
/// ```
pub fn interned(name: &str) -> Option<&'static str> {
    if !name.starts_with(PACKED) {
        return None;
    }
    ALL.iter().copied().find(|known| *known == name)
}

/// `a` followed by `b`, at compile time.
const fn concat<const A: usize, const B: usize, const C: usize>(
    a: [&'static str; A],
    b: [&'static str; B],
) -> [&'static str; C] {
    assert!(A + B == C, "the lengths do not add up");
    let mut out = [""; C];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < B {
        out[A + j] = b[j];
        j += 1;
    }
    out
}
