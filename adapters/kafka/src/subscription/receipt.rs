//! The receipts that settle a subscription's records.
//!
//! A receipt settles by reporting its offset to the consumer thread, which commits it once everything
//! before it in the partition is settled too. A retry is a copy produced into the delay ladder (or
//! straight to the retry topic when there is no delay) and a dead letter a copy produced to the DLQ,
//! each acknowledged by every in-sync replica of the idempotent producer before the offset is reported —
//! or, with transactional hops, handed to the consumer thread with the settle and committed with the
//! offset in one transaction.
//! A receipt dropped unsettled leaves its offset uncommitted: the record is consumed again when its
//! partition moves to another member or the group restarts.
//!
//! Kept apart from the subscription, which hands records out in order, because a receipt lives on
//! with its record on whatever task handles it and settles concurrently with the others.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use event_retry_core::adapter::{Receipt, Unsettled};
use event_retry_core::error::Error;
use event_retry_core::event::{Event, RawMessage};

use crate::codec::{self, Copied, Nulls};
use crate::consumer::context::Context;
use crate::consumer::offsets::Tp;
use crate::consumer::txn::StagedCopy;
use crate::link::Link;

/// What a subscription's receipts share (one reference count per record): the link and the consumer
/// thread they settle through, and the topics and group they settle to.
pub(super) struct Shared {
    pub(super) link: Arc<Link>,
    pub(super) context: Arc<Context>,
    pub(super) source: Arc<str>,
    pub(super) retry_topic: String,
    pub(super) dlq_topic: String,
    pub(super) group: String,
}

/// Where a record sits: what its settle reports to the consumer thread.
pub(super) struct Position {
    pub(super) tp: Tp,
    pub(super) offset: i64,
    pub(super) epoch: u64,
}

/// Settles one record.
pub(super) struct KafkaReceipt {
    pub(super) shared: Arc<Shared>,
    pub(super) partition: i32,
    pub(super) position: Unsettled<Position>,
    /// The record as copied, decoded again only if [`Receipt::release`] needs it whole (a clone of the
    /// decoded message per record would cost a header list and a reference count per header).
    pub(super) original: Copied,
    /// The record's headers whose value was null: every copy writes them null again.
    pub(super) nulls: Nulls,
}

impl KafkaReceipt {
    /// Reports the record settled; the consumer thread commits its offset once everything before it in
    /// the partition is settled too.
    fn finish(&mut self) -> Result<(), Error> {
        let p = self.position.take()?;
        // If the consumer is gone, the offset stays uncommitted and the record is consumed again.
        self.shared.context.settled(&p.tp, p.offset, p.epoch);
        Ok(())
    }

    /// Settles the record with a copy that comes back on the retry topic after `delay`.
    async fn delay(
        &mut self,
        raw: &RawMessage,
        delay: Duration,
        operation: &str,
    ) -> Result<(), Error> {
        if self.shared.context.transactional() {
            let (topic, extra) = self.shared.link.delayed_target(
                &self.shared.source,
                &self.shared.retry_topic,
                delay,
            );
            return self
                .finish_with_copy(topic, raw.clone(), extra, operation)
                .await;
        }
        self.shared
            .link
            .send_delayed(
                &self.shared.source,
                &self.shared.retry_topic,
                self.partition,
                codec::Outbound {
                    raw,
                    nulls: &self.nulls,
                },
                delay,
                operation,
            )
            .await?;
        self.finish()
    }

    /// Settles the record with a copy of `raw` to `topic`, produced in the transaction that commits its
    /// offset; returns once that transaction committed.
    async fn finish_with_copy(
        &mut self,
        topic: String,
        raw: RawMessage,
        extra: Vec<(&'static str, Vec<u8>)>,
        operation: &str,
    ) -> Result<(), Error> {
        // The copy keeps its record's partition: the topic's count must be known to place it.
        self.shared
            .link
            .partitions(&topic)
            .await
            .map_err(|e| e.with_operation(operation.to_string()))?;
        let p = self.position.get()?;
        let (tp, offset, epoch) = (p.tp.clone(), p.offset, p.epoch);
        let copy = StagedCopy {
            topic,
            partition: Some(self.partition),
            raw,
            nulls: self.nulls.clone(),
            extra,
        };
        self.shared
            .context
            .settled_with_copy(&tp, offset, epoch, copy)
            .await
            .map_err(|_| Error::closed())?
            .map_err(|e| e.with_operation(operation.to_string()))?;
        // Settled: the record is no longer this receipt's to release.
        self.position.take().map(drop)
    }
}

#[async_trait]
impl Receipt for KafkaReceipt {
    async fn ack(&mut self) -> Result<(), Error> {
        self.finish()
    }

    fn try_ack(&mut self) -> Option<Result<(), Error>> {
        Some(self.finish())
    }

    async fn retry(&mut self, event: &Event, delay: Duration) -> Result<(), Error> {
        self.position.get()?;
        let operation = format!("retry of {} through the delay ladder", self.shared.source);
        self.delay(&event.to_raw(), delay, &operation).await
    }

    async fn dead_letter(&mut self, event: &Event) -> Result<(), Error> {
        self.position.get()?;
        let dlq = self.shared.dlq_topic.clone();
        let operation = format!("dead-letter to {dlq}");
        let group = event_retry_core::metadata::names::GROUP;
        if self.shared.context.transactional() {
            let extra = vec![(group, self.shared.group.as_bytes().to_vec())];
            return self
                .finish_with_copy(dlq, event.to_raw(), extra, &operation)
                .await;
        }
        let extra = [(group, self.shared.group.as_bytes())];
        self.shared
            .link
            .send(
                &dlq,
                Some(self.partition),
                &event.to_raw(),
                &self.nulls,
                &extra,
                &operation,
            )
            .await?;
        self.finish()
    }

    async fn release(&mut self, after: Duration) -> Result<(), Error> {
        self.position.get()?;
        // Kafka cannot hand one record back: a copy comes back through the retry topic instead, and
        // if it cannot be produced the offset stays uncommitted.
        let original = self.original.clone().decode().raw;
        self.delay(&original, after, "release").await
    }
}
