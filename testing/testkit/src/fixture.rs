//! What a scenario needs from an adapter: a broker, fresh topics, a delay unit, and a few fault switches.
//!
//! An adapter's own test builds one [`Fixture`] over a real broker and hands it to [`crate::run`].
//! Topics are declared and deleted through the broker's [`Admin`](event_retry_core::adapter::Admin), the same
//! on every broker; only the faults, which each broker injects its own way, are the adapter's to write.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use event_retry_core::adapter::Capabilities;
use event_retry_core::broker::Broker;
use event_retry_core::error::Error;

/// Faults a broker's test can inject; a scenario that needs one is skipped, with the reason, where the
/// fixture has none.
#[async_trait]
pub trait Faults: Send + Sync + 'static {
    /// Makes the DLQ that consumer group `group`'s dead letters of `topic` go to refuse writes (`false`)
    /// or accept them again (`true`). (The DLQ is the topic's on most brokers; the group's own with
    /// consumer groups through SNS.)
    async fn set_dlq_writable(&self, topic: &str, group: &str, writable: bool)
    -> Result<(), Error>;
}

/// The broker's own view of a topic, read with the broker's raw client (never through the adapter), for
/// scenarios that claim something about the broker's state.
#[async_trait]
pub trait Inspect: Send + Sync + 'static {
    /// How many messages of `topic` the broker still holds for consumer group `group` — not acknowledged,
    /// not committed, not deleted, whether waiting, handed out or held unacknowledged by a consumer: what
    /// the group would be given again if its consumers died. Called while a consumer runs, and after.
    async fn held_in_source(&self, topic: &str, group: &str) -> Result<u64, Error>;

    /// How many messages have gone onto `topic`'s retry route for `group` — its retry topic and delay
    /// ladder, or whatever carries a retry on this broker — since the topic was declared; `None` when
    /// the broker's own view cannot tell this topic's from others' (a ladder shared by every topic).
    async fn sent_to_retry_route(&self, topic: &str, group: &str) -> Result<Option<u64>, Error> {
        let _ = (topic, group);
        Ok(None)
    }

    /// Why [`Inspect::sent_to_retry_route`] cannot read this broker's retry route, for the report.
    fn retry_route_unread(&self) -> &'static str {
        "the broker has no retry route of this topic's own to read"
    }

    /// The messages [`Inspect::held_in_source`] counts, split into those waiting to be handed out and
    /// those handed out to a consumer and not settled; `None` where the broker cannot tell them apart.
    /// While a consumer holds one delivery and receives nothing more, the held delivery is the one
    /// handed out: a broker that can split tells the original from a copy of it.
    async fn held_parts(&self, topic: &str, group: &str) -> Result<Option<HeldParts>, Error> {
        let _ = (topic, group);
        Ok(None)
    }
}

/// A source's held messages in two parts ([`Inspect::held_parts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldParts {
    /// Waiting to be handed out: ready, visible or delayed.
    pub waiting: u64,
    /// Handed out to a consumer and not yet settled: unacknowledged, in flight.
    pub handed_out: u64,
}

/// A message as the broker's own client describes it: one `(field, value)` line per thing a producer
/// sets, in the broker's order, each value written with its native type (`header count = LongInt(7)`,
/// `property content-type = "text/plain"`, `key = 00ff…`). A line named `payload` holds the payload in hex.
pub type NativeMessage = Vec<(String, String)>;

/// Lowercase hex of `bytes`: how a [`NativeMessage`] writes payloads, keys and binary values.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The broker's own client, for scenarios that publish and read messages the way another application
/// would — so that what they claim about a message is read from the broker, not through the SDK's decoder.
#[async_trait]
pub trait RawClient: Send + Sync + 'static {
    /// Publishes to `topic`, with the raw client, a message whose payload is `payload` and which uses
    /// everything a producer can set on this broker: headers or properties with names out of order and,
    /// where the broker keeps them, repeated; a value of every native type; the envelope's own fields
    /// (content type, correlation id, timestamps, keys, data types, …). Returns it as published.
    async fn publish_native(&self, topic: &str, payload: &[u8]) -> Result<NativeMessage, Error>;

    /// Every message now in the DLQ of `topic`, read with the raw client and left there, described like
    /// [`RawClient::publish_native`]'s result. The SDK's own names (`x-retry-*`) are left out, and so is
    /// what the broker assigns by itself (ids, offsets, arrival times).
    async fn dead_letters(&self, topic: &str) -> Result<Vec<NativeMessage>, Error>;
}

/// What a fixture offers beyond the broker: scenarios that need more are skipped, with the reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Abilities {
    /// [`Faults`] are given.
    pub faults: bool,
    /// [`Inspect`] is given.
    pub inspect: bool,
    /// A [`RawClient`] is given.
    pub raw_client: bool,
    /// Scenarios start their consumers with a batch handler ([`Fixture::with_batch_handler`]).
    pub batch_handler: bool,
}

/// One adapter under test.
#[derive(Clone)]
pub struct Fixture {
    name: &'static str,
    broker: Broker,
    delay_unit: Duration,
    faults: Option<Arc<dyn Faults>>,
    inspect: Option<Arc<dyn Inspect>>,
    raw_client: Option<Arc<dyn RawClient>>,
    topic_suffix: &'static str,
    child_exe: Option<(std::path::PathBuf, Vec<(String, String)>)>,
    known_gaps: Vec<(&'static str, &'static str)>,
    batch: bool,
}

impl std::fmt::Debug for Fixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture")
            .field("name", &self.name)
            .field("broker", &self.broker)
            .field("delay_unit", &self.delay_unit)
            .field("abilities", &self.abilities())
            .finish()
    }
}

