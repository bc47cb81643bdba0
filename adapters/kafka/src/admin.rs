//! Creating, deleting and naming the topics behind a source topic.
//!
//! A source topic comes with its ladder, its DLQ and one retry topic per consumer group (see
//! [`crate::config`] for the names). Declaring creates what is missing with the source's partition count;
//! deleting removes the source, its ladder and its DLQ. The retry topics of groups stay: their names
//! depend on groups the adapter cannot list.

use async_trait::async_trait;
use event_retry_core::adapter::{Admin, TopicNames};
use event_retry_core::error::Error;

use crate::KafkaTransport;
use crate::config::check_name;

#[async_trait]
impl Admin for KafkaTransport {
    async fn declare(&self, topic: &str, group: Option<&str>) -> Result<(), Error> {
        check_name("topic", topic)?;
        if let Some(group) = group {
            check_name("group", group)?;
        }
        self.link.ensure_topics(topic, group).await
    }

    async fn delete(&self, topic: &str) -> Result<(), Error> {
        check_name("topic", topic)?;
        let names = self.names(topic, None).await?;
        let mut doomed = names.delay;
        doomed.push(names.dlq);
        doomed.push(names.topic);
        self.link.delete_topics(&doomed).await
    }

    async fn names(&self, topic: &str, group: Option<&str>) -> Result<TopicNames, Error> {
        let config = &self.link.config;
        let mut names =
            TopicNames::new(topic, config.dlq_topic(topic)).with_delay(config.level_topics(topic));
        if let Some(group) = group {
            names = names.with_retry(config.retry_topic(topic, group));
        }
        Ok(names)
    }
}
