//! Finding the broker a test runs against, and the trials of a `harness = false` test binary.

use libtest_mimic::{Failed, Trial};

/// A broker test: given the broker's URL, `Ok` or what went wrong.
pub type Test = fn(String) -> Result<(), String>;

pub use event_retry_testkit::env::{postgres_database, required_brokers, url};

/// The trials of `tests` against the broker `broker` found through `env`. Without the broker, each is
/// listed as ignored with the reason printed (`SKIP …`), or fails when `RETRY_TEST_REQUIRE` names it.
pub fn trials(
    broker: &'static str,
    env: &'static str,
    tests: &[(&'static str, Test)],
) -> Vec<Trial> {
    let url = url(env);
    // A test of a broker in another setting (`sqs-sns`) is required with its broker.
    let required = required_brokers().iter().any(|b| {
        b == broker
            || broker
                .strip_prefix(b.as_str())
                .is_some_and(|rest| rest.starts_with('-'))
    });
    tests
        .iter()
        .map(|&(name, test)| match url.clone() {
            Some(url) => Trial::test(name, move || test(url).map_err(Failed::from)),
            None if required => Trial::test(name, move || {
                Err(Failed::from(format!(
                    "RETRY_TEST_REQUIRE names {broker} but {env} is not set"
                )))
            }),
            None => {
                eprintln!("SKIP {name}: {env} is not set");
                Trial::test(name, || Ok(())).with_ignored_flag(true)
            }
        })
        .collect()
}

/// A multi-threaded runtime for one test.
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

/// The `(name, function)` pairs of a broker test binary, each test named once:
/// `named_tests![a, b]` is `[("a", a), ("b", b)]` as [`Test`]s, for [`trials`].
#[macro_export]
macro_rules! named_tests {
    ($($test:ident),+ $(,)?) => {
        [$((stringify!($test), $test as $crate::broker::Test)),+]
    };
}
