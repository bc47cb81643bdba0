//! The workloads both consumers run, and how each side is told to run them: the SDK by a retry policy,
//! Spring by `@RetryableTopic`'s attempts and back-off (the listener's only non-default settings).

use std::time::Duration;

/// What one round asks of a consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Short name, used in topic names and the report.
    pub name: &'static str,
    /// Events in the topic before the consumer starts.
    pub events: u64,
    /// Payload size of each event, in bytes.
    pub payload_bytes: usize,
    /// How many times each event fails before it succeeds.
    pub failures: u32,
    /// The waits before each retry, in order (as many as `failures`).
    pub delays: Vec<Duration>,
    /// How long a round may take before the bench gives up on it.
    pub deadline: Duration,
    /// Spring's listener concurrency (`spring.kafka.listener.concurrency`: consumer threads per
    /// container, the retry topics' containers included); `None` keeps its default, one thread.
    pub spring_concurrency: Option<u32>,
}

impl Workload {
    /// Happy path: `events` records of `payload_bytes`, none fails.
    pub fn throughput(events: u64, payload_bytes: usize) -> Workload {
        Workload {
            name: "throughput",
            events,
            payload_bytes,
            failures: 0,
            delays: Vec::new(),
            deadline: Duration::from_secs(300),
            spring_concurrency: None,
        }
    }

    /// The same workload with Spring's listener running `threads` consumer threads.
    pub fn with_spring_concurrency(mut self, threads: u32) -> Workload {
        self.spring_concurrency = Some(threads);
        self
    }

    /// Every event fails once and retries after one fixed `delay`.
    pub fn fixed_delay(events: u64, delay: Duration) -> Workload {
        Workload {
            name: "fixed",
            events,
            payload_bytes: 100,
            failures: 1,
            delays: vec![delay],
            // Spring's main topic takes up to fetch.max.wait.ms (500 ms) per failure at the log's end.
            deadline: delay + Duration::from_secs(900),
            spring_concurrency: None,
        }
    }

    /// Every event fails seven times and retries after 1, 2, 4, 8, 16, 32 and 60 s: Spring's exponential
    /// back-off (×2 from 1 s, capped at 60 s) and the same delays as an SDK policy.
    pub fn spread(events: u64) -> Workload {
        let delays: Vec<Duration> = [1, 2, 4, 8, 16, 32, 60]
            .into_iter()
            .map(Duration::from_secs)
            .collect();
        let total: Duration = delays.iter().sum();
        Workload {
            name: "spread",
            events,
            payload_bytes: 100,
            failures: delays.len() as u32,
            delays,
            // As above, per failure on each of its topics.
            deadline: total + Duration::from_secs(1_200),
            spring_concurrency: None,
        }
    }

    /// Retries the workload makes in all.
    pub fn retries(&self) -> u64 {
        self.events * u64::from(self.failures)
    }

    /// The SDK's retry policy for this workload (`None`: keep the consumer's default).
    pub fn sdk_policy(&self) -> Option<String> {
        (!self.delays.is_empty()).then(|| {
            self.delays
                .iter()
                .map(|d| format!("{}ms", d.as_millis()))
                .collect::<Vec<_>>()
                .join(",")
        })
    }

    /// The Spring app's properties for this workload beyond topic, group and broker: attempts and the
    /// back-off of `@RetryableTopic` (left at their defaults on the happy path).
    pub fn spring_properties(&self) -> Vec<(String, String)> {
        let mut props = vec![
            ("peer.events".to_string(), self.events.to_string()),
            ("peer.failures".to_string(), self.failures.to_string()),
        ];
        if let Some(threads) = self.spring_concurrency {
            props.push((
                "spring.kafka.listener.concurrency".into(),
                threads.to_string(),
            ));
        }
        let Some(first) = self.delays.first() else {
            return props;
        };
        props.push(("peer.attempts".into(), (self.failures + 1).to_string()));
        props.push(("peer.delay-ms".into(), first.as_millis().to_string()));
        if let (Some(second), Some(last)) = (self.delays.get(1), self.delays.last()) {
            let multiplier = second.as_secs_f64() / first.as_secs_f64();
            props.push(("peer.multiplier".into(), format!("{multiplier}")));
            props.push(("peer.max-delay-ms".into(), last.as_millis().to_string()));
        }
        props
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        match self.failures {
            0 => format!("{} records of {} B", self.events, self.payload_bytes),
            1 => format!(
                "one fixed {} s retry x {}",
                self.delays[0].as_secs_f64(),
                self.events
            ),
            _ => format!(
                "delays 1-60 s ({} retries per event) x {} events = {} retries",
                self.failures,
                self.events,
                self.retries()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spread_is_springs_exponential_back_off_and_the_same_sdk_policy() {
        let w = Workload::spread(171);
        assert_eq!(w.retries(), 1_197);
        assert_eq!(
            w.sdk_policy().as_deref(),
            Some("1000ms,2000ms,4000ms,8000ms,16000ms,32000ms,60000ms")
        );
        let props = w.spring_properties();
        let get = |k: &str| {
            props
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("peer.attempts"), Some("8"));
        assert_eq!(get("peer.delay-ms"), Some("1000"));
        assert_eq!(get("peer.multiplier"), Some("2"));
        assert_eq!(get("peer.max-delay-ms"), Some("60000"));
        assert_eq!(get("peer.failures"), Some("7"));
    }

    #[test]
    fn a_fixed_delay_is_one_retry_and_the_happy_path_keeps_both_defaults() {
        let fixed = Workload::fixed_delay(1_000, Duration::from_secs(5));
        assert_eq!(fixed.sdk_policy().as_deref(), Some("5000ms"));
        let props = fixed.spring_properties();
        assert!(props.contains(&("peer.attempts".into(), "2".into())));
        assert!(props.contains(&("peer.delay-ms".into(), "5000".into())));
        assert!(!props.iter().any(|(k, _)| k == "peer.multiplier"));

        let happy = Workload::throughput(100_000, 1024);
        assert_eq!(happy.sdk_policy(), None);
        assert!(
            !happy
                .spring_properties()
                .iter()
                .any(|(k, _)| k == "peer.attempts" || k.starts_with("peer.delay"))
        );
    }
}
