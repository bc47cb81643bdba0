//! The peer bench: event-retry and Spring Kafka's `@RetryableTopic` run the same workloads on the same
//! Kafka broker, each in its own process with its defaults, in alternating rounds.
//!
//! Both consumers report in the same line protocol on standard output ([`protocol`]), so the bench
//! times and counts them identically: throughput from each one's first record to its last success,
//! retry lateness as each retry's start minus the due time its own framework wrote, and peak RSS from
//! the kernel (`VmHWM`). Why separate processes: a JVM's memory and a Rust binary's are only comparable
//! as whole processes, and neither may share a runtime with the bench's producer.
//!
//! Run it with `scripts/peer-bench` (starts Kafka, builds the Spring app with Maven, runs the bench).

pub mod kafka;
pub mod process;
pub mod protocol;
pub mod report;
pub mod sdk;
pub mod workload;

/// The bench's error type.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
