//! The transport's one idempotent producer, and its replacement when librdkafka can no longer use it.
//!
//! Two states of a librdkafka producer never heal by themselves:
//! - **fatal**: an idempotent producer that lost its sequence refuses every later record until it is
//!   replaced;
//! - **stranded**: it holds no broker to reach. After a single broker was paused longer than its
//!   session timeout, the controller fences it for a moment, and the metadata that answers right then
//!   does not list it; librdkafka drops its connection to the only broker it knew, and the re-bootstrap
//!   that should follow can race with that drop and add nothing. From then on the producer sends no
//!   request at all, so nothing tries again: every record waits until it times out (the outbox suite's
//!   `broker_down_30s` caught it, about one run in six). The producer's statistics, every few seconds,
//!   show whether any broker other than librdkafka's internal one is left.
//!
//! The first send that finds the producer in either state replaces it with a new one, which bootstraps
//! afresh; a record whose delivery failed because of it is sent once more through the new one (at least
//! once, as any resend).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use event_retry_core::error::Error;
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::statistics::Statistics;

/// How often a producer reports its statistics, by which a stranded one is found (ms).
const STATISTICS_INTERVAL_MS: &str = "5000";

/// A producer with the context that watches it.
pub(crate) type KafkaProducer = FutureProducer<ProducerWatch>;

/// The producer's client context: librdkafka's logs and errors as the default context handles them,
/// and whether its last statistics showed no broker to reach (shared with the [`Handle`]: the
/// producer does not lend its context out).
#[derive(Default)]
pub(crate) struct ProducerWatch {
    stranded: Arc<AtomicBool>,
}

impl ClientContext for ProducerWatch {
    fn stats(&self, statistics: Statistics) {
        self.stranded
            .store(stranded(&statistics), Ordering::Relaxed);
    }
}

/// Whether `statistics` list no broker but librdkafka's internal and logical ones: nothing learned
/// from metadata and no bootstrap server left to connect to.
fn stranded(statistics: &Statistics) -> bool {
    !statistics
        .brokers
        .values()
        .any(|b| b.source == "learned" || b.source == "configured")
}

/// A producer and what its context found.
#[derive(Clone)]
pub(crate) struct Handle {
    /// The producer.
    pub(crate) producer: KafkaProducer,
    stranded: Arc<AtomicBool>,
}

impl Handle {
    /// Why the producer must be replaced, if it must.
    pub(crate) fn broken(&self) -> Option<String> {
        if let Some((code, why)) = self.producer.client().fatal_error() {
            return Some(format!("librdkafka declared it fatal ({code:?}: {why})"));
        }
        self.stranded
            .load(Ordering::Relaxed)
            .then(|| "it holds no broker to reach (its last statistics list none)".to_string())
    }

    fn is(&self, other: &Handle) -> bool {
        self.producer.client().native_ptr() == other.producer.client().native_ptr()
    }
}

/// The producer in use, replaced when it is broken.
pub(crate) struct Producers {
    current: RwLock<Handle>,
    config: ClientConfig,
    replaced: AtomicU64,
}

impl Producers {
    /// A first producer with `config` (statistics on, unless the user set their interval).
    pub(crate) fn new(mut config: ClientConfig) -> Result<Self, Error> {
        if config.get("statistics.interval.ms").is_none() {
            config.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
        }
        let first = create(&config)?;
        Ok(Self {
            current: RwLock::new(first),
            config,
            replaced: AtomicU64::new(0),
        })
    }

    /// The producer in use.
    pub(crate) fn current(&self) -> Handle {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The producer to use now: the one in use, or its replacement if it is broken.
    pub(crate) fn usable(&self) -> Result<Handle, Error> {
        let current = self.current();
        match current.broken() {
            Some(why) => self.replace(&current, &why),
            None => Ok(current),
        }
    }

    /// Replaces `old` (broken because `why`) with a new producer, unless another caller already did;
    /// returns the producer to use now.
    pub(crate) fn replace(&self, old: &Handle, why: &str) -> Result<Handle, Error> {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if current.is(old) {
            *current = create(&self.config)?;
            let replaced = self.replaced.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(
                reason = why,
                replaced,
                "the Kafka producer was replaced with a new one"
            );
        }
        Ok(current.clone())
    }

    /// How many producers were replaced.
    #[cfg(test)]
    pub(crate) fn replaced(&self) -> u64 {
        self.replaced.load(Ordering::Relaxed)
    }
}

fn create(config: &ClientConfig) -> Result<Handle, Error> {
    let watch = ProducerWatch::default();
    let stranded = watch.stranded.clone();
    let producer = config
        .create_with_context(watch)
        .map_err(crate::error::settings_error("producer"))?;
    Ok(Handle { producer, stranded })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statistics(sources: &[&str]) -> Statistics {
        let brokers: Vec<String> = sources
            .iter()
            .enumerate()
            .map(|(i, s)| {
                format!(
                    r#""b{i}": {{"name": "b{i}", "nodeid": {i}, "nodename": "b{i}", "source": "{s}",
                    "state": "UP", "stateage": 0, "outbuf_cnt": 0, "outbuf_msg_cnt": 0,
                    "waitresp_cnt": 0, "waitresp_msg_cnt": 0, "tx": 0, "txbytes": 0, "txerrs": 0,
                    "txretries": 0, "txidle": 0, "req_timeouts": 0, "rx": 0, "rxbytes": 0,
                    "rxerrs": 0, "rxcorriderrs": 0, "rxpartial": 0, "rxidle": 0,
                    "zbuf_grow": 0, "buf_grow": 0, "wakeups": 0, "connects": 0, "disconnects": 0,
                    "req": {{}}, "toppars": {{}}}}"#
                )
            })
            .collect();
        let json = format!(
            r#"{{"name": "p", "client_id": "p", "type": "producer", "ts": 0, "time": 0, "age": 0,
            "replyq": 0, "msg_cnt": 0, "msg_size": 0, "msg_max": 0, "msg_size_max": 0,
            "simple_cnt": 0, "metadata_cache_cnt": 0, "brokers": {{{}}}, "topics": {{}},
            "tx": 0, "tx_bytes": 0, "rx": 0, "rx_bytes": 0, "txmsgs": 0, "txmsg_bytes": 0,
            "rxmsgs": 0, "rxmsg_bytes": 0}}"#,
            brokers.join(",")
        );
        serde_json::from_str(&json).expect("statistics JSON")
    }

    #[test]
    fn a_producer_with_only_its_internal_broker_is_stranded() {
        assert!(stranded(&statistics(&["internal"])));
        assert!(stranded(&statistics(&[])));
        assert!(!stranded(&statistics(&["internal", "learned"])));
        assert!(!stranded(&statistics(&["internal", "configured"])));
    }
}
