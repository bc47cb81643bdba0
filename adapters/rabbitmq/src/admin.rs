//! Declaring, deleting and naming a topic's queues.
//!
//! A topic is a fanout exchange of its name with a DLQ queue beside it, and a work queue and a retry queue
//! per consumer group (`<topic>:<group>`, `<topic>:<group>:retries`); the delay ladder is shared by every topic of a transport's settings (its
//! queues are named from the prefix, granularity and queue type). Declaring is idempotent and also
//! declares the ladder and the default group's queue; deleting removes the exchange, the DLQ and the
//! groups' queues this transport knows of (the default group's and those it declared) with their messages,
//! never the shared ladder.

use async_trait::async_trait;
use event_retry_core::adapter::{Admin, TopicNames, default_group};
use event_retry_core::error::Error;

use crate::RabbitTransport;
use crate::topics::check_topic;

#[async_trait]
impl Admin for RabbitTransport {
    async fn declare(&self, topic: &str, group: Option<&str>) -> Result<(), Error> {
        self.link.redeclare(topic);
        self.link.ensure_topic(topic).await?;
        match group {
            Some(group) => self.link.ensure_group(topic, group).await,
            None => Ok(()),
        }
    }

    async fn delete(&self, topic: &str) -> Result<(), Error> {
        check_topic(&self.link.names, topic)?;
        let names = &self.link.names;
        let mut groups = self.link.forget(topic);
        groups.push(default_group(topic));
        groups.sort();
        groups.dedup();
        for group in groups {
            self.delete_queue(&names.group_queue(topic, &group)).await?;
            self.delete_queue(&names.retry_queue(topic, &group)).await?;
        }
        self.delete_queue(&names.dlq(topic)).await?;
        self.delete_exchange(topic).await
    }

    /// The work queue of `group` (the default group's when `None`), the DLQ, the group's retry queue (the
    /// retry route) and the delay levels.
    async fn names(&self, topic: &str, group: Option<&str>) -> Result<TopicNames, Error> {
        check_topic(&self.link.names, topic)?;
        let names = &self.link.names;
        let group = group.map_or_else(|| default_group(topic), str::to_string);
        let levels = (0..self.link.config.levels)
            .map(|k| names.ladder.level(k))
            .collect();
        Ok(
            TopicNames::new(names.group_queue(topic, &group), names.dlq(topic))
                .with_retry(names.retry_queue(topic, &group))
                .with_delay(levels),
        )
    }
}
