//! The faults a run can inject, and what each one means.

use std::time::Duration;

/// How long a stall, a cut or a DLQ outage lasts (the matrix's; `faults run --outage` sets another).
pub(crate) const OUTAGE: Duration = Duration::from_secs(20);

/// The share of events handled before the fault is injected.
pub(crate) const AT_SHARE: f64 = 0.3;

/// One fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum Fault {
    /// The consumer process killed with SIGKILL while retries wait in the broker; a new process of the
    /// same group finishes.
    #[value(name = "F1", alias = "consumer-kill")]
    ConsumerKill,
    /// The broker killed with SIGKILL and started again on the same data; the consumer left running.
    #[value(name = "F2", alias = "broker-kill")]
    BrokerKill,
    /// The broker stopped with SIGSTOP for 20 s, then SIGCONT.
    #[value(name = "F3", alias = "broker-stall")]
    BrokerStall,
    /// The network between the consumer (in its own namespace) and the broker cut for 20 s.
    #[value(name = "F4", alias = "network-cut")]
    NetworkCut,
    /// The DLQ unwritable for 20 s while non-retryable events arrive.
    #[value(name = "F5", alias = "dlq-outage")]
    DlqOutage,
    /// A 3-node Kafka cluster's partition leader killed with SIGKILL.
    #[value(name = "F6", alias = "leader-kill")]
    LeaderKill,
    /// A 3-node RabbitMQ cluster's node leading the group's quorum queue killed with SIGKILL (the
    /// consumer connected to another node).
    #[value(name = "F7", alias = "queue-leader-kill")]
    QueueLeaderKill,
}

impl Fault {
    /// The cluster a fault runs on by itself, if it needs one.
    pub(crate) fn cluster(self) -> Option<crate::target::BrokerName> {
        match self {
            Fault::LeaderKill => Some(crate::target::BrokerName::KafkaCluster),
            Fault::QueueLeaderKill => Some(crate::target::BrokerName::RabbitmqCluster),
            _ => None,
        }
    }

    /// `F1` … `F7`.
    pub(crate) fn code(self) -> &'static str {
        match self {
            Fault::ConsumerKill => "F1",
            Fault::BrokerKill => "F2",
            Fault::BrokerStall => "F3",
            Fault::NetworkCut => "F4",
            Fault::DlqOutage => "F5",
            Fault::LeaderKill => "F6",
            Fault::QueueLeaderKill => "F7",
        }
    }

    /// What the fault does, for the report, with how long a stall, cut or DLQ outage lasted.
    pub(crate) fn title(self, outage: Duration) -> String {
        let secs = outage.as_secs();
        match self {
            Fault::ConsumerKill => "consumer SIGKILL, new process".to_string(),
            Fault::BrokerKill => "broker SIGKILL, restart".to_string(),
            Fault::BrokerStall => format!("broker SIGSTOP {secs} s"),
            Fault::NetworkCut => format!("network cut {secs} s"),
            Fault::DlqOutage => format!("DLQ unwritable {secs} s"),
            Fault::LeaderKill => "partition leader SIGKILL".to_string(),
            Fault::QueueLeaderKill => "queue leader node SIGKILL".to_string(),
        }
    }

    /// `F4 network cut 20 s`: the code and the title, as the report names a row's fault.
    pub(crate) fn describe(self, outage: Duration) -> String {
        format!("{} {}", self.code(), self.title(outage))
    }

    /// Whether the consumer must live through the fault in the same process (all but F1, where the
    /// process is what is killed).
    pub(crate) fn consumer_must_survive(self) -> bool {
        self != Fault::ConsumerKill
    }

    /// Whether the fault's cells on different brokers run at the same time. F1 touches nothing but its
    /// own cell's consumer process, and its cells spend most of their time waiting (for a new process to
    /// take the killed one's share, for retries to fall due), so together they take about as long as the
    /// slowest alone. The others run one cell at a time: a broker restart rewrites the brokers' shared
    /// environment file, and a stall, a cut or a cluster's leader kill is measured on a machine that does
    /// nothing else.
    pub(crate) fn runs_beside_other_brokers(self) -> bool {
        self == Fault::ConsumerKill
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_faults_run_on_their_own_cluster() {
        use crate::target::BrokerName;
        assert_eq!(Fault::LeaderKill.cluster(), Some(BrokerName::KafkaCluster));
        assert_eq!(
            Fault::QueueLeaderKill.cluster(),
            Some(BrokerName::RabbitmqCluster)
        );
        assert_eq!(Fault::BrokerKill.cluster(), None);
        assert_eq!(Fault::QueueLeaderKill.code(), "F7");
    }

    #[test]
    fn only_the_consumer_kill_runs_its_brokers_at_once() {
        assert!(Fault::ConsumerKill.runs_beside_other_brokers());
        for fault in [
            Fault::BrokerKill,
            Fault::BrokerStall,
            Fault::NetworkCut,
            Fault::DlqOutage,
            Fault::LeaderKill,
            Fault::QueueLeaderKill,
        ] {
            assert!(!fault.runs_beside_other_brokers(), "{fault:?}");
        }
    }

    #[test]
    fn a_row_names_the_outage_it_ran_with() {
        assert_eq!(
            Fault::NetworkCut.describe(Duration::from_secs(75)),
            "F4 network cut 75 s"
        );
        assert_eq!(
            Fault::BrokerStall.describe(OUTAGE),
            "F3 broker SIGSTOP 20 s"
        );
        assert_eq!(
            Fault::BrokerKill.describe(OUTAGE),
            "F2 broker SIGKILL, restart"
        );
    }
}
