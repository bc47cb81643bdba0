//! A librdkafka client left with no broker at all, and the way back to its bootstrap servers.
//!
//! A lone broker paused past its session with the controller (`broker.session.timeout.ms`) is fenced
//! for a moment, and a metadata response it sends right then lists no broker. librdkafka decommissions every broker
//! such a response does not list, so the client is left with only its internal and logical ones. Its
//! own re-bootstrap should follow, but it can be lost: the all-brokers-down report schedules it on the
//! main thread, and the handling of the same metadata response, still running there, stops that
//! timer and leaves the re-bootstrap's in-progress flag set, so no later trigger starts one either
//! (confluentinc/librdkafka#5301, open; the second fix of #5606). From then on the client sends no
//! request at all and nothing tries again: a consumer group member reads nothing more and never
//! rejoins. The Kafka fault run that stops the broker with SIGSTOP (F3) hits it.
//!
//! Statistics every few seconds show whether any broker other than librdkafka's internal and logical
//! ones is left ([`stranded`]). The producer replaces a stranded producer (see [`crate::producer`]);
//! a consumer, whose group membership and assignment a replacement would throw away, gets its
//! bootstrap servers added again by the thread that polls it ([`BrokerWatch::heal`]) — what the lost
//! re-bootstrap would have done.
//!
//! Every heal — a consumer's servers added again, a stranded producer replaced — counts in
//! [`CLIENT_HEALS`], labelled by the `client` healed.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};

use event_retry_core::error::{Error, Kind};
use rdkafka::ClientContext;
use rdkafka::client::Client;
use rdkafka::config::ClientConfig;
use rdkafka::statistics::Statistics;

/// Stranded clients healed (counter), by `client`: `consumer` (a source consumer's servers added
/// again), `ladder` (a ladder consumer's) or `producer` (a stranded producer replaced). Above zero, a
/// client lost its brokers and librdkafka did not find them again by itself.
pub const CLIENT_HEALS: &str = "event_retry_kafka_client_heals_total";

/// Counts a heal of `client` in [`CLIENT_HEALS`].
pub(crate) fn count_heal(client: &'static str) {
    metrics::counter!(CLIENT_HEALS, "client" => client).increment(1);
}

/// How often a watched client reports its statistics, by which a stranded one is found (ms).
const STATISTICS_INTERVAL_MS: &str = "5000";

/// Turns statistics on in `config`, unless the user set their interval.
pub(crate) fn report_statistics(config: &mut ClientConfig) {
    if config.get("statistics.interval.ms").is_none() {
        config.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
    }
}

/// Whether `statistics` list no broker but librdkafka's internal and logical ones: nothing learned
/// from metadata and no bootstrap server left to connect to.
pub(crate) fn stranded(statistics: &Statistics) -> bool {
    !statistics
        .brokers
        .values()
        .any(|b| b.source == "learned" || b.source == "configured")
}

/// What a consumer's context learns from its statistics, and the bootstrap servers to add again.
pub(crate) struct BrokerWatch {
    stranded: AtomicBool,
    bootstrap: CString,
    /// Which client it watches, as [`CLIENT_HEALS`] labels it.
    client: &'static str,
}

impl BrokerWatch {
    /// A watch for the `client` (`consumer` or `ladder`) created from `config`, which must name its
    /// bootstrap servers.
    pub(crate) fn new(config: &ClientConfig, client: &'static str) -> Result<Self, Error> {
        let servers = config.get("bootstrap.servers").unwrap_or_default();
        let bootstrap = CString::new(servers).map_err(|_| {
            Error::new(
                Kind::Config,
                "the Kafka bootstrap servers hold a NUL character",
            )
        })?;
        Ok(Self {
            stranded: AtomicBool::new(false),
            bootstrap,
            client,
        })
    }

    /// Notes whether the client's latest statistics show it stranded (called from its context).
    pub(crate) fn observe(&self, statistics: &Statistics) {
        self.stranded.store(stranded(statistics), Ordering::Relaxed);
    }

    /// If the latest statistics showed `client` stranded, adds its bootstrap servers again and counts
    /// the heal; `true` if it did. Called by the thread that polls the client (named in the warning);
    /// the next statistics tell anew.
    #[allow(unsafe_code)]
    pub(crate) fn heal<C: ClientContext>(&self, client: &Client<C>) -> bool {
        if !self.stranded.swap(false, Ordering::Relaxed) {
            return false;
        }
        // SAFETY: `client` owns a live librdkafka handle for the whole call, and `bootstrap` is a
        // NUL-terminated string that librdkafka copies before returning. `rd_kafka_brokers_add` may
        // be called from any thread at any time (it takes the handle's own lock).
        let added = unsafe {
            rdkafka::bindings::rd_kafka_brokers_add(client.native_ptr(), self.bootstrap.as_ptr())
        };
        count_heal(self.client);
        tracing::warn!(
            thread = std::thread::current().name().unwrap_or("unnamed"),
            client = self.client,
            added,
            "the Kafka consumer held no broker to reach (librdkafka lost its re-bootstrap); its bootstrap servers were added again"
        );
        true
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    use super::*;

    /// Statistics listing one broker per entry of `sources`, each with that `source`.
    pub(crate) fn statistics(sources: &[&str]) -> Statistics {
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
    fn a_client_with_only_its_internal_and_logical_brokers_is_stranded() {
        assert!(stranded(&statistics(&["internal"])));
        assert!(stranded(&statistics(&["internal", "logical"])));
        assert!(stranded(&statistics(&[])));
        assert!(!stranded(&statistics(&["internal", "learned"])));
        assert!(!stranded(&statistics(&["internal", "configured"])));
    }

    #[test]
    fn statistics_are_turned_on_unless_the_user_chose_an_interval() {
        let mut config = ClientConfig::new();
        report_statistics(&mut config);
        assert_eq!(config.get("statistics.interval.ms"), Some("5000"));
        let mut theirs = ClientConfig::new();
        theirs.set("statistics.interval.ms", "60000");
        report_statistics(&mut theirs);
        assert_eq!(theirs.get("statistics.interval.ms"), Some("60000"));
    }

    #[test]
    fn a_heal_adds_the_servers_only_after_statistics_showed_the_client_stranded() {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "stranding-test");
        let consumer: BaseConsumer = config
            .create()
            .expect("a consumer needs no broker to exist");
        let watch = BrokerWatch::new(&config, "consumer").expect("servers");
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            watch.observe(&statistics(&["internal", "learned"]));
            assert!(!watch.heal(consumer.client()));
            watch.observe(&statistics(&["internal", "logical"]));
            assert!(watch.heal(consumer.client()));
            // Healed once: the next statistics tell anew.
            assert!(!watch.heal(consumer.client()));
        });
        assert_eq!(heals(&snapshotter), vec![("consumer".to_string(), 1)]);
    }

    /// Per `client` label, the heals `snapshotter`'s recorder counted.
    pub(crate) fn heals(snapshotter: &Snapshotter) -> Vec<(String, u64)> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == CLIENT_HEALS)
            .filter_map(|(key, _, _, value)| {
                let client = key.key().labels().find(|l| l.key() == "client")?;
                match value {
                    DebugValue::Counter(n) => Some((client.value().to_string(), n)),
                    _ => None,
                }
            })
            .collect()
    }

    #[test]
    fn servers_with_a_nul_are_refused_with_a_config_error() {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", "a\0b:9092");
        let err = BrokerWatch::new(&config, "consumer")
            .err()
            .expect("refused");
        assert_eq!(err.kind(), Kind::Config);
    }
}