impl Fixture {
    /// A fixture named `name` (in test names and the report) over `broker`. `delay_unit` is the base delay
    /// scenarios use: long enough that the broker distinguishes it (at least its granularity), short
    /// enough that the suite stays quick.
    pub fn new(name: &'static str, broker: Broker, delay_unit: Duration) -> Self {
        Self {
            name,
            broker,
            delay_unit,
            faults: None,
            inspect: None,
            raw_client: None,
            topic_suffix: "",
            child_exe: None,
            known_gaps: Vec::new(),
            batch: false,
        }
    }

    /// The program that runs this fixture's consumer in a child process (the adapter's test binary),
    /// and the variables it needs to reach the same broker (its URL, however the suite found it), for
    /// scenarios that kill a consumer for real; the suite sets it for a broker outside the process.
    pub fn with_child_exe(mut self, exe: std::path::PathBuf, env: Vec<(String, String)>) -> Self {
        self.child_exe = Some((exe, env));
        self
    }

    /// The program that runs this fixture's consumer in a child process, and its variables, if there
    /// is one.
    pub fn child_exe(&self) -> Option<(&std::path::Path, &[(String, String)])> {
        self.child_exe
            .as_ref()
            .map(|(exe, env)| (exe.as_path(), env.as_slice()))
    }

    /// Marks the scenario named `scenario` as one this fixture's server cannot run, for the reason
    /// `why` (a bug of an emulator standing in for the real service): the suite skips it loudly, with
    /// the reason, and counts it as skipped in the report — never as passed.
    pub fn with_known_gap(mut self, scenario: &'static str, why: &'static str) -> Self {
        self.known_gaps.push((scenario, why));
        self
    }

    /// Why the scenario named `scenario` cannot run against this fixture's server, if it is a known
    /// gap of it ([`Fixture::with_known_gap`]).
    pub fn known_gap(&self, scenario: &str) -> Option<&'static str> {
        self.known_gaps
            .iter()
            .find(|(n, _)| *n == scenario)
            .map(|(_, why)| *why)
    }

    /// Starts every scenario's consumer with a batch handler ([`Consumer::start_batch`]) that runs the
    /// scenario's per-event script on each event of the batch, concurrently: the same assertions, over
    /// the runtime's batch path.
    ///
    /// [`Consumer::start_batch`]: event_retry_core::runtime::Consumer::start_batch
    pub fn with_batch_handler(mut self) -> Self {
        self.batch = true;
        self
    }

    /// Whether scenarios start their consumers with a batch handler ([`Fixture::with_batch_handler`]).
    pub fn batch_handler(&self) -> bool {
        self.batch
    }

    /// Ends every fresh topic's name with `suffix` — `.fifo` makes the SQS fixture's queues FIFO queues,
    /// and the capabilities the scenarios adapt to are those of such a topic.
    pub fn with_topic_suffix(mut self, suffix: &'static str) -> Self {
        self.topic_suffix = suffix;
        self
    }

    /// Adds the broker's own client.
    pub fn with_raw_client(mut self, raw: impl RawClient) -> Self {
        self.raw_client = Some(Arc::new(raw));
        self
    }

    /// The broker's own client, if the adapter's test gave it.
    pub fn raw_client(&self) -> Option<&dyn RawClient> {
        self.raw_client.as_deref()
    }

    /// Adds the broker's own view, read with its raw client.
    pub fn with_inspect(mut self, inspect: impl Inspect) -> Self {
        self.inspect = Some(Arc::new(inspect));
        self
    }

    /// The broker's own view, if the adapter's test gave it.
    pub fn inspect(&self) -> Option<&dyn Inspect> {
        self.inspect.as_deref()
    }

    /// What this fixture offers beyond the broker.
    pub fn abilities(&self) -> Abilities {
        Abilities {
            faults: self.faults.is_some(),
            inspect: self.inspect.is_some(),
            raw_client: self.raw_client.is_some(),
            batch_handler: self.batch,
        }
    }

    /// Adds the faults this broker's test can inject.
    pub fn with_faults(mut self, faults: impl Faults) -> Self {
        self.faults = Some(Arc::new(faults));
        self
    }

    /// The adapter's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The broker under test (shared by all scenarios; each uses its own topics).
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// The broker's capabilities for the fixture's topics; scenarios adapt their expectations to these.
    pub fn capabilities(&self) -> Capabilities {
        self.broker
            .capabilities_for(&format!("conformance{}", self.topic_suffix))
    }

    /// The base delay of the scenarios.
    pub fn delay_unit(&self) -> Duration {
        self.delay_unit
    }

    /// The fault switches, if the adapter's test gave any.
    pub fn faults(&self) -> Option<&dyn Faults> {
        self.faults.as_deref()
    }

    /// A new topic with a unique name, declared with everything it needs (DLQ, delay route).
    pub async fn fresh_topic(&self, scenario: &str) -> Result<String, Error> {
        let topic = format!(
            "conformance-{scenario}-{}{}",
            uuid::Uuid::new_v4().simple(),
            self.topic_suffix
        );
        self.broker.admin().declare(&topic, None).await?;
        Ok(topic)
    }

    /// Deletes what [`Fixture::fresh_topic`] created (best effort: a broker whose adapter cannot delete
    /// topics keeps them, and a failed deletion is only reported).
    pub async fn cleanup(&self, topic: &str) {
        match self.broker.admin().delete(topic).await {
            Ok(()) => {}
            Err(e) if e.kind() == event_retry_core::error::Kind::Unsupported => {}
            Err(e) => eprintln!("{}: leaving {topic} behind: {e}", self.name),
        }
    }
}
