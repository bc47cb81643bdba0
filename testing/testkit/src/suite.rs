//! The driver an adapter's test binary calls: find the broker, register one named trial per scenario,
//! run them concurrently, and write this adapter's part of the report.
//!
//! A broker is found through its URL variable (`RETRY_TEST_KAFKA`, …). An adapter whose broker is not
//! configured is skipped loudly — every scenario is listed as skipped, with the reason, and counted —
//! unless `RETRY_TEST_REQUIRE` names it; then its absence is a failing test.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};

use crate::fixture::Fixture;
use crate::report::{Cell, Report};
use crate::scenarios::{self, Verdict};

/// A boxed future, as a connect function returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Connects a fixture to the broker at a URL.
pub type Connect = fn(String) -> BoxFuture<Result<Fixture, String>>;

/// Starts the adapter's broker (a container, say) and returns its URL, for a run where the adapter's
/// URL variable is not set.
pub type Container = fn() -> BoxFuture<Result<String, String>>;

/// An adapter to run the suite against.
#[derive(Clone, Copy, Debug)]
pub struct Adapter {
    /// Its name in `RETRY_TEST_REQUIRE`, test names and the report ("kafka").
    pub name: &'static str,
    /// The variable holding its broker URL (`RETRY_TEST_KAFKA`); `None` for a broker that is always
    /// there (the in-memory one).
    pub url_env: Option<&'static str>,
    /// Builds the fixture for the URL (an empty URL when `url_env` is `None`).
    pub connect: Connect,
    /// Starts a broker where `url_env` is not set (the feature `testcontainers`'s hooks in
    /// [`crate::containers`], or the adapter's own); `None`: the broker is skipped loudly, or fails the
    /// run where `RETRY_TEST_REQUIRE` names it.
    pub container: Option<Container>,
}

const SCENARIO_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs every scenario against `adapter` as a `harness = false` test binary, writes its part of the
/// report, and exits the process with the tests' status.
///
/// ```no_run
/// // tests/conformance.rs of an adapter, with `harness = false` in its Cargo.toml:
/// use std::time::Duration;
/// use event_retry_testkit::{Adapter, Fixture};
///
/// fn main() {
///     event_retry_testkit::run(Adapter {
///         name: "memory",
///         url_env: None,
///         connect: |_url| Box::pin(async {
///             Ok(Fixture::new("memory", event_retry_core::broker::Broker::memory(), Duration::from_millis(100)))
///         }),
///         container: None,
///     })
/// }
/// ```
pub fn run(adapter: Adapter) -> ! {
    run_scenarios(adapter, None, Flavor::MultiThread)
}

/// Runs every scenario as [`run`] does, but on a current-thread Tokio runtime, one scenario at a time
/// (unless `--test-threads` says otherwise): there the consumer polls a delivery in its own receive loop
/// before making it a task, a path a multi-threaded runtime never takes.
pub fn run_current_thread(adapter: Adapter) -> ! {
    run_scenarios(adapter, None, Flavor::CurrentThread)
}

/// The Tokio runtime the scenarios run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flavor {
    MultiThread,
    CurrentThread,
}

/// Runs only the scenarios named in `names` (the others are "not run" in the report, not
/// skips), as [`run`] does every one: a representative part of the suite over another setting of a
/// broker, such as its TLS listener.
///
/// ```no_run
/// // tests/conformance_tls.rs: success, retry, the DLQ and replay over the secured listener.
/// # use event_retry_testkit::Adapter;
/// # fn connect(_url: String) -> event_retry_testkit::BoxFuture<Result<event_retry_testkit::Fixture, String>> { todo!() }
/// fn main() {
///     event_retry_testkit::run_only(
///         Adapter { name: "kafka-tls", url_env: Some("RETRY_TEST_KAFKA_TLS"), connect, container: None },
///         &["success_acked_once", "transient_then_success", "policy_spent_to_dlq", "non_retryable_to_dlq", "dlq_replay"],
///     )
/// }
/// ```
pub fn run_only(adapter: Adapter, names: &[&str]) -> ! {
    if let Some(unknown) = names.iter().find(|n| scenarios::named(n).is_none()) {
        eprintln!("run_only: the suite has no scenario named {unknown:?}");
        std::process::exit(2);
    }
    run_scenarios(adapter, Some(names), Flavor::MultiThread)
}

