//! The link to SQS shared by a transport's subscriptions, receipts and DLQ sessions: the client and the
//! queues (and SNS, with consumer groups through it), sending, and the metadata of visibility retries
//! this process scheduled (a visibility retry cannot rewrite the message, so the process keeps it).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use event_retry_core::error::{Error, Kind};
use event_retry_core::metadata::RetryMetadata;

use crate::codec::{Outgoing, UNKEYED_GROUP, group_of};
use crate::error::sdk_error;
use crate::queues::{QueueInfo, Queues};
use crate::sns::Sns;

/// Everything a transport's parts share.
pub(crate) struct Link {
    pub(crate) queues: Queues,
    /// SNS, when consumer groups go through it (the `sns` setting).
    pub(crate) sns: Option<Sns>,
    recall: Mutex<HashMap<String, (RetryMetadata, Instant)>>,
    /// When the retry copies this process sent become visible, soonest first (at most
    /// [`EXPECTED_COPIES`]): the retry queue is polled then rather than at its next idle poll.
    expected: Mutex<BinaryHeap<Reverse<Instant>>>,
}

/// How many copies' visibility times a process keeps for polling its retry queues at them; beyond it a
/// copy waits for the next idle poll (`SqsConfig::retry_poll`).
const EXPECTED_COPIES: usize = 10_000;

impl Link {
    pub(crate) fn new(queues: Queues, sns: Option<Sns>) -> Self {
        Self {
            queues,
            sns,
            recall: Mutex::new(HashMap::new()),
            expected: Mutex::new(BinaryHeap::new()),
        }
    }

    /// The SNS side; an error when the transport has none (a bug: callers check the setting first).
    fn sns(&self) -> Result<&Sns, Error> {
        self.sns.as_ref().ok_or_else(|| {
            Error::new(
                Kind::Config,
                "consumer groups through SNS need the `sns` setting and an SNS client".to_string(),
            )
        })
    }

    /// The queue consumers of `group` of `topic` receive from: the topic's queue, or with SNS the
    /// group's own queue, subscribed to the topic (see [`Link::group_queue`]). Its name and what is
    /// known of it.
    pub(crate) async fn source_queue(
        &self,
        topic: &str,
        group: &str,
    ) -> Result<(String, QueueInfo), Error> {
        if self.sns.is_some() {
            self.group_queue(topic, group).await
        } else {
            Ok((topic.to_string(), self.queues.resolve(topic).await?))
        }
    }

    /// With SNS, the queue of consumer group `group` of `topic` (see `crate::sns`): the topic, the queue
    /// with its DLQ and redrive policy, the policy that lets the topic send to it and the subscription
    /// are created when missing and creating queues is on; with it off each must exist already.
    pub(crate) async fn group_queue(
        &self,
        topic: &str,
        group: &str,
    ) -> Result<(String, QueueInfo), Error> {
        let sns = self.sns()?;
        let create = self.queues.config.create_queues;
        let name = crate::sns::group_queue(topic, group, &self.queues.config.dlq_suffix)?;
        let topic_arn = sns.topic_arn(topic, create).await?;
        let info = self.queues.resolve(&name).await?;
        if !sns.knows_subscribed(&topic_arn, &name) {
            if create {
                let queue_arn = self.queues.arn_of(&info.url).await?;
                self.queues
                    .allow_topic(&info.url, &queue_arn, &topic_arn)
                    .await?;
                sns.subscribe(&topic_arn, &name, &queue_arn).await?;
            } else if sns.subscribed_queues(&topic_arn).await?.contains(&name) {
                sns.mark_subscribed(&topic_arn, &name);
            } else {
                return Err(Error::new(
                    Kind::NotFound,
                    format!(
                        "queue {name} (group {group}) is not subscribed to SNS topic {topic} and creating \
                         queues is off"
                    ),
                ));
            }
        }
        Ok((name, info))
    }

    /// With SNS, the ARN of `topic` and its consumer groups as (queue, group): the queues subscribed to it
    /// that are named as its groups' queues. `None` when the topic does not exist.
    pub(crate) async fn groups_of(
        &self,
        topic: &str,
    ) -> Result<Option<(String, Vec<(String, String)>)>, Error> {
        let sns = self.sns()?;
        let Some(arn) = sns.find_topic(topic).await? else {
            return Ok(None);
        };
        let groups = sns
            .subscribed_queues(&arn)
            .await?
            .into_iter()
            .filter_map(|queue| crate::sns::group_of_queue(topic, &queue).map(|g| (queue, g)))
            .collect();
        Ok(Some((arn, groups)))
    }

