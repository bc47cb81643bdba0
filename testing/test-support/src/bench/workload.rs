//! The events a bench publishes (their count and JSON payloads of an exact size, set from the
//! environment) and the work every consumer does per event.

use futures::{StreamExt, TryStreamExt};

use event_retry_core::broker::Broker;
use event_retry_core::event::Event;

use super::Error;

/// The work every consumer does per message: look at every byte (so the payload is really read).
pub fn work(payload: &[u8]) -> u64 {
    payload.iter().map(|b| u64::from(*b)).sum()
}

/// The payload size of the events a bench publishes, in bytes: `RETRY_BENCH_PAYLOAD` (for example
/// `100`, `1024`, `16384`), 230 when unset.
pub fn payload_bytes() -> Result<usize, Error> {
    count_from_env("RETRY_BENCH_PAYLOAD", DEFAULT_PAYLOAD, MIN_PAYLOAD)
}

/// How many messages a throughput round drains: `RETRY_BENCH_MESSAGES`, or `default` when unset.
pub fn messages(default: usize) -> Result<usize, Error> {
    count_from_env("RETRY_BENCH_MESSAGES", default, 1)
}

/// The whole number in the variable `name` (at least `min`), or `default` when it is unset; anything
/// else is an error naming the variable.
pub fn count_from_env(name: &str, default: usize, min: usize) -> Result<usize, Error> {
    match std::env::var(name) {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(format!("{name}={v:?}: expected a whole number of at least {min}").into()),
        },
        Err(_) => Ok(default),
    }
}

/// The payload size when `RETRY_BENCH_PAYLOAD` is unset.
pub(super) const DEFAULT_PAYLOAD: usize = 230;

/// A payload size as the ratio lines name it: `100B`, `1KB` (1,024 bytes), `16KB`, `230B`.
pub fn payload_label(bytes: usize) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}KB", bytes / 1024)
    } else {
        format!("{bytes}B")
    }
}

/// The smallest payload: room for the JSON frame around the padding.
const MIN_PAYLOAD: usize = 32;

/// A JSON payload of exactly `size` bytes for event `i` (`size` at least 32 bytes):
/// `{"id":i,"pad":"xx…"}`.
pub fn payload(i: usize, size: usize) -> String {
    let head = format!("{{\"id\":{i},\"pad\":\"");
    let pad = size.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

/// Publishes `messages` events of [`payload_bytes`] each (ids `m0`, `m1`, …), `at_once` at a time.
pub async fn publish_all(
    broker: &Broker,
    topic: &str,
    messages: usize,
    at_once: usize,
) -> Result<(), Error> {
    let size = payload_bytes()?;
    let producer = broker.producer();
    let producer = &producer;
    futures::stream::iter(0..messages)
        .map(|i| async move {
            let body = payload(i, size);
            producer
                .publish(topic, Event::new(body).with_id(format!("m{i}")))
                .await
                .map(drop)
        })
        .buffer_unordered(at_once)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_named_as_the_ratio_lines_name_them() {
        let labels: Vec<String> = [100, 230, 1024, 16384, 1500]
            .into_iter()
            .map(payload_label)
            .collect();
        assert_eq!(labels, ["100B", "230B", "1KB", "16KB", "1500B"]);
    }

    #[test]
    fn payloads_have_exactly_the_size_asked_and_stay_json() {
        for size in [MIN_PAYLOAD, 100, 230, 1024, 16384] {
            for i in [0, 7, 123_456] {
                let p = payload(i, size);
                assert_eq!(p.len(), size, "event {i}, size {size}");
                assert!(p.starts_with(&format!("{{\"id\":{i},")) && p.ends_with("\"}"));
            }
        }
    }
}
