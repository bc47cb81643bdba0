//! The test binary's driver: finds the adapters to test, registers one named trial per scenario and
//! adapter, runs them concurrently, and writes the report.
//!
//! Brokers are found through `RETRY_TEST_KAFKA`, `RETRY_TEST_AMQP`, `RETRY_TEST_SQS` and
//! `RETRY_TEST_PULSAR`; the in-memory adapter always runs. An adapter that is not configured is skipped
//! loudly — every one of its scenarios is listed as skipped, with the reason, and counted — unless
//! `RETRY_TEST_REQUIRE` names it, in which case its absence is a failing test.

use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};

use crate::fixture::{Fixture, MemoryFixture};
use crate::probe::BoxFuture;
use crate::report::{Cell, Report};
use crate::scenarios::{self, Verdict};

/// Builds a fixture for a broker URL.
pub type MakeFixture = fn(String) -> BoxFuture<Result<Arc<dyn Fixture>, String>>;

/// A broker the suite knows how to find.
#[derive(Clone, Copy)]
pub struct Broker {
    /// Its name in `RETRY_TEST_REQUIRE`, test names and the report.
    pub name: &'static str,
    /// The env var holding its URL.
    pub env: &'static str,
    /// The fixture constructor, when the adapter is built into this workspace.
    pub make: Option<MakeFixture>,
}

/// The four brokers, with the adapters compiled in so far.
pub fn brokers() -> Vec<Broker> {
    vec![
        Broker {
            name: "kafka",
            env: "RETRY_TEST_KAFKA",
            make: Some(crate::kafka::KafkaFixture::make),
        },
        Broker {
            name: "rabbitmq",
            env: "RETRY_TEST_AMQP",
            make: Some(crate::rabbitmq::RabbitFixture::make),
        },
        Broker {
            name: "sqs",
            env: "RETRY_TEST_SQS",
            make: Some(crate::sqs::SqsFixture::make),
        },
        Broker {
            name: "pulsar",
            env: "RETRY_TEST_PULSAR",
            make: Some(crate::pulsar::PulsarFixture::make),
        },
    ]
}

const SCENARIO_TIMEOUT: Duration = Duration::from_secs(180);

fn required() -> Result<Vec<String>, String> {
    let names = test_support::broker::required_brokers();
    let known: Vec<&str> = brokers().iter().map(|b| b.name).chain(["memory"]).collect();
    match names.iter().find(|n| !known.contains(&n.as_str())) {
        Some(bad) => Err(format!(
            "RETRY_TEST_REQUIRE names unknown broker {bad:?}; known: {}",
            known.join(", ")
        )),
        None => Ok(names),
    }
}

