//! Declaring and deleting topics and groups of the in-memory broker.

use async_trait::async_trait;

use super::MemoryTransport;
use super::broker::Broker;
use crate::adapter::{Admin, TopicNames};
use crate::error::Error;

#[async_trait]
impl Admin for MemoryTransport {
    /// Declares the topic with its default group, and `group` if given.
    async fn declare(&self, topic: &str, group: Option<&str>) -> Result<(), Error> {
        let mut state = self.broker.lock();
        let t = Broker::topic(&mut state, topic);
        if let Some(group) = group {
            t.group(group);
        }
        Ok(())
    }

    async fn delete(&self, topic: &str) -> Result<(), Error> {
        self.broker.delete(topic);
        Ok(())
    }

    async fn names(&self, topic: &str, _group: Option<&str>) -> Result<TopicNames, Error> {
        Ok(TopicNames::new(topic, format!("{topic} (dead letters)")))
    }
}
