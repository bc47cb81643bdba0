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
}

impl Fault {
    /// `F1` … `F6`.
    pub(crate) fn code(self) -> &'static str {
        match self {
            Fault::ConsumerKill => "F1",
            Fault::BrokerKill => "F2",
            Fault::BrokerStall => "F3",
            Fault::NetworkCut => "F4",
            Fault::DlqOutage => "F5",
            Fault::LeaderKill => "F6",
        }
    }

    /// What the fault does, for the report.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Fault::ConsumerKill => "consumer SIGKILL, new process",
            Fault::BrokerKill => "broker SIGKILL, restart",
            Fault::BrokerStall => "broker SIGSTOP 20 s",
            Fault::NetworkCut => "network cut 20 s",
            Fault::DlqOutage => "DLQ unwritable 20 s",
            Fault::LeaderKill => "partition leader SIGKILL",
        }
    }

    /// Whether the consumer must live through the fault in the same process (all but F1, where the
    /// process is what is killed).
    pub(crate) fn consumer_must_survive(self) -> bool {
        self != Fault::ConsumerKill
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.code(), self.title())
    }
}
