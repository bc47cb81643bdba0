//! Where a newly assigned partition starts, said to librdkafka with the assignment.
//!
//! librdkafka starts an assigned partition at its committed offset; a partition with none (a new
//! group, a partition added since, a retry topic never used) goes through its offset reset, which it
//! schedules after the backoff it keeps for a reset after an error, taken here for "no previously
//! committed offset" too: the partition's first record waits that backoff out. When the assignment
//! itself names the reset position (`auto.offset.reset` as a logical offset), librdkafka queries it at
//! once. So each member reads its new partitions' committed offsets in the rebalance
//! callback and names the reset position of those that have none; a partition with a committed offset,
//! or whose offset could not be read, is left to librdkafka, which reads it again (one round trip to
//! the group's coordinator more than before for such a partition; naming the committed offset itself
//! would lose the leader epoch librdkafka checks it against, which rdkafka cannot pass).
//!
//! librdkafka's own path waits for this member's commits in flight before it reads the committed
//! offsets; this read does not need to: every commit of the adapter's consumers that can precede an
//! assignment is synchronous (the source's on revocation, the ladder's and the transactional hops' on
//! every flush), and a transaction's offsets not yet stable are asked for again by librdkafka until
//! they are; if they are not within [`COMMITTED_WAIT`] (or librdkafka's retries), the read fails or
//! marks the partition with the error, either of which leaves it to librdkafka. An asynchronous
//! commit on revocation would race this read: a partition's first commit landing after it would
//! restart the partition at the beginning.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::warn;

/// How long reading the committed offsets of a new assignment may take before the assignment goes to
/// librdkafka as it came (which then reads them itself). The rebalance callback waits for it, and with
/// the cooperative protocol (the ladder's) librdkafka holds the member's other partitions meanwhile; a
/// pending transaction's offsets are read again until they are stable, or until this bound.
const COMMITTED_WAIT: Duration = Duration::from_secs(1);

/// The position `auto.offset.reset` names for a partition with no committed offset, as librdkafka
/// reads the setting (any case; its default is the latest offset); `None` for `error`, which has no
/// position.
pub(crate) fn reset_position(config: &ClientConfig) -> Option<Offset> {
    let setting = config
        .get("auto.offset.reset")
        .unwrap_or("latest")
        .to_ascii_lowercase();
    match setting.as_str() {
        "smallest" | "earliest" | "beginning" => Some(Offset::Beginning),
        "largest" | "latest" | "end" => Some(Offset::End),
        _ => None,
    }
}

/// Sets `reset` as the start of every partition of `assignment` that has no committed offset (and no
/// start of its own), reading the committed offsets from the group's coordinator; leaves the
/// assignment as it is if they cannot be read.
fn name_start_positions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    assignment: &mut TopicPartitionList,
    reset: Offset,
) {
    if assignment.count() == 0 {
        return;
    }
    let committed = match consumer.committed_offsets(assignment.clone(), COMMITTED_WAIT) {
        Ok(committed) => committed,
        Err(e) => {
            warn!(error = %e, "reading the committed offsets of a new assignment failed; librdkafka reads them itself");
            return;
        }
    };
    for e in committed.elements() {
        let unset = assignment
            .find_partition(e.topic(), e.partition())
            .is_some_and(|a| a.offset() == Offset::Invalid);
        if unset && e.error().is_ok() && e.offset() == Offset::Invalid {
            // The partition is in the list (found above), so setting its offset cannot fail.
            let _ = assignment.set_partition_offset(e.topic(), e.partition(), reset);
        }
    }
}

