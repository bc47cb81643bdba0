//! SQS read with aws-sdk-sqs itself: every message of a queue received with its attributes (and made
//! visible again at once).
//! SQS has no way to make one queue refuse sends but deleting it, so the DLQ is made unwritable by moving
//! its entries into the harness's count (received until a short poll finds none) and deleting the queue
//! at once; an entry that arrived in between would be lost by the harness, not the SDK.

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{ChangeMessageVisibilityBatchRequestEntry, Message, QueueAttributeName};

use super::{BoxError, RawBroker, RawEntry, payloads};

/// The SQS API's own client on the endpoint of an `http://host:port` URL.
pub struct RawSqs {
    client: Client,
}

/// A message as SQS holds it: the body and every message attribute's value (string or binary).
fn entry(m: &Message) -> RawEntry {
    let mut headers: Vec<(String, Vec<u8>)> = m
        .message_attributes()
        .map(|attributes| {
            attributes
                .iter()
                .map(|(name, v)| {
                    let bytes = match (v.string_value(), v.binary_value()) {
                        (Some(s), _) => s.as_bytes().to_vec(),
                        (None, Some(b)) => b.as_ref().to_vec(),
                        (None, None) => Vec::new(),
                    };
                    (name.clone(), bytes)
                })
                .collect()
        })
        .unwrap_or_default();
    headers.sort();
    RawEntry {
        payload: m.body().unwrap_or_default().as_bytes().to_vec(),
        key: None,
        headers,
    }
}

impl RawSqs {
    /// A client of the endpoint `url` with the local test credentials.
    pub fn new(url: &str) -> Self {
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(url)
            .credentials_provider(Credentials::new("test", "test", None, None, "static"))
            .build();
        Self {
            client: Client::from_conf(config),
        }
    }

    /// Deletes the queue named `queue` with whatever it holds, if it exists (a fault test's way to make
    /// a DLQ unwritable).
    pub async fn delete_queue(&self, queue: &str) -> Result<(), BoxError> {
        if let Some(url) = self.queue_url(queue).await? {
            self.client.delete_queue().queue_url(url).send().await?;
        }
        Ok(())
    }

    async fn queue_url(&self, queue: &str) -> Result<Option<String>, BoxError> {
        match self.client.get_queue_url().queue_name(queue).send().await {
            Ok(out) => Ok(out.queue_url),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_queue_does_not_exist()) =>
            {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Receives every visible message of `url`: (receipt handle, message) pairs, hidden for a minute. With
    /// `until_first_empty`, stops at the first empty short poll (moments before a delete, so that as
    /// little as possible can arrive in between); otherwise at the second empty long poll.
    async fn receive_all(
        &self,
        url: &str,
        until_first_empty: bool,
    ) -> Result<Vec<(String, RawEntry)>, BoxError> {
        let mut taken = Vec::new();
        let mut empty = 0;
        let (wait, empties) = if until_first_empty { (0, 1) } else { (1, 2) };
        while empty < empties {
            let out = self
                .client
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10)
                .visibility_timeout(60)
                .wait_time_seconds(wait)
                .message_attribute_names("All")
                .send()
                .await?;
            let messages = out.messages.unwrap_or_default();
            if messages.is_empty() {
                empty += 1;
                continue;
            }
            empty = 0;
            for m in messages {
                let entry = entry(&m);
                taken.push((m.receipt_handle.unwrap_or_default(), entry));
            }
        }
        Ok(taken)
    }
}

#[async_trait]
impl RawBroker for RawSqs {
    /// The queue's approximate counts of visible, in-flight (received, not deleted) and delayed messages
    /// (a queue is one group).
    async fn waiting(&self, queue: &str, _group: &str) -> Result<u64, BoxError> {
        let url = self
            .queue_url(queue)
            .await?
            .ok_or_else(|| format!("no queue {queue}"))?;
        let attributes = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await?
            .attributes
            .unwrap_or_default();
        let mut held = 0;
        for name in [
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            QueueAttributeName::ApproximateNumberOfMessagesDelayed,
        ] {
            if let Some(count) = attributes.get(&name) {
                held += count.parse::<u64>()?;
            }
        }
        Ok(held)
    }

    async fn messages(&self, queue: &str) -> Result<Vec<RawEntry>, BoxError> {
        let Some(url) = self.queue_url(queue).await? else {
            return Ok(Vec::new());
        };
        let taken = self.receive_all(&url, false).await?;
        // Visible again at once, for the next reader.
        for chunk in taken.chunks(10) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, (receipt, _))| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(receipt)
                        .visibility_timeout(0)
                        .build()
                })
                .collect::<Result<Vec<_>, _>>()?;
            self.client
                .change_message_visibility_batch()
                .queue_url(&url)
                .set_entries(Some(entries))
                .send()
                .await?;
        }
        Ok(taken.into_iter().map(|(_, entry)| entry).collect())
    }

    async fn refuse_dlq_writes(&self, dlq: &str) -> Result<Vec<String>, BoxError> {
        let Some(url) = self.queue_url(dlq).await? else {
            return Ok(Vec::new());
        };
        let taken = self.receive_all(&url, true).await?;
        // Deleted first, the entries being the harness's now: what arrives until the delete is lost to
        // the count.
        self.client.delete_queue().queue_url(&url).send().await?;
        Ok(payloads(
            taken.into_iter().map(|(_, entry)| entry).collect(),
        ))
    }

    async fn accept_dlq_writes(&self, _dlq: &str) -> Result<Vec<String>, BoxError> {
        // The harness declares the queue again.
        Ok(Vec::new())
    }
}
