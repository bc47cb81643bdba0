//! The connection to the broker: reconnects when it broke, a confirm-mode publisher channel, and the
//! topology declared once per topic.
//!
//! Every publish is `mandatory` and waits for the broker's confirm: an unroutable copy comes back as a
//! return and is an error, never a loss. The client pairs a return with the next confirm of its channel,
//! which is only right when one publish is outstanding, so publishes go through a pool of confirm-mode
//! channels, one publish at a time on each. A broken connection or channel is replaced on the next use,
//! so a broker restart costs the callers one error each (the runtime backs off and tries again).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use event_retry_core::error::{Error, Kind};
use event_retry_core::event::Event;
use lapin::Confirmation;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::FieldTable;
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, DefaultConnectionBuilder};
use tokio::sync::Mutex;
use tracing::warn;

use crate::codec;
use crate::config::RabbitConfig;
use crate::declare;
use crate::error::{self as errors, amqp_error, connection_error};
use crate::ladder::mover::{Hops, Movers};
use crate::ladder::{self, Ladder};
use crate::topics::{self, Names};

/// Publisher channels: as many publishes can be in flight at once.
const PUBLISHERS: usize = 16;

/// How long closing the connection waits for the broker's answer.
const CLOSE_WITHIN: Duration = Duration::from_secs(10);

/// How long a connect, declare or publish confirm may take before it is an error.
const BROKER_TIMEOUT: Duration = Duration::from_secs(30);

/// The shared connection state of one transport.
pub(crate) struct Link {
    /// Where to connect, the password put in (never shown: `Link` has no `Debug`).
    uri: AMQPUri,
    /// The CA and client identity of an `amqps://` connection.
    tls: OwnedTLSConfig,
    /// The user the connection logs in as (RabbitMQ checks a message's `user-id` against it).
    pub(crate) user: String,
    pub(crate) config: RabbitConfig,
    pub(crate) names: Names,
    connection: Mutex<Option<Arc<Connection>>>,
    publishers: Vec<Mutex<Option<Channel>>>,
    next_publisher: AtomicUsize,
    /// What this transport declared: the ladder (`("", None)`), topics (`(topic, None)`) and groups.
    declared: std::sync::Mutex<HashSet<(String, Option<String>)>>,
    /// The tasks moving the delay ladder's due copies, once a consumer subscribed; stopped when the link
    /// is closed or dropped.
    movers: std::sync::Mutex<Option<Movers>>,
}

/// Checks, with passive declares, that `queues` exist (declaring is off).
async fn check_queues(ch: &Channel, queues: &[String]) -> Result<(), Error> {
    for queue in queues {
        ch.queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| amqp_error(e, format!("check queue {queue} (declaring is off)")))?;
    }
    Ok(())
}

async fn bounded<T>(what: &str, fut: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
    tokio::time::timeout(BROKER_TIMEOUT, fut)
        .await
        .map_err(|_| {
            Error::new(
                Kind::Timeout,
                format!("no answer within {BROKER_TIMEOUT:?}"),
            )
            .with_operation(what.to_string())
        })?
}

impl Link {
    pub(crate) fn new(url: String, config: RabbitConfig) -> Result<Self, Error> {
        config.validate()?;
        let uri = config.security.uri(&url)?;
        let tls = config.security.tls_config()?;
        Ok(Self {
            user: uri.authority.userinfo.username.clone(),
            uri,
            tls,
            names: Names::new(&config),
            config,
            connection: Mutex::new(None),
            publishers: (0..PUBLISHERS).map(|_| Mutex::new(None)).collect(),
            next_publisher: AtomicUsize::new(0),
            declared: std::sync::Mutex::new(HashSet::new()),
            movers: std::sync::Mutex::new(None),
        })
    }

