//! Declaring and naming a topic's Pulsar topics.
//!
//! A topic comes with `<topic>-DLQ` and one retry topic per consumer group (`<topic>-<group>-RETRY`).
//! Declaring creates the DLQ's subscription for DLQ operations before anything is dead-lettered, the
//! subscription of the default consumer group (or of the group named) on the topic, and with a group
//! named, that group's retry topic with its subscription (Pulsar keeps messages only for the
//! subscriptions that exist when they arrive); the other topics are created by the broker on first
//! use. Deleting topics needs Pulsar's admin REST API, which the `pulsar` client
//! crate does not speak: `delete` says so instead of pretending.
//!
//! The admin REST API the adapter does speak, where it is given its URL, is the `rest` module: the
//! link creates subscriptions through it and the delay settings are read through it.

pub(crate) mod rest;

use async_trait::async_trait;
use event_retry_core::adapter::{Admin, TopicNames};
use event_retry_core::error::{Error, Kind};

use crate::PulsarTransport;

#[async_trait]
impl Admin for PulsarTransport {
    async fn declare(&self, topic: &str, group: Option<&str>) -> Result<(), Error> {
        self.link.forget(topic);
        self.link.ensure_topic(topic).await?;
        let Some(group) = group else {
            return Ok(());
        };
        self.link.ensure_group(topic, group).await?;
        // No consumer's start then creates a topic.
        self.link.ensure_retry_topic(topic, group).await
    }

    async fn delete(&self, topic: &str) -> Result<(), Error> {
        Err(Error::new(
            Kind::Unsupported,
            format!(
                "deleting {topic} needs Pulsar's admin REST API (DELETE /admin/v2/persistent/<tenant>/<namespace>/<topic>), \
                 which the pulsar client crate does not provide"
            ),
        ))
    }

    async fn names(&self, topic: &str, group: Option<&str>) -> Result<TopicNames, Error> {
        let config = &self.link.config;
        let mut names = TopicNames::new(config.full_name(topic), config.dlq_topic(topic));
        if let Some(group) = group {
            names = names.with_retry(config.retry_topic(topic, group));
        }
        Ok(names)
    }
}
