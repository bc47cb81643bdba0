//! Creating, deleting and naming the topics behind a source topic.
//!
//! A source topic comes with its ladder, its DLQ and one retry topic per consumer group (see
//! [`crate::config`] for the names). Declaring creates what is missing with the source's partition count;
//! deleting removes the source, its ladder, its DLQ and the retry topic of every group the cluster has
//! one for: each topic named `<topic><retry_infix><group>`.
//!
//! Names alone are ambiguous: `orders.retry.billing` is the retry topic of `orders`' group `billing`,
//! but a service may also have declared a source of that name, whose DLQ, ladder and retry topics then
//! start with the same prefix. A source declared through the SDK always has its DLQ, so a name under
//! the prefix whose `<name><dlq_suffix>` exists is taken for such a source: it is kept, with every topic
//! named after it. A source of that name declared outside the SDK, without a DLQ, cannot be told from a
//! retry topic and is deleted.

use async_trait::async_trait;
use event_retry_core::adapter::{Admin, TopicNames};
use event_retry_core::error::Error;

use std::collections::HashSet;

use crate::KafkaTransport;
use crate::config::{KafkaConfig, check_name};

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
        doomed.extend(retry_topics_of(topic, &self.link.config, existing));
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

/// Of `existing`, the retry topics of `topic`'s groups: `<topic><retry_infix><group>`, the group part
/// not empty, except another source's topics (see the module docs): a name whose
/// `<name><dlq_suffix>` exists is such a source, and it and every topic named after it are kept.
fn retry_topics_of(topic: &str, config: &KafkaConfig, existing: Vec<String>) -> Vec<String> {
    let prefix = format!("{topic}{}", config.retry_infix);
    let all: HashSet<&str> = existing.iter().map(String::as_str).collect();
    let candidates: Vec<&str> = existing
        .iter()
        .map(String::as_str)
        .filter(|name| name.len() > prefix.len() && name.starts_with(&prefix))
        .collect();
    let sources: Vec<&str> = candidates
        .iter()
        .copied()
        .filter(|name| all.contains(format!("{name}{}", config.dlq_suffix).as_str()))
        .collect();
    let named_after = |name: &str, source: &str| {
        name.strip_prefix(source).is_some_and(|rest| {
            rest.is_empty()
                || rest == config.dlq_suffix
                || rest.starts_with(&config.delay_infix)
                || rest.starts_with(&config.retry_infix)
        })
    };
    candidates
        .into_iter()
        .filter(|name| !sources.iter().any(|source| named_after(name, source)))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::retry_topics_of;
    use crate::config::KafkaConfig;

    fn of(topic: &str, existing: &[&str]) -> Vec<String> {
        let existing = existing.iter().map(|n| n.to_string()).collect();
        retry_topics_of(topic, &KafkaConfig::default(), existing)
    }

    #[test]
    fn a_topics_retry_topics_are_those_named_after_it_with_a_group() {
        let existing = [
            "orders",
            "orders.dlq",
            "orders.delay-100ms.00",
            "orders.retry.billing",
            "orders.retry.shipping-v2",
            "orders.retry.",
            "orders-eu.retry.billing",
            "other.retry.billing",
        ];
        assert_eq!(
            of("orders", &existing),
            ["orders.retry.billing", "orders.retry.shipping-v2"]
        );
    }

    #[test]
    fn another_source_named_like_a_retry_topic_keeps_its_dlq_ladder_and_retry_topics() {
        // `orders.retry.billing` is a source of its own here: its DLQ says so.
        let existing = [
            "orders",
            "orders.retry.shipping",
            "orders.retry.billing",
            "orders.retry.billing.dlq",
            "orders.retry.billing.delay-100ms.00",
            "orders.retry.billing.delay-100ms.01",
            "orders.retry.billing.retry.audit",
        ];
        assert_eq!(of("orders", &existing), ["orders.retry.shipping"]);
    }

    #[test]
    fn a_group_whose_name_holds_an_infix_has_its_retry_topic_deleted_when_no_source_claims_it() {
        let existing = [
            "orders",
            "orders.retry.billing.retry.audit",
            "orders.retry.billing.dlq-readers",
            "orders.retry.eu.delay-team",
        ];
        assert_eq!(
            of("orders", &existing),
            [
                "orders.retry.billing.retry.audit",
                "orders.retry.billing.dlq-readers",
                "orders.retry.eu.delay-team"
            ]
        );
    }
}
