//! The transport's one idempotent producer, and its replacement when librdkafka can no longer use it.
//!
//! Two states of a librdkafka producer never heal by themselves:
//! - **fatal**: an idempotent producer that lost its sequence refuses every later record until it is
//!   replaced;
//! - **stranded**: it holds no broker to reach, and librdkafka's re-bootstrap was lost (see
//!   [`crate::stranding`]). From then on the producer sends no request at all, so nothing tries again:
//!   every record waits until it times out (the outbox suite's `broker_down_30s` caught it). The
//!   producer's statistics, every few seconds, show it.
//!
//! The first send that finds the producer in either state replaces it with a new one, which bootstraps
//! afresh; a record whose delivery failed because of it is sent once more through the new one (at least
//! once, as any resend). A stranded producer replaced counts as a heal of the `producer` in
//! [`crate::stranding::CLIENT_HEALS`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use event_retry_core::error::Error;
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::statistics::Statistics;

use crate::stranding::{count_heal, report_statistics, stranded};

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
        report_statistics(&mut config);
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
            if old.stranded.load(Ordering::Relaxed) {
                count_heal("producer");
            }
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
    use crate::stranding::tests::statistics;

    #[test]
    fn replacing_a_stranded_producer_counts_a_heal_and_a_fatal_one_none() {
        use metrics_util::debugging::DebuggingRecorder;
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", "127.0.0.1:1");
        let producers = Producers::new(config).expect("a producer needs no broker to exist");
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let first = producers.current();
            producers.replace(&first, "fatal").expect("replaced");
            let second = producers.current();
            second.stranded.store(true, Ordering::Relaxed);
            assert!(second.broken().is_some());
            producers.usable().expect("replaced");
            // Already replaced: a second caller with the same old producer counts nothing.
            producers.replace(&second, "stranded").expect("current");
        });
        assert_eq!(producers.replaced(), 2);
        assert_eq!(
            crate::stranding::tests::heals(&snapshotter),
            vec![("producer".to_string(), 1)]
        );
    }

    #[test]
    fn a_producer_whose_statistics_list_no_broker_is_marked_stranded_until_they_list_one() {
        let watch = ProducerWatch::default();
        watch.stats(statistics(&["internal", "logical"]));
        assert!(watch.stranded.load(Ordering::Relaxed));
        watch.stats(statistics(&["internal", "learned"]));
        assert!(!watch.stranded.load(Ordering::Relaxed));
    }
}
