//! Consumer groups through Amazon SNS (the `sns` setting).
//!
//! SQS has no consumer groups: the consumers of one queue compete for its messages. The AWS way to give
//! each group every event is a topic in SNS with one queue per group subscribed to it. With `sns` on, a
//! topic is an SNS topic of that name and publishing sends to it; each group has a queue of its own,
//! subscribed with raw message delivery (the message attributes arrive as the queue's message attributes,
//! unchanged) and a queue policy that lets the topic send to it, and its own DLQ and redrive policy.
//! Retries are the group queue's own (visibility changes and carried copies), dead letters go to the
//! group's DLQ, and a replay goes back to the group's queue — never through the topic, which would hand
//! it to every group again.
//!
//! The default group's queue is named as the topic, so a queue used before the setting was on becomes
//! the default group's; another group's is `<topic>-<group>`. The groups of a topic are the queues
//! subscribed to it, which is how a DLQ operation finds every group's DLQ.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use aws_sdk_sns::Client;
use aws_sdk_sns::primitives::Blob;
use aws_sdk_sns::types::MessageAttributeValue;
use event_retry_core::adapter::default_group;
use event_retry_core::error::{Error, Kind};

use crate::codec::Outgoing;
use crate::error::sdk_error;

/// SQS's longest queue name.
const MAX_QUEUE_NAME: usize = 80;

/// The SNS side of a transport: the client, and the topics and subscriptions it made sure of.
pub(crate) struct Sns {
    client: Client,
    /// Topic name → ARN.
    arns: Mutex<HashMap<String, String>>,
    /// Queues this transport subscribed (or found subscribed), by queue name.
    subscribed: Mutex<HashSet<String>>,
}

/// The queue of consumer group `group` of `topic`: the topic's name for its default group,
/// `<topic>-<group>` for another. Refused when SQS would refuse the name (or its DLQ's, `dlq_suffix`
/// added), and for FIFO topics, which this setting does not carry yet.
pub(crate) fn group_queue(topic: &str, group: &str, dlq_suffix: &str) -> Result<String, Error> {
    if topic.ends_with(".fifo") {
        return Err(Error::new(
            Kind::Unsupported,
            format!(
                "{topic}: consumer groups through SNS take standard topics only (not FIFO ones) for now"
            ),
        ));
    }
    let name = if group == default_group(topic) {
        topic.to_string()
    } else {
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_');
        if group.is_empty() || !group.chars().all(allowed) {
            return Err(Error::new(
                Kind::Config,
                format!(
                    "consumer group {group:?}: with SNS a group names a queue, so it takes letters, digits, \
                     '-' and '_' only"
                ),
            ));
        }
        format!("{topic}-{group}")
    };
    if name.len() + dlq_suffix.len() > MAX_QUEUE_NAME {
        return Err(Error::new(
            Kind::Config,
            format!(
                "the queue of group {group:?} of {topic} would be {name:?}, and its DLQ {} characters \
                 long: SQS allows {MAX_QUEUE_NAME}; shorten the topic or the group",
                name.len() + dlq_suffix.len()
            ),
        ));
    }
    Ok(name)
}

/// The consumer group whose queue (see [`group_queue`]) is `queue`, if it is one of `topic`'s.
pub(crate) fn group_of_queue(topic: &str, queue: &str) -> Option<String> {
    if queue == topic {
        return Some(default_group(topic));
    }
    queue
        .strip_prefix(topic)
        .and_then(|rest| rest.strip_prefix('-'))
        .filter(|group| !group.is_empty())
        .map(str::to_string)
}

/// The policy that lets SNS topic `topic_arn` send to queue `queue_arn` (AWS refuses the delivery
/// otherwise).
pub(crate) fn queue_policy(queue_arn: &str, topic_arn: &str) -> String {
    serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "event-retry-sns",
            "Effect": "Allow",
            "Principal": { "Service": "sns.amazonaws.com" },
            "Action": "sqs:SendMessage",
            "Resource": queue_arn,
            "Condition": { "ArnEquals": { "aws:SourceArn": topic_arn } }
        }]
    })
    .to_string()
}

/// The message attributes of an SQS message as SNS's (the same names, data types and values).
fn sns_attributes(
    out: &Outgoing,
) -> Result<HashMap<String, MessageAttributeValue>, aws_sdk_sns::error::BuildError> {
    out.attributes
        .iter()
        .map(|(name, v)| {
            let mut b = MessageAttributeValue::builder().data_type(v.data_type());
            if let Some(text) = v.string_value() {
                b = b.string_value(text);
            }
            if let Some(bytes) = v.binary_value() {
                b = b.binary_value(Blob::new(bytes.as_ref().to_vec()));
            }
            b.build().map(|value| (name.clone(), value))
        })
        .collect()
}