    /// Publishes `event` to SNS topic `topic` (created when missing and allowed, with its default group's
    /// queue, so events published before the first consumer starts are kept).
    async fn publish_to_topic(
        &self,
        topic: &str,
        event: &event_retry_core::event::Event,
        operation: &str,
    ) -> Result<String, Error> {
        let sns = self.sns()?;
        let default = event_retry_core::adapter::default_group(topic);
        if self.queues.config.create_queues {
            self.group_queue(topic, &default).await?;
        } else {
            // Refuses what the setting does not carry (a FIFO topic) before anything is sent.
            crate::sns::group_queue(topic, &default, &self.queues.config.dlq_suffix)?;
        }
        let arn = sns
            .topic_arn(topic, self.queues.config.create_queues)
            .await?;
        let out = crate::codec::encode(event, None, false, false)?;
        let sent = sns.publish(&arn, out, operation).await;
        if sent.as_ref().is_err_and(|e| e.kind() == Kind::NotFound) {
            // The topic is gone: the next publish looks it up again (and creates it when allowed).
            sns.forget(topic);
        }
        sent
    }

    /// Sends `event`, a copy of a dead letter of consumer group `group` whose attributes are `native`, back
    /// to that group's queue of `topic` (with SNS: a replay reaches the group alone, never the topic).
    pub(crate) async fn send_to_group(
        &self,
        topic: &str,
        group: &str,
        event: &event_retry_core::event::Event,
        native: Option<&crate::codec::Attributes>,
    ) -> Result<String, Error> {
        let (name, queue) = self.group_queue(topic, group).await?;
        let out = crate::codec::encode(event, native, false, queue.fifo)?;
        let operation = format!("replay to {name} (group {group} of {topic})");
        let sent = self
            .send(&queue, &queue.url, out, SendOptions::default(), &operation)
            .await;
        if sent.as_ref().is_err_and(|e| e.kind() == Kind::NotFound) {
            self.forget_source(topic, &name);
        }
        sent
    }

    /// Forgets what is known of the queue `name` of `topic`, and with SNS of the topic too (after a call
    /// found one missing), so the next use looks both up again.
    pub(crate) fn forget_source(&self, topic: &str, name: &str) {
        self.queues.forget(name);
        if let Some(sns) = &self.sns {
            sns.forget(topic);
        }
    }