    /// A live connection: the current one, or a new one when it broke.
    pub(crate) async fn connection(&self) -> Result<Arc<Connection>, Error> {
        let mut slot = self.connection.lock().await;
        if let Some(conn) = slot.as_ref()
            && conn.status().connected()
        {
            return Ok(conn.clone());
        }
        let conn = bounded("connect", async {
            DefaultConnectionBuilder::new()
                .map_err(|e| Error::from_source(Kind::Other, e).with_operation("connect"))?
                .with_uri(self.uri.clone())
                .with_properties(ConnectionProperties::default())
                .with_tls_config(self.tls.clone())
                .connect()
                .await
                .map_err(|e| errors::connect_error(e, &self.uri))
        })
        .await?;
        let conn = Arc::new(conn);
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// A new channel on the live connection.
    pub(crate) async fn channel(&self) -> Result<Channel, Error> {
        let conn = self.connection().await?;
        bounded("open a channel", async {
            conn.create_channel()
                .await
                .map_err(connection_error("open a channel"))
        })
        .await
    }

    /// Publishes `body` with `props` and waits for the broker's confirm; a return (no queue bound) or a
    /// nack is an error for `operation`.
    pub(crate) async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
        operation: &str,
    ) -> Result<(), Error> {
        // One publish at a time per channel, so a return is paired with its own confirm.
        let slot = self.next_publisher.fetch_add(1, Ordering::Relaxed) % PUBLISHERS;
        let mut publisher = self.publishers[slot].lock().await;
        let ch = match publisher.as_ref() {
            Some(ch) if ch.status().connected() => ch.clone(),
            _ => {
                let ch = self.channel().await?;
                ch.confirm_select(ConfirmSelectOptions::default())
                    .await
                    .map_err(connection_error("enable publisher confirms"))?;
                *publisher = Some(ch.clone());
                ch
            }
        };
        let confirmation = bounded(operation, async {
            ch.basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                props,
            )
            .await
            .map_err(connection_error(operation))?
            .await
            .map_err(connection_error(operation))
        })
        .await?;
        let rejected = |reason: String| {
            Error::new(Kind::Rejected, reason).with_operation(operation.to_string())
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                Err(rejected(format!(
                    "unroutable: no queue is bound for routing key {routing_key:?} on exchange {exchange:?} ({} {})",
                    returned.reply_code, returned.reply_text
                )))
            }
            Confirmation::Nack(None) => {
                Err(rejected("the broker refused the message (nack)".into()))
            }
            Confirmation::NotRequested => Err(rejected("publisher confirms are off".into())),
        }
    }

    /// Publishes `event` and waits for the confirm: to `topic`'s exchange (every group gets it), or —
    /// a DLQ replay of a group's dead letter — to that group's queue alone. A new message carries its
    /// event id as the AMQP message id; a replay is a copy of the entry's message (`native`, its
    /// properties). Returns the event id.
    pub(crate) async fn publish_event(
        &self,
        topic: &str,
        group: Option<&str>,
        event: &Event,
        native: Option<&BasicProperties>,
        operation: &str,
    ) -> Result<String, Error> {
        let (exchange, routing_key) = match group {
            Some(group) => {
                self.ensure_group(topic, group).await?;
                (String::new(), self.names.group_queue(topic, group))
            }
            None => {
                self.ensure_topic(topic).await?;
                (topic.to_string(), String::new())
            }
        };
        let id = event
            .id()
            .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string);
        let props = codec::properties(event, native, &id, &self.user, &[]);
        self.publish(&exchange, &routing_key, &event.payload, props, operation)
            .await?;
        Ok(id)
    }

    /// Puts `event` in `topic`'s DLQ queue as dead-lettered by `group`, under a new entry id, keeping
    /// `native` (the original message's properties) when there is one; returns once the broker confirmed
    /// it.
    pub(crate) async fn dead_letter(
        &self,
        topic: &str,
        group: Option<&str>,
        event: &Event,
        native: Option<&BasicProperties>,
    ) -> Result<(), Error> {
        let dlq = self.names.dlq(topic);
        let entry_id = uuid::Uuid::new_v4().to_string();
        let mut extra = vec![(
            event_retry_core::metadata::names::DLQ_ENTRY,
            entry_id.as_str(),
        )];
        if let Some(group) = group {
            extra.push((event_retry_core::metadata::names::GROUP, group));
        }
        let props = codec::properties(event, native, &entry_id, &self.user, &extra);
        let operation = format!("dead-letter to {dlq}");
        self.publish("", &dlq, &event.payload, props, &operation)
            .await
    }

    /// Declares (or, with `declare` off, checks) the ladder, `topic`'s exchange and DLQ, and its default
    /// group's queue, once per transport.
    pub(crate) async fn ensure_topic(&self, topic: &str) -> Result<(), Error> {
        topics::check_topic(&self.names, topic)?;
        if self.is_declared(topic, None) {
            return Ok(());
        }
        let default = event_retry_core::adapter::default_group(topic);
        topics::check_group(&self.names, topic, &default)?;
        let group = default.as_str();
        match self.declare_topology(topic, group, true).await {
            // A DLQ or ladder queue of an earlier version, without the delivery limit asked for: used
            // as it is, and said (the declarations before it stand; the rest are made again).
            Err(e) if declare::declared_without_limit(&e.to_string()) => {
                warn!(topic, error = %e, "{}", declare::HELD_WITHOUT_LIMIT);
                self.declare_topology(topic, group, false).await?;
            }
            result => result?,
        }
        self.mark_declared(topic, None);
        self.mark_declared(topic, Some(&default));
        Ok(())
    }

    /// Declares (or, with `declare` off, checks) the ladder unless declared already, `topic`'s exchange
    /// and DLQ, and its `group`'s queues; the DLQ's and the ladder's quorum queues with their delivery
    /// limit where `held_limit`.
    async fn declare_topology(
        &self,
        topic: &str,
        group: &str,
        held_limit: bool,
    ) -> Result<(), Error> {
        self.declare_with("declare the topology", |ch| async move {
            if self.config.declare {
                if !self.is_declared("", None) {
                    ladder::declare(&ch, &self.names.ladder, &self.config, held_limit).await?;
                    self.mark_declared("", None);
                }
                topics::declare_topic(&ch, &self.names, &self.config, topic, held_limit).await?;
                topics::declare_group(&ch, &self.names, &self.config, topic, group).await
            } else {
                ch.exchange_declare(
                    topic.into(),
                    lapin::ExchangeKind::Fanout,
                    ExchangeDeclareOptions {
                        passive: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| amqp_error(e, format!("check exchange {topic} (declaring is off)")))?;
                let queues = [
                    self.names.dlq(topic),
                    self.names.ladder.entry(),
                    self.names.group_queue(topic, group),
                    self.names.retry_queue(topic, group),
                ];
                check_queues(&ch, &queues).await
            }
        })
        .await
    }

    /// Declares (or checks) `topic` and the work queue of its consumer group `group`, once per transport.
    pub(crate) async fn ensure_group(&self, topic: &str, group: &str) -> Result<(), Error> {
        self.ensure_topic(topic).await?;
        topics::check_group(&self.names, topic, group)?;
        if self.is_declared(topic, Some(group)) {
            return Ok(());
        }
        self.declare_with("declare a consumer group's queue", |ch| async move {
            if self.config.declare {
                topics::declare_group(&ch, &self.names, &self.config, topic, group).await
            } else {
                let queues = [
                    self.names.group_queue(topic, group),
                    self.names.retry_queue(topic, group),
                ];
                check_queues(&ch, &queues).await
            }
        })
        .await?;
        self.mark_declared(topic, Some(group));
        Ok(())
    }

    /// Runs a declaration on a channel of its own (a failed declaration closes its channel).
    async fn declare_with<F, Fut>(&self, what: &str, declare: F) -> Result<(), Error>
    where
        F: FnOnce(Channel) -> Fut,
        Fut: Future<Output = Result<(), Error>>,
    {
        let ch = self.channel().await?;
        let result = bounded(what, declare(ch.clone())).await;
        let _ = ch.close(200, "declared".into()).await;
        result
    }

    /// Makes the next use of `topic` declare it again (its exchange, DLQ and default group; after its DLQ
    /// was deleted), keeping the record of its other groups, whose queues stay.
    pub(crate) fn redeclare(&self, topic: &str) {
        let mut declared = self.lock_declared();
        declared.remove(&(topic.to_string(), None));
        declared.remove(&(
            topic.to_string(),
            Some(event_retry_core::adapter::default_group(topic)),
        ));
    }

    /// Forgets that `topic` and its groups were declared (they are being deleted); returns the groups
    /// this transport had declared for it.
    pub(crate) fn forget(&self, topic: &str) -> Vec<String> {
        let mut declared = self.lock_declared();
        let groups = declared
            .iter()
            .filter(|(t, g)| t == topic && g.is_some())
            .filter_map(|(_, g)| g.clone())
            .collect();
        declared.retain(|(t, _)| t != topic);
        groups
    }

    fn is_declared(&self, topic: &str, group: Option<&str>) -> bool {
        self.lock_declared()
            .contains(&(topic.to_string(), group.map(str::to_string)))
    }

    fn mark_declared(&self, topic: &str, group: Option<&str>) {
        self.lock_declared()
            .insert((topic.to_string(), group.map(str::to_string)));
    }

    fn lock_declared(&self) -> std::sync::MutexGuard<'_, HashSet<(String, Option<String>)>> {
        self.declared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts moving the delay ladder's due copies, once per link (a consumer's process moves them; a
    /// process that only publishes does not).
    pub(crate) fn start_movers(self: &Arc<Self>) {
        let mut movers = self.movers.lock().unwrap_or_else(|p| p.into_inner());
        if movers.is_none() {
            *movers = Some(Movers::start(self));
        }
    }

    /// Closes the connection (best effort), after stopping the ladder's movers once the moves under way
    /// are acknowledged: what they still held goes back to its level when the connection closes.
    pub(crate) async fn close(&self) {
        let movers = self.movers.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(movers) = movers {
            movers.stop(CLOSE_WITHIN).await;
        }
        if let Some(conn) = self.connection.lock().await.take() {
            // Bounded: a node that lost a queue leader may never answer; the socket closes either way.
            if tokio::time::timeout(CLOSE_WITHIN, conn.close(200, "bye".into()))
                .await
                .is_err()
            {
                tracing::warn!(
                    "the broker did not answer the connection's close within {CLOSE_WITHIN:?}"
                );
            }
        }
    }
}

#[async_trait::async_trait]
impl Hops for Link {
    fn ladder(&self) -> &Ladder {
        &self.names.ladder
    }

    async fn channel(&self) -> Result<Channel, Error> {
        Link::channel(self).await
    }

    async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
        operation: &str,
    ) -> Result<(), Error> {
        Link::publish(self, exchange, routing_key, body, props, operation).await
    }
}