/// A consumer context's rebalance as rdkafka's default runs it (`pre_rebalance`, the assignment
/// change, `post_rebalance`), with the start of each newly assigned partition that has no committed
/// offset named as `reset` (see the module's docs); `post_rebalance` sees those starts in the list.
pub(crate) fn rebalance<C: ConsumerContext>(
    context: &C,
    consumer: &BaseConsumer<C>,
    err: RDKafkaRespErr,
    partitions: &mut TopicPartitionList,
    reset: Option<Offset>,
) {
    let assign = err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
    context.pre_rebalance(consumer, &as_rebalance(err, partitions));
    if let (true, Some(reset)) = (assign, reset) {
        name_start_positions(consumer, partitions, reset);
    }
    let cooperative = matches!(
        consumer.rebalance_protocol(),
        RebalanceProtocol::Cooperative
    );
    let changed = match (assign, cooperative) {
        (true, true) => consumer.incremental_assign(partitions),
        (true, false) => consumer.assign(partitions),
        (false, true) => consumer.incremental_unassign(partitions),
        (false, false) => consumer.unassign(),
    };
    if let Err(e) = changed {
        warn!(error = %e, assign, "applying a rebalance failed");
    }
    context.post_rebalance(consumer, &as_rebalance(err, partitions));
}

/// What librdkafka's rebalance callback said, as rdkafka hands it to `pre_rebalance` and
/// `post_rebalance`.
fn as_rebalance(err: RDKafkaRespErr, partitions: &TopicPartitionList) -> Rebalance<'_> {
    match err {
        RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Rebalance::Assign(partitions),
        RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Rebalance::Revoke(partitions),
        _ => Rebalance::Error(KafkaError::Rebalance(err.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_reset(value: Option<&str>) -> Option<Offset> {
        let mut config = ClientConfig::new();
        if let Some(value) = value {
            config.set("auto.offset.reset", value);
        }
        reset_position(&config)
    }

    #[test]
    fn the_reset_setting_names_a_position_as_librdkafka_reads_it() {
        for earliest in ["smallest", "earliest", "beginning"] {
            assert_eq!(with_reset(Some(earliest)), Some(Offset::Beginning));
        }
        for latest in ["largest", "latest", "end"] {
            assert_eq!(with_reset(Some(latest)), Some(Offset::End));
        }
        assert_eq!(with_reset(Some("Earliest")), Some(Offset::Beginning));
        assert_eq!(with_reset(None), Some(Offset::End), "librdkafka's default");
        assert_eq!(with_reset(Some("error")), None);
    }

    /// A consumer of librdkafka's mock cluster, in group `billing`, with `orders` of two partitions, and
    /// offset 3 of partition 0 committed for the group.
    fn consumer_with_a_commit() -> (
        rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
        BaseConsumer,
    ) {
        let cluster = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("orders", 2, 1).expect("topic");
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("group.id", "billing")
            .create()
            .expect("consumer");
        let mut committed = TopicPartitionList::new();
        committed
            .add_partition_offset("orders", 0, Offset::Offset(3))
            .expect("offset");
        consumer
            .commit(&committed, rdkafka::consumer::CommitMode::Sync)
            .expect("commit");
        (cluster, consumer)
    }

    fn both_partitions() -> TopicPartitionList {
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition("orders", 0);
        assignment.add_partition("orders", 1);
        assignment
    }

    fn start_of(assignment: &TopicPartitionList, partition: i32) -> Offset {
        assignment
            .find_partition("orders", partition)
            .expect("in the assignment")
            .offset()
    }

    #[test]
    fn only_a_partition_with_no_committed_offset_is_given_the_reset_position() {
        let (_cluster, consumer) = consumer_with_a_commit();
        let mut assignment = both_partitions();
        name_start_positions(&consumer, &mut assignment, Offset::Beginning);
        assert_eq!(
            start_of(&assignment, 0),
            Offset::Invalid,
            "committed: librdkafka's"
        );
        assert_eq!(start_of(&assignment, 1), Offset::Beginning);
    }

    #[test]
    fn committed_offsets_that_cannot_be_read_leave_the_assignment_to_librdkafka() {
        let (cluster, consumer) = consumer_with_a_commit();
        cluster.request_errors(
            rdkafka::types::RDKafkaApiKey::OffsetFetch,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED],
        );
        let mut assignment = both_partitions();
        name_start_positions(&consumer, &mut assignment, Offset::Beginning);
        assert_eq!(start_of(&assignment, 0), Offset::Invalid);
        assert_eq!(start_of(&assignment, 1), Offset::Invalid);
    }
}
