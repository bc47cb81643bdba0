//! The targets on the core crate's decoders: the policy DSL, the metadata codec, the URL/option parser
//! and the TOML config. Each `fn(&[u8])` panics exactly when the input shows a bug.

use std::time::Duration;

use event_retry_core::classify::FailureKind;
use event_retry_core::config::RetryConfig;
use event_retry_core::decide::{Attempt, Outcome, Policies, decide};
use event_retry_core::headers::Headers;
use event_retry_core::metadata::{self, DeadReason, RetryMetadata};
use event_retry_core::options::{Options, redact_url};
use event_retry_core::policy::RetryPolicy;
use event_retry_core::time::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// The time the decisions are taken at: late 2023.
const NOW: Timestamp = Timestamp::from_millis(1_700_000_000_000);

/// `policy_dsl`: parsing never panics; a parsed policy's `Display` parses back to the same policy,
/// and its delays stay within the bounds it reports.
pub fn policy_dsl(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(policy) = RetryPolicy::parse(text) else {
        return;
    };
    check_policy(&policy);
}

/// The invariants of one parsed policy.
pub fn check_policy(policy: &RetryPolicy) {
    let canonical = policy.to_string();
    match RetryPolicy::parse(&canonical) {
        Ok(back) => assert_eq!(&back, policy, "{canonical:?} does not parse back the same"),
        Err(e) => panic!("the canonical text {canonical:?} does not parse: {e}"),
    }
    let mut rng = StdRng::seed_from_u64(7);
    let limit = policy.max_retries();
    let longest = policy.longest_delay();
    for retry in [0, 1, 2, 3, 10, 1000, u32::MAX - 1, u32::MAX] {
        let spent = limit.is_some_and(|n| retry >= n);
        let nominal = policy.nominal_delay(retry);
        assert_eq!(nominal.is_none(), spent, "retry {retry} of {policy}");
        let bound = policy.max_delay(retry);
        for previous in [None, Some(Duration::ZERO), Some(Duration::MAX)] {
            let delay = policy.delay(retry, previous, &mut rng);
            assert_eq!(delay.is_none(), spent, "retry {retry} of {policy}");
            if let (Some(delay), Some(bound)) = (delay, bound) {
                assert!(
                    delay <= bound,
                    "retry {retry} of {policy}: {delay:?} > {bound:?}"
                );
                assert!(
                    delay <= longest,
                    "retry {retry} of {policy}: {delay:?} > {longest:?}"
                );
            }
        }
    }
    // A delay a handler chooses stays within what the start-up check covered, and is never longer than
    // what was asked for.
    for requested in [Duration::ZERO, Duration::from_secs(30), Duration::MAX] {
        let chosen = policy.chosen_delay(requested);
        assert!(
            chosen <= requested,
            "{policy}: chose {chosen:?} for {requested:?}"
        );
        assert!(
            chosen <= longest,
            "{policy}: chose {chosen:?} > {longest:?}"
        );
    }
    let rows = policy.explain(8);
    assert!(rows.len() <= 8);
}

/// `metadata_headers`: the core codec on a header list (the form every adapter hands it). Never a
/// panic; strict and lenient decoding agree; what decodes leads to a bounded decision (see
/// [`check_metadata`]).
pub fn metadata_headers(data: &[u8]) {
    let headers: Headers = crate::lines::header_lines(data)
        .into_iter()
        .map(|(name, value)| (name, value.unwrap_or_default().into()))
        .collect();
    check_metadata(&headers);
}

/// What the runtime does with a delivery's headers: decode them strictly (an error makes the event
/// poison, with the error as its reason) and leniently (the poison event's DLQ entry), then decide
/// with what decoded. Forged values — attempts beyond the policy, a due time in year 9999, huge
/// numbers — must give a poison reason or a bounded decision.
pub fn check_metadata(headers: &Headers) {
    let strict = metadata::decode(headers);
    let (lenient, foreign, errors) = metadata::decode_lenient(headers);
    match &strict {
        Ok((meta, rest)) => {
            assert!(
                errors.is_empty(),
                "lenient errors {errors:?} where strict decoding passed"
            );
            assert_eq!(meta, &lenient);
            assert_eq!(rest, &foreign);
            check_decisions(meta);
        }
        Err(e) => {
            assert_eq!(
                errors.first(),
                Some(e),
                "strict and lenient disagree on the first problem"
            );
            assert!(
                !e.header.is_empty() && !e.problem.is_empty(),
                "a poison reason names nothing"
            );
            // A reason is stored on the DLQ entry: it must stay small whatever the header held.
            assert!(
                e.to_string().len() <= 1024,
                "poison reason of {} bytes",
                e.to_string().len()
            );
            check_decisions(&lenient);
        }
    }
    for e in &errors {
        assert!(
            e.to_string().len() <= 1024,
            "poison reason of {} bytes",
            e.to_string().len()
        );
    }
}

