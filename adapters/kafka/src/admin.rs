//! Creating, deleting and naming the topics behind a source topic.
//!
//! A source topic comes with its ladder, its DLQ and one retry topic per consumer group (see
//! [`crate::config`] for the names). Declaring creates what is missing with the source's partition count;
//! deleting removes the source, its ladder, its DLQ and the retry topic of every group the cluster has
//! one for: each topic named `<topic><retry_infix><group>` whose group part holds no `retry_infix` of
//! its own (that one would be a retry topic of another source, `<topic><retry_infix><group>` itself).

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
        let existing = self.link.topic_names().await?;
        doomed.extend(retry_topics_of(
            topic,
            &self.link.config.retry_infix,
            existing,
        ));
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

/// Of `existing`, the retry topics of `topic`'s groups: `<topic><infix><group>`, the group part neither
/// empty nor holding `infix` itself.
fn retry_topics_of(topic: &str, infix: &str, existing: Vec<String>) -> Vec<String> {
    let prefix = format!("{topic}{infix}");
    existing
        .into_iter()
        .filter(|name| {
            name.strip_prefix(&prefix)
                .is_some_and(|group| !group.is_empty() && !group.contains(infix))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::retry_topics_of;

    #[test]
    fn a_topics_retry_topics_are_those_of_its_groups_alone() {
        let existing = [
            "orders",
            "orders.retry.billing",
            "orders.retry.shipping-v2",
            "orders.retry.",
            "orders.retry.billing.retry.audit",
            "orders-eu.retry.billing",
            "orders.dlq",
            "other.retry.billing",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            retry_topics_of("orders", ".retry.", existing),
            ["orders.retry.billing", "orders.retry.shipping-v2"]
        );
    }
}
