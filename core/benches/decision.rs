//! The core decision path per failed event: decode metadata, classify the error, decide with the policy,
//! step the lifecycle, encode metadata for the retry copy. Target: well under 1 µs per event.
//!
//! Encoding writes the fields into a byte sink laid out like Kafka record headers (length-prefixed name and
//! value), which is what an adapter does with [`metadata::encode_into`]; the broker client's own header
//! copies are the adapter's cost, not the core's.
//!
//! `cargo bench -p event-retry-core --bench decision` (the `bench` profile: thin LTO, one codegen unit), and
//! `cargo bench -p event-retry-core --bench decision --profile release` for a plain release build.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use event_retry_core::classify::{Classifier, FailureKind, HandlerError};
use event_retry_core::decide::{Attempt, Outcome, Policies, decide};
use event_retry_core::headers::Headers;
use event_retry_core::lifecycle::{Input, State};
use event_retry_core::metadata::{self, Origin, RetryMetadata};
use event_retry_core::policy::RetryPolicy;
use event_retry_core::time::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Record headers serialized as Kafka lays them out: varint-length name, varint-length value.
struct WireHeaders(Vec<u8>);

impl WireHeaders {
    fn varint(&mut self, mut n: usize) {
        while n >= 0x80 {
            self.0.push((n as u8) | 0x80);
            n >>= 7;
        }
        self.0.push(n as u8);
    }
}

impl metadata::HeaderSink for WireHeaders {
    fn header(&mut self, name: &'static str, value: &[u8]) {
        self.varint(name.len());
        self.0.extend_from_slice(name.as_bytes());
        self.varint(value.len());
        self.0.extend_from_slice(value);
    }
}

#[derive(Debug, thiserror::Error)]
#[error("connection refused")]
struct ConnectError;

#[derive(Debug, thiserror::Error)]
#[error("could not save order")]
struct SaveError(#[source] Box<dyn std::error::Error + Send + Sync>);

fn decision_path(c: &mut Criterion) {
    let classifier = Classifier::new()
        .on_type::<ConnectError>(FailureKind::Blocking)
        .on_message("not yet replicated", FailureKind::Deferred)
        .unwrap_or_else(|e| panic!("{e}"))
        .default_kind(FailureKind::Deferred);
    let policies = Policies {
        deferred: RetryPolicy::parse("5000x3,10000x5; jitter=10%")
            .unwrap_or_else(|e| panic!("{e}")),
        ..Policies::default()
    };
    let meta = RetryMetadata {
        event_id: Some("order-12345".into()),
        attempts: 2,
        retries: 2,
        first_seen: Some(Timestamp::from_millis(1_700_000_000_000)),
        due_at: Some(Timestamp::from_millis(1_700_000_010_000)),
        origin: Some(Origin::new("orders").at(3, 98_765)),
        last_error: Some("row not yet replicated".into()),
        error_kind: Some(FailureKind::Deferred),
        last_delay: Some(std::time::Duration::from_secs(5)),
        ..RetryMetadata::default()
    };
    let foreign = Headers::new().with(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    let wire = metadata::encode(&meta, &foreign);
    let error = HandlerError::unclassified(SaveError("row not yet replicated".into()));
    let now = Timestamp::from_millis(1_700_000_012_000);
    let mut rng = StdRng::seed_from_u64(1);

    c.bench_function("part/decode", |b| {
        b.iter(|| metadata::decode(black_box(&wire)))
    });
    c.bench_function("part/classify", |b| {
        b.iter(|| classifier.classify(black_box(&error)))
    });
    c.bench_function("part/decide", |b| {
        b.iter(|| {
            let attempt = Attempt {
                meta: black_box(&meta),
                in_place_retries: 0,
                holds: 0,
                now,
                chosen_delay: None,
            };
            decide(Err(FailureKind::Deferred), &attempt, &policies, &mut rng)
        })
    });
    let mut wire_out = WireHeaders(Vec::with_capacity(512));
    c.bench_function("part/encode", |b| {
        b.iter(|| {
            wire_out.0.clear();
            metadata::encode_into(black_box(&meta), &mut wire_out);
            wire_out.0.len()
        })
    });
    c.bench_function("part/encode_to_headers", |b| {
        b.iter(|| metadata::encode(black_box(&meta), &foreign))
    });
    // Everything up to the retry copy's metadata: decode, classify, decide, step the lifecycle.
    let decide_retry_copy = |rng: &mut StdRng| {
        let (mut meta, foreign) =
            metadata::decode(black_box(&wire)).unwrap_or_else(|e| panic!("{e}"));
        let kind = classifier.classify(black_box(&error));
        let attempt = Attempt {
            meta: &meta,
            in_place_retries: 0,
            holds: 0,
            now,
            chosen_delay: None,
        };
        let outcome = decide(Err(kind), &attempt, &policies, rng);
        let state = State::InFlight { held: false };
        let next = match outcome {
            Outcome::RetryAfter(d) => {
                meta.retries += 1;
                meta.due_at = Some(now.plus(d));
                state.on(Input::Retry {
                    available_at: now.plus(d),
                })
            }
            _ => state.on(Input::Die),
        };
        let event = event_retry_core::adapter::event_from_parts(Bytes::new(), None, foreign, meta);
        (next, event)
    };
    c.bench_function("decode+classify+decide+transition+encode", |b| {
        b.iter(|| {
            let (next, event) = decide_retry_copy(&mut rng);
            wire_out.0.clear();
            metadata::encode_into(event.metadata(), &mut wire_out);
            black_box((next, wire_out.0.len()))
        })
    });
    // The same path as the adapters take it: the retry copy is built with `Event::to_raw` (a header
    // list of owned values, which the adapter then hands to its client), not written into a buffer.
    c.bench_function(
        "decode+classify+decide+transition+to_raw (the adapters' path)",
        |b| {
            b.iter(|| {
                let (next, event) = decide_retry_copy(&mut rng);
                black_box((next, event.to_raw()))
            })
        },
    );
}

criterion_group!(benches, decision_path);
criterion_main!(benches);
