//! Declaring, deleting and naming a topic's queues.
//!
//! A topic is a queue of its name; its DLQ is the target of the queue's redrive policy when it has one
//! (so SQS's own safety net and the SDK's dead letters land in one place), `<topic><dlq_suffix>`
//! otherwise. Declaring resolves both (creating them with a redrive policy when `create_queues` is on);
//! deleting removes both with their messages. Consumer groups have no queues of their own on SQS:
//! consumers of one queue share its messages.

use async_trait::async_trait;
use event_retry_core::adapter::{Admin, TopicNames};
use event_retry_core::error::Error;

use crate::SqsTransport;

#[async_trait]
impl Admin for SqsTransport {
    async fn declare(&self, topic: &str, _group: Option<&str>) -> Result<(), Error> {
        self.link.queues.forget(topic);
        self.link.queues.resolve(topic).await.map(drop)
    }

    async fn delete(&self, topic: &str) -> Result<(), Error> {
        let dlq = self
            .link
            .queues
            .resolve(topic)
            .await
            .ok()
            .map(|q| q.dlq_name);
        self.link.queues.forget(topic);
        self.delete_queue(topic).await?;
        if let Some(dlq) = dlq {
            self.delete_queue(&dlq).await?;
        }
        Ok(())
    }

    async fn names(&self, topic: &str, _group: Option<&str>) -> Result<TopicNames, Error> {
        let queue = self.link.queues.resolve(topic).await?;
        Ok(TopicNames::new(topic, queue.dlq_name))
    }
}
