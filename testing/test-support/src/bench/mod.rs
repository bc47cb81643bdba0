//! What every adapter's bench binary does the same way: start, pick its parts, publish the events, run
//! the SDK's throughput round, report the rounds, and measure retry lateness.
//!
//! An adapter's bench adds only its raw-client round and its set-up (declaring topics or queues). The
//! files: `workload` (the events a bench publishes and the work per event), `clock` (a round's rates and
//! CPU), `round` (the contenders' rounds), `throughput` (their report) and `lateness`.

mod clock;
mod lateness;
mod round;
mod throughput;
mod workload;

use std::future::Future;

use event_retry_core::adapter::Admin;
use event_retry_core::broker::Broker;

pub use clock::{Clock, Countdown, CpuPerMessage, Rate};
pub use lateness::{lateness, percentile};
pub use round::{Contender, RoundRates, rotated_round, sdk_batch_round, sdk_round, warm_up};
pub use throughput::{Throughput, spread};
pub use workload::{
    count_from_env, messages, payload, payload_bytes, payload_label, publish_all, work,
};

/// A bench's error.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Runs a bench binary against the broker whose URL is in `env` (`broker` is its name in
/// `scripts/brokers`): without it, says how to start it and exits with status 2; `cargo test` (which
/// passes `--test` or `--list`) only checks that it starts.
pub fn main<F, Fut>(env: &str, broker: &str, run: F) -> Result<(), Error>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let Some(url) = crate::broker::url(env) else {
        eprintln!(
            "{env} is not set: start the broker (scripts/brokers start {broker}) and source target/brokers/env.sh"
        );
        std::process::exit(2);
    };
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(url))
}

fn parts_asked() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect()
}

/// Whether to run `part`: every part runs when none is named (`cargo bench … -- throughput` runs one).
pub fn wants(part: &str) -> bool {
    let asked = parts_asked();
    asked.is_empty() || asked.iter().any(|a| a == part)
}

/// Whether `part` was named explicitly (for parts a default run leaves out).
pub fn asked(part: &str) -> bool {
    parts_asked().iter().any(|a| a == part)
}

/// When this process is the helper consumer of a part that runs its consumers apart ([`backlog`],
/// [`scale`]), runs it and returns its end; `None` in the bench's own process.
///
/// [`backlog`]: crate::backlog
/// [`scale`]: crate::scale
pub async fn helper_consumer(broker: &Broker) -> Option<Result<(), Error>> {
    if asked(crate::backlog::CONSUMER_PART) {
        Some(crate::backlog::consumer(broker).await)
    } else if asked(crate::scale::CONSUMER_PART) {
        Some(crate::scale::consumer(broker).await)
    } else {
        None
    }
}

/// The parts whose consumers run in processes of their own, where asked for: `backlog` (`describe`
/// says how the broker delays; `position` reads where the group stands if a healthy event goes missing)
/// and `scale` (its topics declared through `scale_admin`).
pub async fn consumer_process_parts(
    broker: &Broker,
    name: &str,
    describe: &str,
    scale_admin: &dyn Admin,
    position: Option<&crate::backlog::GroupPosition>,
) -> Result<(), Error> {
    if wants("backlog") {
        crate::backlog::run(broker, name, describe, position).await?;
    }
    if wants("scale") {
        crate::scale::run(broker, name, scale_admin).await?;
    }
    Ok(())
}

/// Deletes a finished part's `topic` with what the adapter keeps beside it (its DLQ, delay levels or
/// retry route): a broker keeps every record it was given, so a few runs would otherwise fill it. A
/// topic left behind (the adapter cannot delete one, or the delete failed) is reported, not an error:
/// the part's figures stand.
pub async fn tidy(admin: &dyn Admin, topic: &str) {
    match admin.delete(topic).await {
        Ok(()) => {}
        Err(e) if e.kind() == event_retry_core::error::Kind::Unsupported => {
            println!("(topic {topic} left in the broker: {e})");
        }
        Err(e) => {
            eprintln!("warning: topic {topic} of a finished part was left on the broker: {e}")
        }
    }
}