    /// Sends `out` to `url`, a queue of the same kind as `queue` (its own, or its DLQ).
    pub(crate) async fn send(
        &self,
        queue: &QueueInfo,
        url: &str,
        out: Outgoing,
        options: SendOptions,
        operation: &str,
    ) -> Result<String, Error> {
        let SendOptions {
            group,
            delay,
            deduplication,
        } = options;
        let mut req = self
            .queues
            .client
            .send_message()
            .queue_url(url)
            .message_body(out.body)
            .set_message_attributes(Some(out.attributes));
        if queue.fifo {
            req =
                req.message_group_id(group.unwrap_or_else(|| {
                    format!("{UNKEYED_GROUP}{}", uuid::Uuid::new_v4().simple())
                }))
                .message_deduplication_id(
                    deduplication.unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string()),
                );
        } else if !delay.is_zero() {
            let secs = seconds_up(delay.min(self.queues.config.max_send_delay));
            req = req.delay_seconds(secs);
        }
        let sent = req.send().await.map_err(|e| sdk_error(operation, e))?;
        Ok(sent.message_id().unwrap_or_default().to_string())
    }

    /// Sends `event` to `queue`'s DLQ as a dead letter (a copy of a message whose attributes are
    /// `native`, when given) and returns once SQS accepted it.
    pub(crate) async fn send_dead_letter(
        &self,
        queue: &QueueInfo,
        event: &event_retry_core::event::Event,
        native: Option<&crate::codec::Attributes>,
    ) -> Result<(), Error> {
        let out = crate::codec::encode(event, native, false, queue.fifo)?;
        let options = SendOptions {
            group: group_of(event.key.as_deref()),
            deduplication: dead_lettering_id(event.metadata()),
            ..SendOptions::default()
        };
        let operation = format!("dead-letter to {}", queue.dlq_name);
        self.send(queue, &queue.dlq_url, out, options, &operation)
            .await
            .map(drop)
    }

    /// Sends `event` to `topic` — a new message (with SNS, published to the topic), or (a DLQ replay) a
    /// copy of one whose attributes are `native`, to the queue named `topic` — and returns the message
    /// id.
    pub(crate) async fn send_event(
        &self,
        topic: &str,
        event: &event_retry_core::event::Event,
        native: Option<&crate::codec::Attributes>,
        operation: &str,
    ) -> Result<String, Error> {
        if self.sns.is_some() && native.is_none() {
            return self.publish_to_topic(topic, event, operation).await;
        }
        let queue = self.queues.resolve(topic).await?;
        let out = crate::codec::encode(event, native, false, queue.fifo)?;
        let options = SendOptions {
            group: group_of(event.key.as_deref()),
            ..SendOptions::default()
        };
        let sent = self.send(&queue, &queue.url, out, options, operation).await;
        if sent.as_ref().is_err_and(|e| e.kind() == Kind::NotFound) {
            // The queue is gone: the next send looks it up again (and creates it when allowed).
            self.queues.forget(topic);
        }
        sent
    }

    /// Remembers the metadata of a visibility retry of `message_id` until `until`, to give it back when
    /// the message returns to this process; `false` (nothing kept) when `remembered_retries` are
    /// already waiting.
    pub(crate) fn remember(&self, message_id: &str, meta: &RetryMetadata, until: Instant) -> bool {
        let capacity = self.queues.config.remembered_retries;
        let mut recall = self.recall.lock().unwrap_or_else(|p| p.into_inner());
        if recall.len() >= capacity {
            // Entries of messages that went to another process, or never came back, expire.
            let now = Instant::now();
            recall.retain(|_, (_, until)| *until > now);
        }
        if recall.len() >= capacity {
            return false;
        }
        recall.insert(message_id.to_string(), (meta.clone(), until));
        true
    }

    /// Takes what [`Link::remember`] kept for `message_id`.
    pub(crate) fn recall(&self, message_id: &str) -> Option<RetryMetadata> {
        let mut recall = self.recall.lock().unwrap_or_else(|p| p.into_inner());
        recall.remove(message_id).map(|(meta, _)| meta)
    }

    /// A retry copy sent now with `delay` becomes visible at this instant or before (SQS counts the delay,
    /// in whole seconds, from its receipt of the send, which came before now).
    pub(crate) fn expect_copy(&self, delay: Duration) {
        let seconds = seconds_up(delay.min(self.queues.config.max_send_delay));
        let at = Instant::now() + Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
        let mut expected = self.expected.lock().unwrap_or_else(|p| p.into_inner());
        if expected.len() < EXPECTED_COPIES {
            expected.push(Reverse(at));
        }
    }

    /// How long a retry queue's next poll waits after one that found nothing: until the soonest copy
    /// this process expects becomes visible, at most `idle` (copies of other processes, and those
    /// beyond the expected bound, are found by the idle polls). Copies already visible are taken off.
    pub(crate) fn retry_poll_pause(&self, idle: Duration) -> Duration {
        let now = Instant::now();
        let mut expected = self.expected.lock().unwrap_or_else(|p| p.into_inner());
        let mut due = false;
        while expected.peek().is_some_and(|Reverse(at)| *at <= now) {
            expected.pop();
            due = true;
        }
        if due {
            return Duration::ZERO;
        }
        expected.peek().map_or(idle, |Reverse(at)| {
            idle.min(at.saturating_duration_since(now))
        })
    }

    /// Forgets a visibility retry that did not happen.
    pub(crate) fn forget(&self, message_id: &str) {
        self.recall
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(message_id);
    }
}

/// How to send one message.
#[derive(Debug, Default)]
pub(crate) struct SendOptions {
    /// The FIFO message group (a new one per message when `None`).
    pub(crate) group: Option<String>,
    /// `DelaySeconds` (capped at the send limit; ignored on FIFO queues, which refuse it).
    pub(crate) delay: Duration,
    /// The FIFO deduplication id (a new one per message when `None`).
    pub(crate) deduplication: Option<String>,
}

/// The FIFO deduplication id of a dead letter: one per event id and replay count, so a FIFO DLQ drops
/// a second dead letter of the same dead-lettering (an event delivered again before its first dead
/// letter was settled) within SQS's five-minute window, and keeps the dead letter of a replayed event
/// that failed again (its replay count is higher). A hash, since SQS allows only 128 ASCII characters
/// and an event id may be anything; `None` for an event without an id.
fn dead_lettering_id(meta: &RetryMetadata) -> Option<String> {
    let id = meta.event_id.as_deref()?;
    let name = format!("{}\u{0}{id}", meta.replay_count);
    Some(
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes())
            .simple()
            .to_string(),
    )
}

