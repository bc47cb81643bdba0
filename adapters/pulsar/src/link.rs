//! The client, one producer per topic (recreated after an error), and the DLQ subscription made before
//! anything is dead-lettered (Pulsar keeps messages for the subscriptions that exist when they arrive).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use event_retry_core::error::{Error, Kind};
use pulsar::consumer::InitialPosition;
use pulsar::{
    ConsumerOptions, Producer, ProducerOptions, Pulsar, SubType, TokioExecutor, producer,
};
use tokio::sync::Mutex;

use crate::config::PulsarConfig;
use crate::consumer_requests::{self, PulsarConsumer};
use crate::error::{error, kind_of, passing};

/// How long a send may wait for its receipt before it is an error.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

type SharedProducer = Arc<Mutex<Producer<TokioExecutor>>>;

/// How long a consumer that only makes a subscription is given to close before it is dropped (the
/// client then closes it in the background).
const CLOSE_PATIENCE: Duration = Duration::from_secs(10);

/// How long creating a subscription without the admin API keeps trying while the broker answers that
/// it is not ready (a topic loading, a broker restarting).
const DECLARE_PATIENCE: Duration = Duration::from_secs(30);

/// The shared state of one transport.
pub(crate) struct Link {
    pub(crate) client: Pulsar<TokioExecutor>,
    pub(crate) config: PulsarConfig,
    /// The service URL, for the declaring client.
    url: String,
    /// A second client, made on first use, whose subscribes are not retried by the client: it creates
    /// subscriptions without the admin API ([`Link::ensure_group`]).
    declaring: tokio::sync::OnceCell<Pulsar<TokioExecutor>>,
    producers: Mutex<HashMap<String, SharedProducer>>,
    declared: std::sync::Mutex<HashSet<String>>,
}

impl Link {
    pub(crate) fn new(client: Pulsar<TokioExecutor>, url: &str, config: PulsarConfig) -> Self {
        Self {
            client,
            config,
            url: url.to_string(),
            declaring: tokio::sync::OnceCell::new(),
            producers: Mutex::new(HashMap::new()),
            declared: std::sync::Mutex::new(HashSet::new()),
        }
    }

    async fn declaring_client(&self) -> Result<&Pulsar<TokioExecutor>, Error> {
        self.declaring
            .get_or_try_init(|| {
                crate::security::connect_without_retries(&self.url, &self.config.security)
            })
            .await
    }

    async fn producer(&self, topic: &str) -> Result<SharedProducer, Error> {
        let mut producers = self.producers.lock().await;
        if let Some(p) = producers.get(topic) {
            return Ok(p.clone());
        }
        let producer = self
            .client
            .producer()
            .with_topic(topic)
            // Under load a send waits for room in the connection rather than failing with SlowDown.
            .with_options(ProducerOptions {
                block_queue_if_full: true,
                ..ProducerOptions::default()
            })
            .build()
            .await
            .map_err(error(&format!("create a producer for {topic}")))?;
        let producer = Arc::new(Mutex::new(producer));
        producers.insert(topic.to_string(), producer.clone());
        Ok(producer)
    }

    async fn forget_producer(&self, topic: &str) {
        self.producers.lock().await.remove(topic);
    }

    /// Sends `message` to `topic` and waits for the broker's receipt; returns the message's id
    /// (`ledger:entry`), or an error for `operation` (and the producer is made again for the next send).
    pub(crate) async fn send(
        &self,
        topic: &str,
        message: producer::Message,
        operation: &str,
    ) -> Result<String, Error> {
        let producer = self.producer(topic).await?;
        let sent = tokio::time::timeout(SEND_TIMEOUT, async {
            let receipt = producer.lock().await.send_non_blocking(message).await?;
            receipt.await
        })
        .await;
        match sent {
            Ok(Ok(receipt)) => Ok(receipt
                .message_id
                .map(|id| format!("{}:{}", id.ledger_id, id.entry_id))
                .unwrap_or_default()),
            Ok(Err(e)) => {
                self.forget_producer(topic).await;
                Err(Error::from_source(passing(kind_of(&e)), e)
                    .with_operation(operation.to_string()))
            }
            Err(_) => {
                self.forget_producer(topic).await;
                Err(
                    Error::new(Kind::Timeout, format!("no receipt within {SEND_TIMEOUT:?}"))
                        .with_operation(operation.to_string()),
                )
            }
        }
    }

