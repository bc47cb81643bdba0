//! Declaring, deleting and naming a topic's queues.
//!
//! A topic is a durable work queue of its name with a DLQ queue beside it; the delay ladder is shared by
//! every topic of a transport's settings (its queues are named from the prefix, granularity and queue
//! type). Declaring is idempotent and also declares the ladder; deleting removes the work queue and the
//! DLQ with their messages, never the shared ladder. Consumer groups have no queues of their own here:
//! consumers of one topic share its work queue.

use async_trait::async_trait;
use retry_core::adapter::{Admin, TopicNames};
use retry_core::error::Error;

use crate::RabbitTransport;
use crate::topology::check_topic;

#[async_trait]
impl Admin for RabbitTransport {
    async fn declare(&self, topic: &str, _group: Option<&str>) -> Result<(), Error> {
        self.link.forget(topic);
        self.link.ensure_topic(topic).await
    }

    async fn delete(&self, topic: &str) -> Result<(), Error> {
        check_topic(&self.link.names, topic)?;
        self.link.forget(topic);
        for queue in [topic.to_string(), self.link.names.dlq(topic)] {
            self.delete_queue(&queue).await?;
        }
        Ok(())
    }

    async fn names(&self, topic: &str, _group: Option<&str>) -> Result<TopicNames, Error> {
        check_topic(&self.link.names, topic)?;
        let names = &self.link.names;
        let levels = (0..self.link.config.levels)
            .map(|k| names.level(k))
            .collect();
        Ok(TopicNames::new(topic, names.dlq(topic)).with_delay(levels))
    }
}
