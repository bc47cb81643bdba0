//! The adapter's settings: SQS's limits (scaled down in tests), queue names, and what it may change.

use std::time::Duration;

use event_retry_core::error::{Error, Kind};
use event_retry_core::options::Options;

pub use crate::client::ClientSettings;

/// The adapter's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqsConfig {
    /// The visibility a receive asks for, and how far a heartbeat extends it while a handler runs. A
    /// consumer that dies without releasing its messages gives them back after this. Default 30 s.
    pub visibility: Duration,
    /// The longest visibility SQS allows, counted from the receive: 12 h. A retry that would end later is
    /// carried by a copy (re-sent with its metadata and hidden again on arrival) instead of being capped.
    pub max_visibility: Duration,
    /// The longest `DelaySeconds` of a send: 15 min.
    pub max_send_delay: Duration,
    /// How long one receive waits for messages (long polling, at most 20 s). Shorter makes a due retry
    /// surface sooner on an endpoint that does not wake long polls for it. Default 1 s.
    pub wait: Duration,
    /// Suffix of a queue's DLQ name (before `.fifo`). Default `-dlq`.
    pub dlq_suffix: String,
    /// Create a missing queue and its DLQ (with a redrive policy) on first use. Default true.
    pub create_queues: bool,
    /// `maxReceiveCount` of the redrive policy set on queues this adapter creates or that have none
    /// (`set_redrive`); it must exceed the deliveries a consumer's policy needs. Default 50.
    pub max_receive_count: u32,
    /// Set a redrive policy on an existing queue that has none. Default false (an existing queue's
    /// attributes are its owner's; a missing redrive policy is logged as a warning).
    pub set_redrive: bool,
    /// How many visibility retries a consumer remembers the metadata of (about 0.6 KB each) to give it
    /// back when the message returns. Beyond it a standard queue carries a retry by a copy with its
    /// metadata instead (a send and a delete instead of one visibility change), so the process's memory
    /// does not grow with the retries waiting in the queue; a FIFO queue, which cannot delay a copy, keeps
    /// the broker's counts only for those. Default 1,000.
    pub remembered_retries: usize,
    /// Consumer groups through Amazon SNS: a topic is an SNS topic of that name, and each consumer group
    /// has a queue of its own subscribed to it (raw message delivery), with its own DLQ, so every group
    /// receives every event and retries and dead-letters its own. The default group's queue is named as
    /// the topic, another group's `<topic>-<group>`. The SNS client shares the SQS client's region,
    /// credentials and endpoint. Default false: a topic is one queue whose consumers share its messages.
    pub sns: bool,
    /// Retries through a queue of their own beside each standard source queue, `<queue><retry_suffix>`,
    /// which the consumer receives from beside the source and hands out first: a retry is a copy
    /// carrying its metadata, sent there with its delay (hidden again on arrival while not due), and the
    /// original is deleted once SQS accepted it. A due retry then runs on time while a backlog waits in
    /// the source queue, where a visibility retry becomes visible behind every message already waiting.
    /// Costs a send and a delete per retry instead of one visibility change, and one more long poll per
    /// consumer. The retry queue is created beside the source (redriving to the source's DLQ) when
    /// creating queues is on, and must exist when it is off. FIFO queues keep visibility retries (SQS
    /// cannot delay one message of a FIFO queue). Default true; false keeps every retry in the source
    /// queue by visibility (one `ChangeMessageVisibility` per retry, no second queue), and a due retry
    /// then waits behind the messages already visible there.
    pub retry_queue: bool,
    /// Suffix of a source queue's retry queue name (`retry_queue`). Default `-retry`.
    pub retry_suffix: String,
    /// How far apart a consumer's short polls of the retry queue are while they find nothing (up to
    /// this much is added to a retry's lateness). The retry queue is not long-polled: every copy sent
    /// to a queue with a waiting receive wakes it, and on ElasticMQ each wake re-examines the whole
    /// queue, so a burst of retries slowed down as the queue filled. Each poll is a request (at 200 ms,
    /// five a second per consumer: about 13 million a month, which AWS bills). Default 200 ms.
    pub retry_poll: Duration,
}

