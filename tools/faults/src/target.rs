//! The broker a run targets: its URL and adapter options, its raw client, and its process as
//! `scripts/brokers` started it (pid, restart).

use std::path::PathBuf;

use raw_brokers::{BoxError, Rabbitmqctl, RawBroker, RawKafka, RawPulsar, RawRabbit, RawSqs};

/// A broker `scripts/brokers` starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum BrokerName {
    /// One Kafka node.
    Kafka,
    /// RabbitMQ (Debian 12's 3.10).
    Rabbitmq,
    /// RabbitMQ 4.0, in its Debian 13 root.
    Rabbitmq4,
    /// ElasticMQ, the SQS API.
    Sqs,
    /// Pulsar standalone.
    Pulsar,
    /// Three Kafka nodes (replication factor 3, `min.insync.replicas` 2), for F6.
    KafkaCluster,
    /// Three RabbitMQ nodes in one cluster (quorum queues with a member on each), for F7.
    RabbitmqCluster,
}

impl BrokerName {
    /// The name `scripts/brokers` knows it by.
    pub(crate) fn script_name(self) -> &'static str {
        match self {
            BrokerName::Kafka => "kafka",
            BrokerName::Rabbitmq => "rabbitmq",
            BrokerName::Rabbitmq4 => "rabbitmq4",
            BrokerName::Sqs => "sqs",
            BrokerName::Pulsar => "pulsar",
            BrokerName::KafkaCluster => "kafka-cluster",
            BrokerName::RabbitmqCluster => "rabbitmq-cluster",
        }
    }

    /// The variable `target/brokers/env.sh` gives its URL in.
    fn url_variable(self) -> &'static str {
        match self {
            BrokerName::Kafka => "RETRY_TEST_KAFKA",
            BrokerName::Rabbitmq => "RETRY_TEST_AMQP",
            BrokerName::Rabbitmq4 => "RETRY_TEST_AMQP4",
            BrokerName::Sqs => "RETRY_TEST_SQS",
            BrokerName::Pulsar => "RETRY_TEST_PULSAR",
            BrokerName::KafkaCluster => "RETRY_TEST_KAFKA_CLUSTER",
            BrokerName::RabbitmqCluster => "RETRY_TEST_AMQP_CLUSTER",
        }
    }
}

impl std::fmt::Display for BrokerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.script_name())
    }
}

/// A broker, ready for a run.
pub(crate) struct Target {
    /// Which broker.
    pub(crate) name: BrokerName,
    /// Its URL.
    pub(crate) url: String,
    /// Adapter options, for the harness's connection and the consumer's alike.
    pub(crate) options: Vec<(String, String)>,
    /// Its own client.
    pub(crate) raw: Box<dyn RawBroker>,
    /// Options for the harness's own connection only (Pulsar's admin API, which deleting a topic needs).
    pub(crate) harness_options: Vec<(String, String)>,
    /// RabbitMQ cluster: the URL of the node the harness declares the topic through (so that node leads
    /// its queues), when it is not `url`'s.
    pub(crate) declare_url: Option<String>,
}

fn variable(name: &str) -> Result<String, BoxError> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            format!("{name} is not set: start the broker with scripts/brokers start and source target/brokers/env.sh").into()
        })
}

impl Target {
    /// The broker `name`, found through its `RETRY_TEST_*` variable.
    pub(crate) async fn find(name: BrokerName) -> Result<Self, BoxError> {
        let mut url = variable(name.url_variable())?;
        let mut harness_options = Vec::new();
        let mut declare_url = None;
        if name == BrokerName::RabbitmqCluster {
            // Node 1 declares (and so leads) the queues; the consumer and the harness use node 2.
            let nodes: Vec<&str> = url.split_whitespace().collect();
            let [first, second, _third] = nodes[..] else {
                return Err(format!(
                    "RETRY_TEST_AMQP_CLUSTER names {} nodes, want 3",
                    nodes.len()
                )
                .into());
            };
            declare_url = Some(first.to_string());
            url = second.to_string();
        }
        let (raw, options): (Box<dyn RawBroker>, Vec<(String, String)>) = match name {
            BrokerName::Kafka => (Box::new(RawKafka::new(&url)), vec![]),
            BrokerName::KafkaCluster => (
                Box::new(RawKafka::new(&url)),
                vec![("replication_factor".into(), "3".into())],
            ),
            BrokerName::Rabbitmq | BrokerName::Rabbitmq4 => {
                (Box::new(RawRabbit::new(&url)), vec![])
            }
            // A classic queue lives on one node, so killing its node is no cluster fault: quorum queues
            // (replicated) unless `--option queue_type=…` says otherwise (a later option wins).
            BrokerName::RabbitmqCluster => (
                Box::new(RawRabbit::new(&url)),
                vec![("queue_type".into(), "quorum".into())],
            ),
            BrokerName::Sqs => (Box::new(RawSqs::new(&url)), vec![]),
            BrokerName::Pulsar => {
                let admin = variable("RETRY_TEST_PULSAR_ADMIN")?;
                harness_options.push(("admin_url".into(), admin.clone()));
                (Box::new(RawPulsar::connect(&url, &admin).await?), vec![])
            }
        };
        Ok(Self {
            name,
            url,
            options,
            raw,
            harness_options,
            declare_url,
        })
    }

