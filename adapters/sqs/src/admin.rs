//! Declaring, deleting and naming a topic's queues.
//!
//! A topic is a queue of its name; its DLQ is the target of the queue's redrive policy when it has one
//! (so SQS's own safety net and the SDK's dead letters land in one place), `<topic><dlq_suffix>`
//! otherwise. Declaring resolves both (creating them with a redrive policy when `create_queues` is on),
//! and the retry queue with the `retry_queue` setting; deleting removes them with their messages. Without SNS, consumer groups have no queues of their own:
//! consumers of one queue share its messages. With SNS (see `crate::sns`) a topic is an SNS topic and
//! each group has a queue and a DLQ of its own: declaring makes sure of the group's (and the default
//! group's), deleting removes every subscribed group's queue and DLQ, then the topic.

use async_trait::async_trait;
use event_retry_core::adapter::{Admin, TopicNames, default_group};
use event_retry_core::error::Error;

use crate::SqsTransport;

impl SqsTransport {
    /// Deletes queue `name`, its DLQ (when it can still be read which one that is) and its retry queue.
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
        // Only with the setting on: without it a queue of that name is not this adapter's.
        let config = &self.link.queues.config;
        if config.retry_queue
            && !name.ends_with(".fifo")
            && let Ok(retry) = crate::queues::retry_name_for(name, &config.retry_suffix)
        {
            self.delete_queue(&retry).await?;
        }
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

    /// The group's queue (without SNS, the topic's queue every group shares), its DLQ and its retry
    /// queue (with the `retry_queue` setting, standard queues).
    async fn names(&self, topic: &str, group: Option<&str>) -> Result<TopicNames, Error> {
        let (name, queue) = if self.link.sns.is_some() {
            let group = group.map_or_else(|| default_group(topic), str::to_string);
            self.link.group_queue(topic, &group).await?
        } else {
            (topic.to_string(), self.link.queues.resolve(topic).await?)
        };
        let names = TopicNames::new(name, queue.dlq_name);
        Ok(match queue.retry {
            Some(retry) => names.with_retry(retry.name),
            None => names,
        })
    }
}