impl Default for SqsConfig {
    fn default() -> Self {
        Self {
            visibility: Duration::from_secs(30),
            max_visibility: Duration::from_secs(12 * 3600),
            max_send_delay: Duration::from_secs(900),
            wait: Duration::from_secs(1),
            dlq_suffix: "-dlq".to_string(),
            create_queues: true,
            max_receive_count: 50,
            set_redrive: false,
            remembered_retries: 1_000,
            sns: false,
            retry_queue: true,
            retry_suffix: "-retry".to_string(),
            retry_poll: Duration::from_millis(200),
        }
    }
}

impl SqsConfig {
    /// The settings from text options (URL query parameters or the config file's `[broker]` section),
    /// starting from the defaults: `visibility`, `max_visibility`, `max_send_delay`, `wait` (durations
    /// such as `30s`), `dlq_suffix`, `declare` (formerly `create_queues`), `max_receive_count`, `set_redrive`,
    /// `remembered_retries`, `sns`, `retry_queue`, `retry_suffix`, `retry_poll`; and `region`
    /// and `profile` (the AWS shared-config profile), returned apart for the client. An unknown key is
    /// an error.
    pub fn from_options(options: &Options) -> Result<(Self, ClientSettings), Error> {
        let mut c = Self::default();
        let mut read = options.reader("Amazon SQS");
        if let Some(v) = read.duration("visibility")? {
            c.visibility = v;
        }
        if let Some(v) = read.duration("max_visibility")? {
            c.max_visibility = v;
        }
        if let Some(v) = read.duration("max_send_delay")? {
            c.max_send_delay = v;
        }
        if let Some(v) = read.duration("wait")? {
            c.wait = v;
        }
        if let Some(v) = read.string("dlq_suffix") {
            c.dlq_suffix = v;
        }
        read.renamed("create_queues", "declare")?;
        if let Some(v) = read.bool("declare")? {
            c.create_queues = v;
        }
        if let Some(v) = read.number("max_receive_count")? {
            c.max_receive_count = v;
        }
        if let Some(v) = read.bool("set_redrive")? {
            c.set_redrive = v;
        }
        if let Some(v) = read.number("remembered_retries")? {
            c.remembered_retries = v;
        }
        if let Some(v) = read.bool("sns")? {
            c.sns = v;
        }
        if let Some(v) = read.bool("retry_queue")? {
            c.retry_queue = v;
        }
        if let Some(v) = read.string("retry_suffix") {
            c.retry_suffix = v;
        }
        if let Some(v) = read.duration("retry_poll")? {
            c.retry_poll = v;
        }
        let client = ClientSettings {
            region: read.string("region"),
            profile: read.string("profile"),
        };
        read.finish()?;
        c.validate()?;
        Ok((c, client))
    }