    /// The adapter options of the harness's own connection.
    pub(crate) fn harness_sdk_options(&self) -> event_retry::config::Options {
        self.options
            .iter()
            .chain(&self.harness_options)
            .fold(event_retry::config::Options::new(), |o, (k, v)| o.set(k, v))
    }

    /// RabbitMQ: the retry copies in the delay ladder now, summed over its levels with `rabbitmqctl
    /// list_queues` (AMQP itself tells only the messages ready) — all of them, and those a consumer
    /// process holds unacknowledged, waiting for their time or being moved on; the ladder of the queue
    /// type and prefix the options choose, granularity and depth the defaults. Other brokers: `None`.
    pub(crate) async fn copies_in_transit(&self) -> Result<Option<LadderCopies>, BoxError> {
        let ctl = match self.name {
            BrokerName::Rabbitmq => node_ctl("RETRY_TEST_AMQP")?,
            BrokerName::Rabbitmq4 => node_ctl("RETRY_TEST_AMQP4")?,
            // The consumer and the harness use node 2; a quorum queue's counts are the same on each.
            BrokerName::RabbitmqCluster => cluster_ctl(2),
            _ => return Ok(None),
        };
        let option = |key: &str, default: &'static str| {
            self.options
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map_or(default.to_string(), |(_, v)| v.clone())
        };
        let (queue_type, prefix) = (
            option("queue_type", "classic"),
            option("prefix", "event-retry"),
        );
        let counts = rabbitmq_queue_messages(&ctl).await?;
        let mut copies = LadderCopies::default();
        for level in 0..24 {
            let name = format!("{prefix}.ladder-100ms-{queue_type}.{level:02}");
            if let Some(&(all, held)) = counts.get(&name) {
                copies.all += all;
                copies.held += held;
            }
        }
        Ok(Some(copies))
    }

    /// The TCP port of the URL's first host (what a consumer in another network namespace needs
    /// forwarded).
    pub(crate) fn port(&self) -> Result<u16, BoxError> {
        let rest = self.url.split_once("://").map_or(&*self.url, |(_, r)| r);
        let host = rest.split(['/', '?', ',']).next().unwrap_or(rest);
        let host = host.rsplit('@').next().unwrap_or(host);
        let port = host
            .rsplit_once(':')
            .map(|(_, p)| p)
            .ok_or_else(|| format!("no port in {}", self.url))?;
        Ok(port.parse()?)
    }
}

/// `scripts/brokers`, from the workspace root.
pub(crate) fn brokers_script() -> PathBuf {
    PathBuf::from("scripts/brokers")
}

