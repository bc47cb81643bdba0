//! Declaring, deleting and naming a topic's queues.
//!
//! A topic is a queue of its name; its DLQ is the target of the queue's redrive policy when it has one
//! (so SQS's own safety net and the SDK's dead letters land in one place), `<topic><dlq_suffix>`
//! otherwise. Declaring resolves both (creating them with a redrive policy when `create_queues` is on);
//! deleting removes both with their messages. Without SNS, consumer groups have no queues of their own:
//! consumers of one queue share its messages. With SNS (see `crate::sns`) a topic is an SNS topic and
//! each group has a queue and a DLQ of its own: declaring makes sure of the group's (and the default
//! group's), deleting removes every subscribed group's queue and DLQ, then the topic.

use async_trait::async_trait;
use event_retry_core::adapter::{Admin, TopicNames, default_group};
use event_retry_core::error::Error;

use crate::SqsTransport;

impl SqsTransport {
    /// Deletes queue `name` and its DLQ (when it can still be read which one that is).
    async fn delete_with_dlq(&self, name: &str) -> Result<(), Error> {
        let dlq = self
            .link
            .queues
            .resolve(name)
            .await
            .ok()
            .map(|q| q.dlq_name);
        self.link.queues.forget(name);
        self.delete_queue(name).await?;
        if let Some(dlq) = dlq {
            self.delete_queue(&dlq).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl Admin for SqsTransport {
    async fn declare(&self, topic: &str, group: Option<&str>) -> Result<(), Error> {
        if self.link.sns.is_some() {
            let default = default_group(topic);
            for group in [Some(default.as_str()), group].into_iter().flatten() {
                let name =
                    crate::sns::group_queue(topic, group, &self.link.queues.config.dlq_suffix)?;
                self.link.forget_source(topic, &name);
                self.link.group_queue(topic, group).await?;
            }
            return Ok(());
        }
        self.link.queues.forget(topic);
        self.link.queues.resolve(topic).await.map(drop)
    }

    async fn delete(&self, topic: &str) -> Result<(), Error> {
        let Some(sns) = &self.link.sns else {
            return self.delete_with_dlq(topic).await;
        };
        let Some((arn, groups)) = self.link.groups_of(topic).await? else {
            return Ok(());
        };
        for (queue, _) in groups {
            self.delete_with_dlq(&queue).await?;
        }
        sns.delete_topic(topic, &arn).await
    }

    /// The group's queue (without SNS, the topic's queue every group shares) and its DLQ.
    async fn names(&self, topic: &str, group: Option<&str>) -> Result<TopicNames, Error> {
        if self.link.sns.is_some() {
            let group = group.map_or_else(|| default_group(topic), str::to_string);
            let (name, queue) = self.link.group_queue(topic, &group).await?;
            return Ok(TopicNames::new(name, queue.dlq_name));
        }
        let queue = self.link.queues.resolve(topic).await?;
        Ok(TopicNames::new(topic, queue.dlq_name))
    }
}