    /// Checks the settings against what SQS accepts.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |why: String| Err(Error::new(Kind::Config, why));
        let whole = |d: Duration| d.subsec_nanos() == 0;
        if !whole(self.visibility)
            || self.visibility.is_zero()
            || self.visibility > self.max_visibility
        {
            return bad(format!(
                "visibility must be whole seconds between 1 s and max_visibility, got {:?}",
                self.visibility
            ));
        }
        if !whole(self.max_visibility) || self.max_visibility > Duration::from_secs(43_200) {
            return bad(format!(
                "max_visibility must be whole seconds up to SQS's 12 h, got {:?}",
                self.max_visibility
            ));
        }
        if !whole(self.max_send_delay) || self.max_send_delay > Duration::from_secs(900) {
            return bad(format!(
                "max_send_delay must be whole seconds up to SQS's 15 min, got {:?}",
                self.max_send_delay
            ));
        }
        if !whole(self.wait) || self.wait > Duration::from_secs(20) {
            return bad(format!(
                "wait must be whole seconds up to 20 s, got {:?}",
                self.wait
            ));
        }
        if !(1..=1000).contains(&self.max_receive_count) {
            return bad(format!(
                "max_receive_count must be 1..=1000 (SQS's range), got {}",
                self.max_receive_count
            ));
        }
        if self.dlq_suffix.is_empty() {
            return bad("dlq_suffix must not be empty".to_string());
        }
        if self.retry_poll.is_zero() || self.retry_poll > Duration::from_secs(20) {
            return bad(format!(
                "retry_poll must be above zero and at most 20 s, got {:?}",
                self.retry_poll
            ));
        }
        if self.retry_suffix.is_empty() || self.retry_suffix == self.dlq_suffix {
            return bad(format!(
                "retry_suffix must be set and differ from dlq_suffix, got {:?}",
                self.retry_suffix
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_sqs_limits() {
        let c = SqsConfig::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.max_visibility, Duration::from_secs(43_200));
    }

    #[test]
    fn retries_go_through_a_retry_queue_by_default() {
        let c = SqsConfig::default();
        assert!(c.retry_queue);
        assert_eq!(c.retry_suffix, "-retry");
        let (off, _) = SqsConfig::from_options(&Options::new().set("retry_queue", "false"))
            .unwrap_or_default();
        assert!(!off.retry_queue);
    }

    #[test]
    fn the_old_name_of_declare_is_still_read() {
        let (c, _) = SqsConfig::from_options(&Options::new().set("create_queues", "false"))
            .unwrap_or_default();
        assert!(!c.create_queues);
    }

    #[test]
    fn options_set_every_field() {
        let options = Options::new()
            .set("visibility", "20s")
            .set("max_visibility", "1h")
            .set("max_send_delay", "60s")
            .set("wait", "2s")
            .set("dlq_suffix", "-dead")
            .set("declare", "false")
            .set("max_receive_count", "10")
            .set("set_redrive", "true")
            .set("remembered_retries", "0")
            .set("sns", "true")
            .set("retry_queue", "false")
            .set("retry_suffix", "-later")
            .set("retry_poll", "500ms")
            .set("region", "eu-west-1");
        let (c, region) = SqsConfig::from_options(&options).unwrap_or_default();
        assert_eq!(c.visibility, Duration::from_secs(20));
        assert_eq!(c.max_visibility, Duration::from_secs(3600));
        assert_eq!(c.max_send_delay, Duration::from_secs(60));
        assert_eq!(c.wait, Duration::from_secs(2));
        assert_eq!(c.dlq_suffix, "-dead");
        assert!(!c.create_queues && c.set_redrive);
        assert_eq!(c.max_receive_count, 10);
        assert_eq!(c.remembered_retries, 0);
        assert!(c.sns);
        assert!(!c.retry_queue);
        assert_eq!(c.retry_suffix, "-later");
        assert_eq!(c.retry_poll, Duration::from_millis(500));
        assert_eq!(region.region.as_deref(), Some("eu-west-1"));
        let typo = SqsConfig::from_options(&Options::new().set("visiblity", "1s"));
        assert_eq!(typo.err().map(|e| e.kind()), Some(Kind::Config));
        let fraction = SqsConfig::from_options(&Options::new().set("wait", "1500ms"));
        assert!(fraction.is_err(), "SQS waits whole seconds");
    }

    #[test]
    fn beyond_sqs_limits_is_refused() {
        for bad in [
            SqsConfig {
                max_visibility: Duration::from_secs(43_201),
                ..SqsConfig::default()
            },
            SqsConfig {
                wait: Duration::from_millis(1_500),
                ..SqsConfig::default()
            },
            SqsConfig {
                max_receive_count: 0,
                ..SqsConfig::default()
            },
            SqsConfig {
                retry_suffix: "-dlq".into(),
                ..SqsConfig::default()
            },
            SqsConfig {
                retry_poll: Duration::ZERO,
                ..SqsConfig::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