/// Every decision the runtime may take for an event carrying `meta`: bounded, or dead with a reason.
pub fn check_decisions(meta: &RetryMetadata) {
    let mut rng = StdRng::seed_from_u64(11);
    let mut budgeted = Policies::default();
    budgeted.deferred = budgeted
        .deferred
        .with_max_elapsed(Duration::from_secs(3600));
    for policies in [Policies::default(), budgeted] {
        let deferred = &policies.deferred;
        for kind in [
            FailureKind::Deferred,
            FailureKind::Transient,
            FailureKind::Blocking,
            FailureKind::NonRetryable,
        ] {
            let attempt = Attempt {
                meta,
                in_place_retries: 0,
                holds: 0,
                now: NOW,
                chosen_delay: None,
            };
            match decide(Err(kind), &attempt, &policies, &mut rng) {
                Outcome::RetryAfter(delay) => {
                    let limit = deferred.max_retries().unwrap_or(u32::MAX);
                    assert!(
                        meta.retries < limit,
                        "retry {} beyond the policy's {limit} was not dead-lettered",
                        meta.retries
                    );
                    let bound = deferred.max_delay(meta.retries).unwrap_or(Duration::ZERO);
                    assert!(delay <= bound, "deferred delay {delay:?} > {bound:?}");
                    // The due time the runtime records saturates, never wraps to the past.
                    assert!(NOW.plus(delay) >= NOW);
                }
                Outcome::RetryInPlace(d) | Outcome::Hold(d) => {
                    assert!(d <= Duration::from_secs(60), "in-place pause {d:?}");
                }
                Outcome::Dead(reason) => {
                    assert!(!reason.as_str().is_empty());
                    if reason == DeadReason::Exhausted {
                        assert!(deferred.max_retries().is_some_and(|n| meta.retries >= n));
                    }
                }
                Outcome::Ack => panic!("a failure was acknowledged"),
            }
        }
    }
    // The times a delivery's metadata feeds the runtime: lateness, the budget's start, conversions.
    for t in [
        meta.due_at,
        meta.first_seen,
        meta.replayed_at,
        meta.dead.as_ref().map(|d| d.at),
    ]
    .into_iter()
    .flatten()
    {
        let _ = NOW.since(t);
        let _ = t.since(NOW);
        let _ = t.to_system_time();
        let _ = t.plus(Duration::MAX).minus(Duration::MAX);
    }
    if let Some(d) = meta.last_delay {
        let _ = NOW.plus(d);
    }
    let _ = meta.attempts.saturating_add(1);
}

/// `options_url`, the core part: a broker URL and its query split into options, redacted for logs,
/// read back through an option reader. Returns the options for the adapters' parsers.
pub fn options_url(data: &[u8]) -> Option<Options> {
    let url = std::str::from_utf8(data).ok()?;
    let redacted = redact_url(url);
    assert!(!redacted.is_empty() || url.is_empty());
    let (base, options) = Options::split_url(url).ok()?;
    assert!(url.starts_with(&base));
    let _ = format!("{options:?}");
    let mut reader = options.reader("fuzz");
    let _ = reader.renamed("old", "new");
    let _ = reader.string("name");
    let _ = reader.duration("timeout");
    let _ = reader.bool("tls");
    let _ = reader.number::<u32>("count");
    let _ = reader.number::<f64>("factor");
    let _ = reader.choice("mode", &["a", "b"]);
    let _ = reader.secret("password");
    let _ = reader.prefixed("rdkafka.");
    let _ = reader.finish();
    Some(options)
}

/// `config_toml`: the retry config file. Never a panic; what parses gives policies and classifiers for
/// any topic, and its policies keep the DSL's invariants.
pub fn config_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = RetryConfig::from_toml(text) else {
        return;
    };
    let mut topics: Vec<&str> = config.topics.keys().map(String::as_str).collect();
    topics.push("no-such-topic");
    for topic in topics {
        let policies = config.policies(topic);
        check_policy(&policies.deferred);
        check_policy(&policies.in_place);
        check_policy(&policies.blocking);
        let _ = config.classifier(topic, event_retry_core::classify::Classifier::default());
    }
    if let Some(broker) = &config.broker {
        let _ = format!("{broker:?}");
        let _ = broker.to_options();
    }
}
