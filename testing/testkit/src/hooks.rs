//! The container hooks of the four brokers this repository's adapters run against, for their
//! [`Adapter::container`](crate::Adapter::container): `Some` with the feature `testcontainers` (the
//! functions of [`containers`](crate::containers)), `None` without, so an adapter's test names its hook
//! once and builds either way.

use crate::suite::Container;

#[cfg(feature = "testcontainers")]
mod on {
    use crate::containers;
    use crate::suite::Container;

    pub(super) const KAFKA: Option<Container> = Some(containers::kafka);
    pub(super) const RABBITMQ: Option<Container> = Some(containers::rabbitmq);
    pub(super) const SQS: Option<Container> = Some(containers::sqs);
    pub(super) const PULSAR: Option<Container> = Some(containers::pulsar);
}

#[cfg(not(feature = "testcontainers"))]
mod on {
    use crate::suite::Container;

    pub(super) const KAFKA: Option<Container> = None;
    pub(super) const RABBITMQ: Option<Container> = None;
    pub(super) const SQS: Option<Container> = None;
    pub(super) const PULSAR: Option<Container> = None;
}

/// Apache Kafka.
pub const KAFKA: Option<Container> = on::KAFKA;
/// RabbitMQ.
pub const RABBITMQ: Option<Container> = on::RABBITMQ;
/// SQS (ElasticMQ).
pub const SQS: Option<Container> = on::SQS;
/// Apache Pulsar.
pub const PULSAR: Option<Container> = on::PULSAR;
