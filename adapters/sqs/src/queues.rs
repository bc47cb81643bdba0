//! Queue URLs, attributes and creation; the redrive policy check.
//!
//! A topic is a queue of that name. Its DLQ is the redrive policy's target when the queue has one (so the
//! broker's safety net and the SDK's dead letters land in the same place), `<topic><dlq_suffix>` otherwise.
//! With `create_queues`, a missing queue is created with its DLQ and a redrive policy.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName;
use event_retry_core::error::{Error, Kind};
use tracing::warn;

use crate::config::SqsConfig;

/// What the adapter knows about one source queue.
#[derive(Clone, Debug)]
pub(crate) struct QueueInfo {
    pub(crate) url: String,
    pub(crate) dlq_name: String,
    pub(crate) dlq_url: String,
    pub(crate) fifo: bool,
    /// How long SQS keeps a message (from its first send).
    pub(crate) retention: Duration,
    /// The redrive policy's `maxReceiveCount`, if the queue has one.
    pub(crate) max_receive_count: Option<u32>,
    /// The queue retries go through, with the `retry_queue` setting (standard queues only).
    pub(crate) retry: Option<RetryQueue>,
}

/// A source queue's retry queue (the `retry_queue` setting).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RetryQueue {
    pub(crate) name: String,
    pub(crate) url: String,
}

/// Resolves and caches queues.
pub(crate) struct Queues {
    pub(crate) client: Client,
    pub(crate) config: SqsConfig,
    known: Mutex<HashMap<String, QueueInfo>>,
}

use crate::error::{is_missing, sdk_error};

/// `orders` → `orders-dlq`; `orders.fifo` → `orders-dlq.fifo`.
pub(crate) fn dlq_name_for(topic: &str, suffix: &str) -> String {
    match topic.strip_suffix(".fifo") {
        Some(base) => format!("{base}{suffix}.fifo"),
        None => format!("{topic}{suffix}"),
    }
}

impl Queues {
    pub(crate) fn new(client: Client, config: SqsConfig) -> Self {
        Self {
            client,
            config,
            known: Mutex::new(HashMap::new()),
        }
    }

    fn cached(&self, topic: &str) -> Option<QueueInfo> {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(topic)
            .cloned()
    }

    /// Forgets `topic` (after its queues were deleted or changed).
    pub(crate) fn forget(&self, topic: &str) {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(topic);
    }

    /// The URL of queue `name`, if it exists.
    pub(crate) async fn url_of(&self, name: &str) -> Result<Option<String>, Error> {
        match self.client.get_queue_url().queue_name(name).send().await {
            Ok(out) => Ok(out.queue_url),
            Err(e) if is_missing(&e) => Ok(None),
            Err(e) => Err(sdk_error(&format!("look up queue {name}"), e)),
        }
    }

    async fn create(
        &self,
        name: &str,
        attributes: Vec<(QueueAttributeName, String)>,
    ) -> Result<String, Error> {
        let mut req = self.client.create_queue().queue_name(name);
        if name.ends_with(".fifo") {
            req = req.attributes(QueueAttributeName::FifoQueue, "true");
        }
        for (k, v) in attributes {
            req = req.attributes(k, v);
        }
        req.send()
            .await
            .map_err(|e| sdk_error(&format!("create queue {name}"), e))?
            .queue_url
            .ok_or_else(|| Error::new(Kind::Other, format!("create queue {name}: no URL returned")))
    }