    /// Makes sure `topic`'s DLQ has the subscription DLQ operations read, so dead letters are kept, and
    /// that `topic` has its default consumer group's subscription, so events published before the first
    /// consumer starts are kept for it (Pulsar keeps messages for the subscriptions that exist).
    pub(crate) async fn ensure_topic(&self, topic: &str) -> Result<(), Error> {
        if self.lock_declared().contains(topic) {
            return Ok(());
        }
        let mut consumer = self.dlq_consumer(topic).await?;
        let_go(&mut consumer, "the DLQ's declaring consumer").await;
        self.ensure_group(topic, &event_retry_core::adapter::default_group(topic))
            .await?;
        self.lock_declared().insert(topic.to_string());
        Ok(())
    }

    /// Creates `group`'s subscription on its retry topic of `topic` (if it is missing), so a retry or a
    /// replay sent there is kept before the group's first consumer subscribes.
    pub(crate) async fn ensure_retry_topic(&self, topic: &str, group: &str) -> Result<(), Error> {
        self.ensure_group(&self.config.retry_topic(topic, group), group)
            .await
    }

    /// Creates the subscription of consumer group `group` on `topic` (if it is missing): from then on
    /// the group receives every event published to it. With the admin API the subscription is created
    /// there, without a consumer; otherwise a consumer subscribes and leaves at once — and a refusal
    /// (a consumer of another subscription type, Key_Shared for ordered consumers, holds it) means the
    /// subscription exists. That consumer comes from a client that does not retry a refusal itself (the
    /// pulsar crate's own would retry it for ever, and an ordered consumer's group could never be
    /// declared or dead-lettered to); a broker not ready yet is asked again for up to 30 s.
    pub(crate) async fn ensure_group(&self, topic: &str, group: &str) -> Result<(), Error> {
        let full = self.config.full_name(topic);
        if let Some(admin) = self.config.admin_url.clone() {
            let (full, group) = (full.clone(), group.to_string());
            let security = self.config.security.clone();
            return tokio::task::spawn_blocking(move || {
                crate::admin::rest::create_subscription(&admin, &full, &group, &security)
            })
            .await
            .map_err(|e| Error::from_source(Kind::Other, e))?;
        }
        let deadline = tokio::time::Instant::now() + DECLARE_PATIENCE;
        loop {
            let built = self
                .declaring_client()
                .await?
                .consumer()
                .with_topic(&full)
                .with_subscription(group)
                .with_subscription_type(SubType::Shared)
                .with_consumer_name(format!(
                    "event-retry-declare-{}",
                    uuid::Uuid::new_v4().simple()
                ))
                .with_options(
                    ConsumerOptions::default()
                        .with_initial_position(InitialPosition::Earliest)
                        .with_receiver_queue_size(1),
                )
                .with_batch_size(1)
                .build::<Vec<u8>>()
                .await;
            let e = match built {
                Ok(mut consumer) => {
                    let_go(&mut consumer, "the declaring consumer").await;
                    return Ok(());
                }
                Err(e) => e,
            };
            match kind_of(&e) {
                Kind::Connection | Kind::Timeout if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, %group, "the broker is not ready to subscribe: asking again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Kind::Connection | Kind::Timeout => {
                    return Err(Error::from_source(Kind::Connection, e)
                        .with_operation(format!("subscribe {group} to {full}")));
                }
                _ => {
                    tracing::debug!(error = %e, %group, "the subscription exists (held by a consumer of another type)");
                    return Ok(());
                }
            }
        }
    }

    /// Forgets that `topic` was set up (after its DLQ was deleted).
    pub(crate) fn forget(&self, topic: &str) {
        self.lock_declared().remove(topic);
    }

    /// A consumer of `topic`'s DLQ on the DLQ operations' subscription.
    pub(crate) async fn dlq_consumer(&self, topic: &str) -> Result<PulsarConsumer, Error> {
        let dlq = self.config.dlq_topic(topic);
        self.client
            .consumer()
            .with_topic(&dlq)
            .with_subscription(&self.config.dlq_subscription)
            .with_subscription_type(SubType::Shared)
            .with_consumer_name(format!("event-retry-dlq-{}", uuid::Uuid::new_v4().simple()))
            .with_options(
                ConsumerOptions::default().with_initial_position(InitialPosition::Earliest),
            )
            .build()
            .await
            .map_err(error(&format!("subscribe to {dlq}")))
    }

    fn lock_declared(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.declared.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Closes `consumer`, one that only made a subscription (`what`), within [`CLOSE_PATIENCE`]; when the
/// close does not get through it is dropped, and the client closes it in the background.
async fn let_go(consumer: &mut PulsarConsumer, what: &str) {
    if let Err(e) =
        consumer_requests::close(consumer, &format!("close {what}"), CLOSE_PATIENCE).await
    {
        tracing::debug!(error = %e, "{what} did not close; the client closes it when dropped");
    }
}
