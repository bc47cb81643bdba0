//! Where a newly assigned partition starts, said to librdkafka with the assignment.
//!
//! librdkafka starts an assigned partition at its committed offset; a partition with none (a new
//! group, a partition added since, a retry topic never used) goes through its offset reset, which it
//! schedules 100 ms later — the backoff it keeps for a reset after an error, taken here for "no
//! previously committed offset" too. Measured on the local broker (a new group, 1,000 records waiting):
//! the first record came 102 ms after the assignment that way, and 1–2 ms after it when the assignment
//! itself names the reset position (`auto.offset.reset` as a logical offset), which librdkafka then
//! queries at once. So each member reads its partitions' committed offsets when they are assigned
//! (the request librdkafka makes next anyway) and names the reset position of those that have none;
//! a partition with a committed offset, or whose offset could not be read, is left to librdkafka.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::warn;

/// How long reading the committed offsets of a new assignment may take before the assignment goes to
/// librdkafka as it came (which then reads them itself).
const COMMITTED_WAIT: Duration = Duration::from_secs(5);

/// The position `auto.offset.reset` names for a partition with no committed offset, as librdkafka
/// reads the setting (its default is the latest offset); `None` for `error`, which has no position.
pub(crate) fn reset_position(config: &ClientConfig) -> Option<Offset> {
    match config.get("auto.offset.reset").unwrap_or("latest") {
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
/// offset named as `reset` (see the module's docs).
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
        assert_eq!(with_reset(None), Some(Offset::End), "librdkafka's default");
        assert_eq!(with_reset(Some("error")), None);
    }
}