    pub(crate) async fn arn_of(&self, url: &str) -> Result<String, Error> {
        self.client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| sdk_error("read a queue ARN", e))?
            .attributes
            .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
            .ok_or_else(|| Error::new(Kind::Other, format!("queue {url} has no ARN")))
    }

    /// Lets SNS topic `topic_arn` send to the queue at `url` (ARN `queue_arn`): sets the policy when the
    /// queue has none, and warns when its own policy does not name the topic (SNS's deliveries would be
    /// refused on AWS; the owner's policy is not overwritten).
    pub(crate) async fn allow_topic(
        &self,
        url: &str,
        queue_arn: &str,
        topic_arn: &str,
    ) -> Result<(), Error> {
        let policy = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::Policy)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("read the policy of {url}"), e))?
            .attributes
            .and_then(|a| a.get(&QueueAttributeName::Policy).cloned())
            .filter(|p| !p.trim().is_empty());
        match policy {
            None => self
                .client
                .set_queue_attributes()
                .queue_url(url)
                .attributes(
                    QueueAttributeName::Policy,
                    crate::sns::queue_policy(queue_arn, topic_arn),
                )
                .send()
                .await
                .map(drop)
                .map_err(|e| sdk_error(&format!("let {topic_arn} send to {url}"), e)),
            Some(policy) if !policy.contains(topic_arn) => {
                warn!(
                    queue = url,
                    topic = topic_arn,
                    "the queue has a policy of its own that does not name the SNS topic: SNS may be refused"
                );
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }

    fn redrive(&self, dlq_arn: &str) -> String {
        format!(
            r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"{}"}}"#,
            self.config.max_receive_count
        )
    }

    /// Creates the DLQ of `topic` if it is missing; returns its URL.
    pub(crate) async fn ensure_dlq(&self, dlq_name: &str) -> Result<String, Error> {
        match self.url_of(dlq_name).await? {
            Some(url) => Ok(url),
            None => self.create(dlq_name, Vec::new()).await,
        }
    }

    /// After a call found a queue of `topic` missing: when the source queue is gone too (an
    /// SQS-compatible server that restarted empty) and creating queues is on, creates the queue, its DLQ
    /// and redrive policy again and returns `true`. A DLQ deleted while its source queue stays is left
    /// missing (`false`): that is an outage the runtime holds consumption for, not something to paper over.
    pub(crate) async fn recreate_if_gone(&self, topic: &str) -> Result<bool, Error> {
        if !self.config.create_queues || self.url_of(topic).await?.is_some() {
            return Ok(false);
        }
        self.forget(topic);
        self.resolve(topic).await?;
        Ok(true)
    }

    /// Resolves `topic` (creating it and its DLQ when missing and allowed).
    pub(crate) async fn resolve(&self, topic: &str) -> Result<QueueInfo, Error> {
        if let Some(info) = self.cached(topic) {
            return Ok(info);
        }
        let url = match self.url_of(topic).await? {
            Some(url) => url,
            None if self.config.create_queues => {
                let dlq_name = dlq_name_for(topic, &self.config.dlq_suffix);
                let dlq_url = self.ensure_dlq(&dlq_name).await?;
                let arn = self.arn_of(&dlq_url).await?;
                self.create(
                    topic,
                    vec![(QueueAttributeName::RedrivePolicy, self.redrive(&arn))],
                )
                .await?
            }
            None => {
                return Err(Error::new(
                    Kind::NotFound,
                    format!("queue {topic} does not exist and creating queues is off"),
                ));
            }
        };
        let attributes = self
            .client
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("read the attributes of {topic}"), e))?
            .attributes
            .unwrap_or_default();
        let get = |name: QueueAttributeName| attributes.get(&name).cloned();
        let retention = get(QueueAttributeName::MessageRetentionPeriod)
            .and_then(|s| s.parse().ok())
            .map_or(Duration::from_secs(4 * 24 * 3600), Duration::from_secs);
        let fifo = get(QueueAttributeName::FifoQueue).is_some_and(|v| v == "true")
            || topic.ends_with(".fifo");
        let redrive = get(QueueAttributeName::RedrivePolicy)
            .map(|text| parse_redrive(&text))
            .transpose()?;
        let (dlq_name, max_receive_count) = match redrive {
            Some((target, count)) => (target, Some(count)),
            None => {
                let dlq_name = dlq_name_for(topic, &self.config.dlq_suffix);
                if self.config.set_redrive {
                    let dlq_url = self.ensure_dlq(&dlq_name).await?;
                    let arn = self.arn_of(&dlq_url).await?;
                    self.client
                        .set_queue_attributes()
                        .queue_url(&url)
                        .attributes(QueueAttributeName::RedrivePolicy, self.redrive(&arn))
                        .send()
                        .await
                        .map_err(|e| sdk_error(&format!("set the redrive policy of {topic}"), e))?;
                    (dlq_name, Some(self.config.max_receive_count))
                } else {
                    warn!(
                        queue = topic,
                        "the queue has no redrive policy: a message whose consumer keeps crashing is received forever"
                    );
                    (dlq_name, None)
                }
            }
        };
        let dlq_url = if self.config.create_queues {
            self.ensure_dlq(&dlq_name).await?
        } else {
            self.url_of(&dlq_name).await?.ok_or_else(|| {
                Error::new(
                    Kind::NotFound,
                    format!(
                        "the DLQ {dlq_name} of {topic} does not exist and creating queues is off"
                    ),
                )
            })?
        };
        let retry = if self.config.retry_queue && !fifo {
            Some(self.retry_queue(topic, &dlq_url).await?)
        } else {
            None
        };
        let info = QueueInfo {
            url,
            dlq_name,
            dlq_url,
            fifo,
            retention,
            max_receive_count,
            retry,
        };
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(topic.to_string(), info.clone());
        Ok(info)
    }
}