/// The pid of the broker process (`scripts/brokers pid NAME [NODE]`).
pub(crate) async fn broker_pid(name: BrokerName, node: Option<u32>) -> Result<u32, BoxError> {
    let mut command = tokio::process::Command::new("bash");
    command
        .arg(brokers_script())
        .arg("pid")
        .arg(name.script_name());
    if let Some(node) = node {
        command.arg(node.to_string());
    }
    let out = command.output().await?;
    if !out.status.success() {
        return Err(format!(
            "scripts/brokers pid {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// The node (1, 2 or 3) of the RabbitMQ cluster leading quorum queue `queue`, asked of node `ask` with
/// `rabbitmqctl list_queues name leader`.
pub(crate) async fn rabbitmq_cluster_leader(queue: &str, ask: u32) -> Result<u32, BoxError> {
    let queues = cluster_ctl(ask).queues(&["name", "leader"]).await?;
    let leader = queues
        .iter()
        .find(|q| q["name"] == queue)
        .and_then(|q| q["leader"].as_str())
        .ok_or_else(|| format!("no leader of {queue} in rabbitmqctl's list"))?;
    leader
        .strip_prefix("eventretry-c")
        .and_then(|rest| rest.strip_suffix("@localhost"))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("{queue}'s leader {leader} is not a node of ours").into())
}

/// The retry copies in a RabbitMQ delay ladder at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LadderCopies {
    /// Every copy in the levels, ready or held.
    pub(crate) all: u64,
    /// Those a consumer process holds unacknowledged: waiting for their time or being moved on.
    pub(crate) held: u64,
}

/// `rabbitmqctl` for the node whose variables start with `prefix` (`{prefix}_NODE`, `{prefix}_CTL`).
fn node_ctl(prefix: &str) -> Result<Rabbitmqctl, BoxError> {
    Rabbitmqctl::from_env(prefix).ok_or_else(|| {
        format!("{prefix}_NODE is not set: start the broker with scripts/brokers start and source target/brokers/env.sh").into()
    })
}

/// `rabbitmqctl` for node `n` (1, 2 or 3) of the RabbitMQ cluster.
fn cluster_ctl(n: u32) -> Rabbitmqctl {
    Rabbitmqctl {
        program: "rabbitmqctl".to_string(),
        node: format!("eventretry-c{n}@localhost"),
    }
}

/// Every queue's messages (ready and unacknowledged) and its unacknowledged ones, on the node `ctl`
/// reaches (`rabbitmqctl list_queues name messages messages_unacknowledged`).
async fn rabbitmq_queue_messages(
    ctl: &Rabbitmqctl,
) -> Result<std::collections::HashMap<String, (u64, u64)>, BoxError> {
    let queues = ctl
        .queues(&["name", "messages", "messages_unacknowledged"])
        .await?;
    Ok(queues
        .iter()
        .filter_map(|q| {
            let counts = (
                q["messages"].as_u64()?,
                q["messages_unacknowledged"].as_u64()?,
            );
            Some((q["name"].as_str()?.to_string(), counts))
        })
        .collect())
}

/// Starts the broker again on its data and ports (`scripts/brokers restart NAME`), after a kill.
pub(crate) async fn restart_broker(
    name: BrokerName,
    log: &std::path::Path,
) -> Result<(), BoxError> {
    let log = std::fs::File::create(log)?;
    let status = tokio::process::Command::new("bash")
        .arg(brokers_script())
        .arg("restart")
        .arg(name.script_name())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .await?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("scripts/brokers restart {name} failed ({status})").into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    #[async_trait::async_trait]
    impl RawBroker for Nothing {
        async fn messages(&self, _: &str) -> Result<Vec<raw_brokers::RawEntry>, BoxError> {
            Ok(vec![])
        }
        async fn waiting(&self, _: &str, _: &str) -> Result<u64, BoxError> {
            Ok(0)
        }
        async fn refuse_dlq_writes(&self, _: &str) -> Result<Vec<String>, BoxError> {
            Ok(vec![])
        }
        async fn accept_dlq_writes(&self, _: &str) -> Result<Vec<String>, BoxError> {
            Ok(vec![])
        }
    }

    fn target(url: &str) -> Target {
        Target {
            name: BrokerName::Kafka,
            url: url.into(),
            options: vec![],
            raw: Box::new(Nothing),
            harness_options: vec![],
            declare_url: None,
        }
    }

    #[test]
    fn the_port_comes_from_the_first_host() {
        let port = |u: &str| target(u).port().ok();
        assert_eq!(port("kafka://127.0.0.1:19092"), Some(19092));
        assert_eq!(port("kafka://127.0.0.1:19092,127.0.0.1:29092"), Some(19092));
        assert_eq!(port("amqp://guest:guest@127.0.0.1:5672/%2f"), Some(5672));
        assert_eq!(port("http://127.0.0.1:9324"), Some(9324));
        assert_eq!(port("pulsar://127.0.0.1"), None);
    }
}