/// The scenarios a run covers: all, or those named in `only`.
fn selected(only: Option<&[&str]>) -> Vec<scenarios::Scenario> {
    scenarios::all()
        .into_iter()
        .filter(|s| only.is_none_or(|n| n.contains(&s.name)))
        .collect()
}

fn run_scenarios(adapter: Adapter, only: Option<&[&str]>, flavor: Flavor) -> ! {
    // Started again as the consumer a crash scenario kills: be that, and nothing else.
    if let Ok(spec) = std::env::var(scenarios::crash::CHILD_ENV) {
        scenarios::crash::child_main(adapter, &spec);
    }
    let mut args = Arguments::from_args();
    if args.test_threads.is_none() {
        // Scenarios mostly wait on timers and brokers; run many at once so the suite stays short. A
        // current-thread runtime is driven by one caller at a time: one scenario after another.
        args.test_threads = Some(match flavor {
            Flavor::MultiThread => 16,
            Flavor::CurrentThread => 1,
        });
    }
    let mut builder = match flavor {
        Flavor::MultiThread => tokio::runtime::Builder::new_multi_thread(),
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => Arc::new(rt),
        Err(e) => {
            eprintln!("cannot start the tokio runtime: {e}");
            std::process::exit(2);
        }
    };
    let report = Arc::new(Report::new(adapter.name));
    let mut trials = Vec::new();
    // A fixture of a broker in another setting (`sqs-fifo`) is required with its broker.
    let required = crate::env::required_brokers().iter().any(|b| {
        b == adapter.name
            || adapter
                .name
                .strip_prefix(b.as_str())
                .is_some_and(|rest| rest.starts_with('-'))
    });

    let url = match adapter.url_env {
        None => Some(String::new()),
        Some(env) => crate::env::url(env).or_else(|| container_url(&adapter, &runtime)),
    };
    let unavailable = match url {
        None => Some(format!(
            "{} is not set",
            adapter.url_env.unwrap_or_default()
        )),
        Some(url) => match runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), (adapter.connect)(url.clone())).await
        }) {
            Ok(Ok(fixture)) => {
                // A broker outside this process outlives a consumer process: crash scenarios kill one.
                let fixture = match (adapter.url_env, std::env::current_exe()) {
                    (Some(env), Ok(exe)) => {
                        fixture.with_child_exe(exe, vec![(env.to_string(), url.clone())])
                    }
                    _ => fixture,
                };
                trials.extend(trials_for(Arc::new(fixture), &runtime, &report, only));
                None
            }
            Ok(Err(e)) => Some(format!(
                "cannot connect to {}: {e}",
                event_retry_core::options::redact_url(&url)
            )),
            Err(_) => Some(format!(
                "connecting to {} took longer than 60 s",
                event_retry_core::options::redact_url(&url)
            )),
        },
    };
    if let Some(reason) = unavailable {
        if required {
            let message = format!(
                "{} is required by RETRY_TEST_REQUIRE but unavailable: {reason}",
                adapter.name
            );
            trials.push(Trial::test(
                format!("{}::available", adapter.name),
                move || Err(Failed::from(message)),
            ));
        }
        for s in selected(only) {
            eprintln!("SKIP {}::{}: {reason}", adapter.name, s.test_name());
            report.record(&s, Cell::Skip(reason.clone()));
            trials.push(
                Trial::test(format!("{}::{}", adapter.name, s.test_name()), || Ok(()))
                    .with_ignored_flag(true),
            );
        }
    }

    let conclusion = libtest_mimic::run(&args, trials);
    #[cfg(feature = "testcontainers")]
    runtime.block_on(crate::containers::remove_all());
    match report.write() {
        Ok(path) => println!("\nreport written to {}", path.display()),
        Err(e) => eprintln!("could not write the report: {e}"),
    }
    println!(
        "conformance {}: {} passed, {} failed, {} skipped",
        adapter.name, conclusion.num_passed, conclusion.num_failed, conclusion.num_ignored
    );
    conclusion.exit();
}