impl Sns {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            arns: Mutex::new(HashMap::new()),
            subscribed: Mutex::new(HashSet::new()),
        }
    }

    fn cached_arn(&self, topic: &str) -> Option<String> {
        self.arns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(topic)
            .cloned()
    }

    fn remember_arn(&self, topic: &str, arn: &str) {
        self.arns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(topic.to_string(), arn.to_string());
    }

    /// Forgets what this transport knew of `topic`: its ARN and its subscriptions (it is being deleted,
    /// or was found missing).
    pub(crate) fn forget(&self, topic: &str) {
        let arn = self
            .arns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(topic);
        if let Some(arn) = arn {
            let prefix = format!("{arn}\u{0}");
            self.subscribed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|key| !key.starts_with(&prefix));
        }
    }

    /// The ARN of topic `topic`, creating the topic when `create` (SNS's create is idempotent) or
    /// finding it among the account's topics otherwise; `NotFound` when it does not exist.
    pub(crate) async fn topic_arn(&self, topic: &str, create: bool) -> Result<String, Error> {
        if let Some(arn) = self.cached_arn(topic) {
            return Ok(arn);
        }
        let arn = if create {
            self.client
                .create_topic()
                .name(topic)
                .send()
                .await
                .map_err(|e| sdk_error(&format!("create SNS topic {topic}"), e))?
                .topic_arn
                .ok_or_else(|| {
                    Error::new(
                        Kind::Other,
                        format!("create SNS topic {topic}: no ARN returned"),
                    )
                })?
        } else {
            self.find_topic(topic).await?.ok_or_else(|| {
                Error::new(
                    Kind::NotFound,
                    format!("SNS topic {topic} does not exist and creating queues is off"),
                )
            })?
        };
        self.remember_arn(topic, &arn);
        Ok(arn)
    }

    /// One cheap call that shows SNS answers and accepts the credentials.
    pub(crate) async fn check_reachable(&self) -> Result<(), Error> {
        self.client
            .list_topics()
            .send()
            .await
            .map(drop)
            .map_err(|e| sdk_error("list SNS topics", e))
    }

    /// The ARN of topic `topic` if it exists (read from the account's topics; nothing is created).
    pub(crate) async fn find_topic(&self, topic: &str) -> Result<Option<String>, Error> {
        if let Some(arn) = self.cached_arn(topic) {
            return Ok(Some(arn));
        }
        let suffix = format!(":{topic}");
        let mut token = None;
        loop {
            let page = self
                .client
                .list_topics()
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| sdk_error("list SNS topics", e))?;
            if let Some(arn) = page
                .topics()
                .iter()
                .filter_map(|t| t.topic_arn())
                .find(|arn| arn.ends_with(&suffix))
            {
                return Ok(Some(arn.to_string()));
            }
            token = page.next_token;
            if token.is_none() {
                return Ok(None);
            }
        }
    }

    fn subscription_key(topic_arn: &str, queue: &str) -> String {
        format!("{topic_arn}\u{0}{queue}")
    }

    /// Whether this transport already made sure `queue` is subscribed to `topic_arn`.
    pub(crate) fn knows_subscribed(&self, topic_arn: &str, queue: &str) -> bool {
        self.subscribed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&Self::subscription_key(topic_arn, queue))
    }

    /// Records that `queue` is subscribed to `topic_arn`.
    pub(crate) fn mark_subscribed(&self, topic_arn: &str, queue: &str) {
        self.subscribed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(Self::subscription_key(topic_arn, queue));
    }

    /// Subscribes queue `queue` (ARN `queue_arn`) to `topic_arn` with raw message delivery (SNS answers
    /// a repeated subscription with the existing one).
    pub(crate) async fn subscribe(
        &self,
        topic_arn: &str,
        queue: &str,
        queue_arn: &str,
    ) -> Result<(), Error> {
        self.client
            .subscribe()
            .topic_arn(topic_arn)
            .protocol("sqs")
            .endpoint(queue_arn)
            .attributes("RawMessageDelivery", "true")
            .return_subscription_arn(true)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("subscribe queue {queue} to {topic_arn}"), e))?;
        self.mark_subscribed(topic_arn, queue);
        Ok(())
    }

    /// The names of the queues subscribed to `topic_arn` (the topic's groups' queues).
    pub(crate) async fn subscribed_queues(&self, topic_arn: &str) -> Result<Vec<String>, Error> {
        let mut queues = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .client
                .list_subscriptions_by_topic()
                .topic_arn(topic_arn)
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| sdk_error(&format!("list the subscriptions of {topic_arn}"), e))?;
            queues.extend(
                page.subscriptions()
                    .iter()
                    .filter(|s| s.protocol() == Some("sqs"))
                    .filter_map(|s| s.endpoint())
                    .filter_map(|arn| arn.rsplit(':').next())
                    .map(str::to_string),
            );
            token = page.next_token;
            if token.is_none() {
                break;
            }
        }
        queues.sort();
        queues.dedup();
        Ok(queues)
    }

    /// Publishes `out` to the topic `topic_arn`; returns SNS's message id once SNS accepted it.
    pub(crate) async fn publish(
        &self,
        topic_arn: &str,
        out: Outgoing,
        operation: &str,
    ) -> Result<String, Error> {
        let attributes = sns_attributes(&out).map_err(|e| {
            Error::from_source(Kind::InvalidInput, e).with_operation(operation.to_string())
        })?;
        let sent = self
            .client
            .publish()
            .topic_arn(topic_arn)
            .message(out.body)
            .set_message_attributes(Some(attributes))
            .send()
            .await
            .map_err(|e| sdk_error(operation, e))?;
        Ok(sent.message_id.unwrap_or_default())
    }

    /// Deletes the topic (and with it its subscriptions).
    pub(crate) async fn delete_topic(&self, topic: &str, topic_arn: &str) -> Result<(), Error> {
        self.forget(topic);
        self.client
            .delete_topic()
            .topic_arn(topic_arn)
            .send()
            .await
            .map(drop)
            .map_err(|e| sdk_error(&format!("delete SNS topic {topic}"), e))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_default_group_s_queue_is_the_topic_s_name() {
        assert_eq!(
            group_queue("orders", "orders-consumers", "-dlq").unwrap(),
            "orders"
        );
        assert_eq!(
            group_queue("orders", "billing", "-dlq").unwrap(),
            "orders-billing"
        );
        assert_eq!(
            group_of_queue("orders", "orders").as_deref(),
            Some("orders-consumers")
        );
        assert_eq!(
            group_of_queue("orders", "orders-billing").as_deref(),
            Some("billing")
        );
        assert_eq!(group_of_queue("orders", "invoices-billing"), None);
        assert_eq!(group_of_queue("orders", "orders-"), None);
    }

    #[test]
    fn names_sqs_would_refuse_are_refused_here() {
        let bad_group = group_queue("orders", "billing team", "-dlq").unwrap_err();
        assert_eq!(bad_group.kind(), Kind::Config);
        let long = "g".repeat(70);
        let too_long = group_queue("orders", &long, "-dlq").unwrap_err();
        assert!(too_long.to_string().contains("SQS allows 80"), "{too_long}");
        let fifo = group_queue("orders.fifo", "billing", "-dlq").unwrap_err();
        assert_eq!(fifo.kind(), Kind::Unsupported);
    }

    #[test]
    fn the_policy_lets_only_the_topic_send() {
        let policy: serde_json::Value = serde_json::from_str(&queue_policy(
            "arn:aws:sqs:eu-west-1:1:orders",
            "arn:aws:sns:eu-west-1:1:orders",
        ))
        .unwrap();
        let statement = &policy["Statement"][0];
        assert_eq!(statement["Action"], "sqs:SendMessage");
        assert_eq!(
            statement["Condition"]["ArnEquals"]["aws:SourceArn"],
            "arn:aws:sns:eu-west-1:1:orders"
        );
    }

    #[test]
    fn attributes_keep_their_data_types_and_values() {
        use aws_sdk_sqs::types::MessageAttributeValue as SqsValue;
        let mut attributes = HashMap::new();
        attributes.insert(
            "n".to_string(),
            SqsValue::builder()
                .data_type("Number.int")
                .string_value("42")
                .build()
                .unwrap(),
        );
        attributes.insert(
            "b".to_string(),
            SqsValue::builder()
                .data_type("Binary")
                .binary_value(aws_sdk_sqs::primitives::Blob::new(vec![0xff, 0]))
                .build()
                .unwrap(),
        );
        let out = Outgoing {
            body: "x".into(),
            attributes,
        };
        let sns = sns_attributes(&out).unwrap();
        assert_eq!(sns["n"].data_type(), "Number.int");
        assert_eq!(sns["n"].string_value(), Some("42"));
        assert_eq!(
            sns["b"].binary_value().map(|b| b.as_ref().to_vec()),
            Some(vec![0xff, 0])
        );
    }
}