impl Queues {
    /// The retry queue of standard queue `topic`: created when missing and allowed, redriving to the
    /// source's DLQ (at `dlq_url`), so a copy whose consumer keeps crashing ends where the source's
    /// messages do.
    async fn retry_queue(&self, topic: &str, dlq_url: &str) -> Result<RetryQueue, Error> {
        let name = retry_name_for(topic, &self.config.retry_suffix)?;
        let url = match self.url_of(&name).await? {
            Some(url) => url,
            None if self.config.create_queues => {
                let arn = self.arn_of(dlq_url).await?;
                self.create(
                    &name,
                    vec![(QueueAttributeName::RedrivePolicy, self.redrive(&arn))],
                )
                .await?
            }
            None => {
                return Err(Error::new(
                    Kind::NotFound,
                    format!(
                        "the retry queue {name} of {topic} does not exist and creating queues is off \
                         (the retry_queue setting needs it)"
                    ),
                ));
            }
        };
        Ok(RetryQueue { name, url })
    }
}

/// The longest queue name SQS accepts.
const MAX_QUEUE_NAME: usize = 80;

/// `orders` → `orders-retry`; an error naming the way out when the name would be longer than SQS allows.
pub(crate) fn retry_name_for(topic: &str, suffix: &str) -> Result<String, Error> {
    let name = format!("{topic}{suffix}");
    if name.len() > MAX_QUEUE_NAME {
        return Err(Error::new(
            Kind::Config,
            format!(
                "the retry queue name {name} is longer than SQS's {MAX_QUEUE_NAME} characters: set a \
                 shorter retry_suffix, or retry_queue=false"
            ),
        ));
    }
    Ok(name)
}