/// A broker started by the adapter's container hook, if it has one and it succeeds.
fn container_url(adapter: &Adapter, runtime: &tokio::runtime::Runtime) -> Option<String> {
    let start = adapter.container?;
    match runtime.block_on(start()) {
        Ok(url) => {
            eprintln!("{}: started a container at {url}", adapter.name);
            Some(url)
        }
        Err(e) => {
            eprintln!(
                "{}: no URL is set and no container could be started: {e}",
                adapter.name
            );
            None
        }
    }
}

/// Held by every running scenario: shared by most, whole by one that must run alone
/// ([`scenarios::Scenario::alone`]).
static TURNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A scenario's turn to run: shared with other scenarios, or the whole suite's for one that runs alone.
enum Turn {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'static, ()>),
    Whole(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>),
}

impl Turn {
    /// Waits for the turn: until no scenario runs when `alone`, else until none runs alone. A scenario
    /// that panicked leaves the lock poisoned; the turn is taken all the same.
    fn take(alone: bool) -> Self {
        if alone {
            Self::Whole(TURNS.write().unwrap_or_else(|p| p.into_inner()))
        } else {
            Self::Shared(TURNS.read().unwrap_or_else(|p| p.into_inner()))
        }
    }
}

fn trials_for(
    fixture: Arc<Fixture>,
    runtime: &Arc<tokio::runtime::Runtime>,
    report: &Arc<Report>,
    only: Option<&[&str]>,
) -> Vec<Trial> {
    let caps = fixture.capabilities();
    let abilities = fixture.abilities();
    selected(only)
        .into_iter()
        .map(|s| {
            let name = format!("{}::{}", fixture.name(), s.test_name());
            let known_gap = fixture.known_gap(s.name);
            if let Some(reason) = known_gap.or_else(|| (s.needs)(&caps, &abilities)) {
                eprintln!("SKIP {name}: {reason}");
                report.record(&s, Cell::Skip(reason.to_string()));
                return Trial::test(name, || Ok(())).with_ignored_flag(true);
            }
            let (fixture, runtime, report) = (fixture.clone(), runtime.clone(), report.clone());
            Trial::test(name.clone(), move || {
                let _turn = Turn::take(s.alone);
                let outcome = runtime.block_on(async {
                    tokio::time::timeout(SCENARIO_TIMEOUT, (s.run)(fixture)).await
                });
                let cell = match outcome {
                    Ok(Ok(Verdict::Pass(note))) => Cell::Pass(note),
                    Ok(Ok(Verdict::Partial(unchecked))) => Cell::Partial(unchecked),
                    Ok(Ok(Verdict::Skip(reason))) => Cell::Skip(reason),
                    Ok(Err(failure)) => Cell::Fail(failure),
                    Err(_) => Cell::Fail(format!("did not finish within {SCENARIO_TIMEOUT:?}")),
                };
                report.record(&s, cell.clone());
                match cell {
                    Cell::Pass(Some(note)) => {
                        println!("  {name}: {note}");
                        Ok(())
                    }
                    Cell::Pass(None) => Ok(()),
                    Cell::Partial(unchecked) => {
                        println!("  {name}: PARTIAL: {unchecked}");
                        Ok(())
                    }
                    Cell::Skip(reason) => {
                        eprintln!("SKIP {name}: {reason}");
                        Ok(())
                    }
                    Cell::Fail(failure) => Err(Failed::from(failure)),
                }
            })
        })
        .collect()
}