/// Runs the suite and exits the process with its status.
pub fn main() {
    let mut args = Arguments::from_args();
    if args.test_threads.is_none() {
        // Scenarios mostly wait on timers and brokers; run many at once so the suite stays short.
        args.test_threads = Some(16);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Arc::new(rt),
        Err(e) => {
            eprintln!("cannot start the tokio runtime: {e}");
            std::process::exit(2);
        }
    };
    let report = Arc::new(Report::default());
    let mut trials = Vec::new();
    let mut adapters: Vec<&'static str> = vec!["memory"];
    let mut skipped = Vec::new();

    let required = required();
    if let Err(e) = &required {
        let e = e.clone();
        trials.push(Trial::test("config::retry_test_require", move || {
            Err(Failed::from(e))
        }));
    }
    let required = required.unwrap_or_default();

    let memory: Arc<dyn Fixture> = Arc::new(MemoryFixture::new());
    trials.extend(trials_for(memory, &runtime, &report));

    for broker in brokers() {
        adapters.push(broker.name);
        let url = std::env::var(broker.env).ok().filter(|u| !u.is_empty());
        #[cfg(feature = "testcontainers")]
        let url = match url {
            Some(url) => Some(url),
            None => match runtime.block_on(crate::containers::start(broker.name)) {
                Ok(url) => {
                    eprintln!("{}: started a container at {url}", broker.name);
                    Some(url)
                }
                Err(e) => {
                    eprintln!(
                        "{}: {} is not set and no container could be started: {e}",
                        broker.name, broker.env
                    );
                    None
                }
            },
        };
        // (why the broker's scenarios cannot run, whether that is because the broker is missing)
        let unavailable = match (&url, broker.make) {
            (None, _) => Some((format!("{} is not set", broker.env), true)),
            // The broker is there (its smoke test proves it) but no adapter exists yet: a build gap, not a
            // missing broker, so RETRY_TEST_REQUIRE does not turn it into a failure.
            (Some(_), None) => Some((
                format!(
                    "{} is set, but the {} adapter is not built yet",
                    broker.env, broker.name
                ),
                false,
            )),
            (Some(url), Some(make)) => match runtime.block_on(make(url.clone())) {
                Ok(fixture) => {
                    trials.extend(trials_for(fixture, &runtime, &report));
                    None
                }
                Err(e) => Some((format!("cannot connect to {url}: {e}"), true)),
            },
        };
        if let Some((reason, broker_missing)) = unavailable {
            if broker_missing && required.iter().any(|r| r == broker.name) {
                let message = format!(
                    "{} is required by RETRY_TEST_REQUIRE but unavailable: {reason}",
                    broker.name
                );
                trials.push(Trial::test(
                    format!("{}::available", broker.name),
                    move || Err(Failed::from(message)),
                ));
            }
            for s in scenarios::all() {
                report.record(s.number, s.name, broker.name, Cell::Skip(reason.clone()));
                skipped.push(format!(
                    "{}::{:02}_{}: {reason}",
                    broker.name, s.number, s.name
                ));
                trials.push(
                    Trial::test(
                        format!("{}::{:02}_{}", broker.name, s.number, s.name),
                        || Ok(()),
                    )
                    .with_ignored_flag(true),
                );
            }
        }
    }
    for line in &skipped {
        eprintln!("SKIP {line}");
    }

    let conclusion = libtest_mimic::run(&args, trials);
    let markdown = report.to_markdown(&adapters);
    let path = Report::path();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(&path, &markdown) {
        Ok(()) => println!("\n{markdown}\nreport written to {}", path.display()),
        Err(e) => eprintln!("could not write the report to {}: {e}", path.display()),
    }
    println!(
        "conformance: {} passed, {} failed, {} skipped",
        conclusion.num_passed, conclusion.num_failed, conclusion.num_ignored
    );
    conclusion.exit();
}

fn trials_for(
    fixture: Arc<dyn Fixture>,
    runtime: &Arc<tokio::runtime::Runtime>,
    report: &Arc<Report>,
) -> Vec<Trial> {
    let caps = fixture.capabilities();
    let fixture_caps = fixture.fixture_capabilities();
    scenarios::all()
        .into_iter()
        .map(|s| {
            let name = format!("{}::{:02}_{}", fixture.name(), s.number, s.name);
            if let Some(reason) = (s.needs)(&caps, &fixture_caps) {
                eprintln!("SKIP {name}: {reason}");
                report.record(
                    s.number,
                    s.name,
                    fixture.name(),
                    Cell::Skip(reason.to_string()),
                );
                return Trial::test(name, || Ok(())).with_ignored_flag(true);
            }
            let (fixture, runtime, report) = (fixture.clone(), runtime.clone(), report.clone());
            Trial::test(name, move || {
                let adapter = fixture.name();
                let outcome = runtime.block_on(async {
                    tokio::time::timeout(SCENARIO_TIMEOUT, (s.run)(fixture)).await
                });
                let cell = match outcome {
                    Ok(Ok(Verdict::Pass(note))) => Cell::Pass(note),
                    Ok(Ok(Verdict::Skip(reason))) => Cell::Skip(reason),
                    Ok(Err(failure)) => Cell::Fail(failure),
                    Err(_) => Cell::Fail(format!("did not finish within {SCENARIO_TIMEOUT:?}")),
                };
                report.record(s.number, s.name, adapter, cell.clone());
                match cell {
                    Cell::Pass(Some(note)) => {
                        println!("  {adapter}::{:02}_{}: {note}", s.number, s.name);
                        Ok(())
                    }
                    Cell::Pass(None) => Ok(()),
                    Cell::Skip(reason) => {
                        eprintln!("SKIP {adapter}::{:02}_{}: {reason}", s.number, s.name);
                        Ok(())
                    }
                    Cell::Fail(failure) => Err(Failed::from(failure)),
                }
            })
        })
        .collect()
}