/// The DLQ name and `maxReceiveCount` of a `RedrivePolicy` attribute.
pub(crate) fn parse_redrive(text: &str) -> Result<(String, u32), Error> {
    let bad = || Error::new(Kind::Config, format!("unreadable RedrivePolicy {text:?}"));
    let json: serde_json::Value = serde_json::from_str(text).map_err(|_| bad())?;
    let arn = json["deadLetterTargetArn"].as_str().ok_or_else(bad)?;
    let count = match &json["maxReceiveCount"] {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .and_then(|n| u32::try_from(n).ok())
    .ok_or_else(bad)?;
    let name = arn.rsplit(':').next().ok_or_else(bad)?.to_string();
    Ok((name, count))
}

/// Checks that the redrive policy moves a message to the DLQ only after the consumer's policy is spent:
/// `maxReceiveCount` must exceed the deliveries it needs (the first one plus one per deferred retry, plus
/// the receives a carried retry takes to be hidden again until due).
pub(crate) fn check_redrive(
    topic: &str,
    info: &QueueInfo,
    deliveries: Option<u32>,
    longest_delay: Option<Duration>,
    max_visibility: Duration,
) -> Result<(), Error> {
    let Some(max) = info.max_receive_count else {
        return Ok(());
    };
    // A delay longer than the visibility window is carried by a copy that is received (and hidden again)
    // about once per window before it is due.
    let hops = longest_delay
        .filter(|d| *d > max_visibility)
        .map_or(0, |d| {
            u32::try_from(d.as_secs().div_ceil(max_visibility.as_secs().max(1))).unwrap_or(u32::MAX)
        });
    match deliveries {
        Some(deliveries) if max <= deliveries.saturating_add(hops) => {
            let needed = deliveries.saturating_add(hops);
            Err(Error::new(
                Kind::Config,
                format!(
                    "the redrive policy of {topic} moves a message to {} after {max} receives, but the retry policy \
                 needs up to {needed} deliveries: raise maxReceiveCount above {needed} (leave room for restarts)",
                    info.dlq_name
                ),
            ))
        }
        Some(_) => Ok(()),
        None => {
            warn!(
                queue = topic,
                max_receive_count = max,
                "the retry policy has no retry limit; the redrive policy ends it after {max} receives"
            );
            Ok(())
        }
    }
}

/// Checks that SQS keeps a message as long as the policy's longest delay (its retention counts from the
/// send, and a carried retry is one message for its whole delay): otherwise SQS would delete it silently.
pub(crate) fn check_retention(
    topic: &str,
    info: &QueueInfo,
    longest_delay: Option<Duration>,
) -> Result<(), Error> {
    let Some(longest) = longest_delay else {
        return Ok(());
    };
    let room = Duration::from_secs(3_600);
    if longest + room > info.retention {
        return Err(Error::new(
            Kind::Config,
            format!(
                "{topic} keeps messages for {:?} (MessageRetentionPeriod), but the retry policy asks for a delay of \
             {longest:?}: raise the retention above the longest delay plus an hour, or shorten the policy",
                info.retention
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn redrive_policies_in_both_spellings() {
        let (name, n) =
            parse_redrive(r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:0000:orders-dlq","maxReceiveCount":"5"}"#).unwrap();
        assert_eq!((name.as_str(), n), ("orders-dlq", 5));
        let (_, n) =
            parse_redrive(r#"{"deadLetterTargetArn":"arn:x:q","maxReceiveCount":7}"#).unwrap();
        assert_eq!(n, 7);
        assert!(parse_redrive("nope").is_err());
    }

    #[test]
    fn a_redrive_that_cuts_the_policy_short_is_refused() {
        let info = QueueInfo {
            url: "u".into(),
            dlq_name: "q-dlq".into(),
            dlq_url: "d".into(),
            fifo: false,
            retention: Duration::from_secs(60),
            max_receive_count: Some(4),
            retry: None,
        };
        let vis = Duration::from_secs(43_200);
        assert!(check_redrive("q", &info, Some(3), None, vis).is_ok());
        let err = check_redrive("q", &info, Some(4), None, vis)
            .unwrap_err()
            .to_string();
        assert!(err.contains("raise maxReceiveCount above 4"), "{err}");
        assert!(check_redrive("q", &info, None, None, vis).is_ok());
        // A 30 h retry is carried in 3 hops, each a receive of the copy.
        let err = check_redrive(
            "q",
            &info,
            Some(2),
            Some(Duration::from_secs(30 * 3600)),
            vis,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("above 5"), "{err}");
    }

    #[test]
    fn a_delay_beyond_the_retention_is_refused() {
        let info = QueueInfo {
            url: "u".into(),
            dlq_name: "q-dlq".into(),
            dlq_url: "d".into(),
            fifo: false,
            retention: Duration::from_secs(4 * 86_400),
            max_receive_count: None,
            retry: None,
        };
        assert!(check_retention("q", &info, Some(Duration::from_secs(86_400))).is_ok());
        let err = check_retention("q", &info, Some(Duration::from_secs(5 * 86_400))).unwrap_err();
        assert!(err.to_string().contains("MessageRetentionPeriod"), "{err}");
    }

    #[test]
    fn a_retry_queue_name_beyond_sqs_limit_is_refused() {
        assert_eq!(
            retry_name_for("orders", "-retry").ok().as_deref(),
            Some("orders-retry")
        );
        let long = "q".repeat(75);
        let err = retry_name_for(&long, "-retry").err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("retry_suffix")));
    }

    #[test]
    fn dlq_names_keep_the_fifo_suffix() {
        assert_eq!(dlq_name_for("orders", "-dlq"), "orders-dlq");
        assert_eq!(dlq_name_for("orders.fifo", "-dlq"), "orders-dlq.fifo");
    }
}