/// A receive that asks for the system attributes the adapter reads (receive count, sent time, message
/// group), by both names the list has had: `MessageSystemAttributeNames`, and the older
/// `AttributeNames` that SQS still accepts and SQS-compatible servers (ElasticMQ 1.7) still read alone.
#[allow(deprecated)]
pub(crate) fn asking_system_attributes(
    receive: aws_sdk_sqs::operation::receive_message::builders::ReceiveMessageFluentBuilder,
) -> aws_sdk_sqs::operation::receive_message::builders::ReceiveMessageFluentBuilder {
    use aws_sdk_sqs::types::{MessageSystemAttributeName as System, QueueAttributeName as Old};
    receive
        .message_system_attribute_names(System::ApproximateReceiveCount)
        .message_system_attribute_names(System::SentTimestamp)
        .message_system_attribute_names(System::MessageGroupId)
        .attribute_names(Old::from("ApproximateReceiveCount"))
        .attribute_names(Old::from("SentTimestamp"))
        .attribute_names(Old::from("MessageGroupId"))
}

/// Whole seconds, rounded up (a delay is never shortened).
pub(crate) fn seconds_up(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_s_deduplication_id_is_one_per_dead_lettering() {
        let mut meta = RetryMetadata {
            event_id: Some("order-7 ✓".into()),
            ..RetryMetadata::default()
        };
        let first = dead_lettering_id(&meta).unwrap();
        assert_eq!(dead_lettering_id(&meta).as_deref(), Some(first.as_str()));
        assert!(first.len() <= 128 && first.chars().all(|c| c.is_ascii_alphanumeric()));
        meta.replay_count = 1;
        assert_ne!(
            dead_lettering_id(&meta).unwrap(),
            first,
            "a replay dead-letters anew"
        );
        meta.event_id = None;
        assert_eq!(dead_lettering_id(&meta), None);
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(seconds_up(Duration::from_millis(1)), 1);
        assert_eq!(seconds_up(Duration::from_secs(2)), 2);
        assert_eq!(seconds_up(Duration::from_millis(2_001)), 3);
        assert_eq!(seconds_up(Duration::ZERO), 0);
    }

    fn link_remembering(remembered_retries: usize) -> Link {
        let conf = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("eu-west-1"))
            .build();
        let config = crate::SqsConfig {
            remembered_retries,
            ..crate::SqsConfig::default()
        };
        Link::new(
            Queues::new(aws_sdk_sqs::Client::from_conf(conf), config),
            None,
        )
    }

    #[test]
    fn the_retry_queue_is_polled_when_an_expected_copy_becomes_visible() {
        let link = link_remembering(0);
        let idle = Duration::from_millis(200);
        assert_eq!(
            link.retry_poll_pause(idle),
            idle,
            "nothing expected: the idle poll"
        );
        // Visible in a whole second: the idle poll still comes first.
        link.expect_copy(Duration::from_millis(300));
        assert_eq!(link.retry_poll_pause(idle), idle);
        // Visible now (a copy without delay): polled at once, and taken off.
        link.expect_copy(Duration::ZERO);
        assert_eq!(link.retry_poll_pause(idle), Duration::ZERO);
        // The one due in a second is sooner than a long idle pause.
        let long = Duration::from_secs(5);
        let pause = link.retry_poll_pause(long);
        assert!(
            pause <= Duration::from_secs(1) && pause > Duration::from_millis(500),
            "{pause:?}"
        );
    }

    #[test]
    fn remembers_up_to_its_bound_and_makes_room_as_retries_expire() {
        let link = link_remembering(2);
        let meta = RetryMetadata {
            last_error: Some("boom".into()),
            ..RetryMetadata::default()
        };
        let later = Instant::now() + Duration::from_secs(600);
        assert!(link.remember("a", &meta, later));
        assert!(link.remember("b", &meta, Instant::now()));
        // Full: "b" has expired and makes room; then full with two live entries.
        assert!(link.remember("c", &meta, later));
        assert!(!link.remember("d", &meta, later), "beyond the bound");
        assert_eq!(
            link.recall("a").and_then(|m| m.last_error),
            Some("boom".into())
        );
        assert!(link.recall("b").is_none(), "expired entries are dropped");
        assert!(link.remember("d", &meta, later), "a recall makes room");
        assert!(
            !link_remembering(0).remember("x", &meta, later),
            "0 remembers nothing"
        );
    }
}
