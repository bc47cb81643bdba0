//! `retryctl` never prints a secret: run as an operator runs it (the built binary, its stdout and
//! stderr captured), with the password or token written inline in the `--url` — the worst case — against
//! the secured listeners `scripts/brokers start --tls` starts (`RETRY_TEST_KAFKA_TLS`,
//! `RETRY_TEST_AMQP_TLS`, `RETRY_TEST_PULSAR_TLS`) and SQS with `key:secret@` in the URL.
//!
//! Per broker: `dlq list` with the right secret succeeds and prints no secret; with a wrong one
//! (for SQS: an endpoint that is not there) it fails with exit code 1, says why, and prints neither
//! secret. Each fails when `RETRY_TEST_REQUIRE` names its broker and its variable is unset.

use std::process::Command;

use libtest_mimic::Arguments;
use test_support::broker::Test;
use test_support::security::{assert_hidden, tls_secret, with_query};

fn main() {
    let args = Arguments::from_args();
    let cases: [(&str, &str, &str, Test); 4] = [
        (
            "kafka-tls",
            "RETRY_TEST_KAFKA_TLS",
            "kafka::secret_never_printed",
            kafka,
        ),
        (
            "rabbitmq-tls",
            "RETRY_TEST_AMQP_TLS",
            "rabbitmq::secret_never_printed",
            rabbitmq,
        ),
        (
            "pulsar-tls",
            "RETRY_TEST_PULSAR_TLS",
            "pulsar::token_never_printed",
            pulsar,
        ),
        ("sqs", "RETRY_TEST_SQS", "sqs::secret_never_printed", sqs),
    ];
    let mut trials = Vec::new();
    for (broker, env, name, test) in cases {
        trials.extend(test_support::broker::trials(broker, env, &[(name, test)]));
    }
    libtest_mimic::run(&args, trials).exit();
}

/// `retryctl dlq --url URL --topic <fresh> list`: exit code and everything it printed.
fn dlq_list(url: &str) -> Result<(Option<i32>, String), String> {
    let topic = format!("secrets-{}", uuid::Uuid::new_v4().simple());
    let output = Command::new(env!("CARGO_BIN_EXE_retryctl"))
        .args(["dlq", "--url", url, "--topic", &topic, "list"])
        .output()
        .map_err(|e| format!("run retryctl: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.code(), text))
}

/// The right secret: success, no secret printed. The wrong one: exit 1, `said` in the output, neither
/// secret printed.
fn check(
    right: &str,
    secret: &str,
    wrong: &str,
    wrong_secret: &str,
    said: &str,
) -> Result<(), String> {
    let (code, ok_output) = dlq_list(right)?;
    if code != Some(0) {
        return Err(format!("with the right secret: exit {code:?}: {ok_output}"));
    }
    let (code, failed_output) = dlq_list(wrong)?;
    if code != Some(1) {
        return Err(format!(
            "with the wrong secret: exit {code:?} (want 1): {failed_output}"
        ));
    }
    if !failed_output.to_lowercase().contains(&said.to_lowercase()) {
        return Err(format!(
            "the failure does not say {said:?}: {failed_output}"
        ));
    }
    let outputs = [
        ("the successful run", ok_output),
        ("the failed run", failed_output.clone()),
    ];
    assert_hidden(secret, &outputs)?;
    assert_hidden(wrong_secret, &outputs)?;
    println!("  {}", failed_output.trim());
    Ok(())
}

fn kafka(url: String) -> Result<(), String> {
    let secret = tls_secret("kafka.password")?;
    let bare = with_query(&url, "sasl.password_file", None);
    let right = with_query(&bare, "sasl.password", Some(&secret));
    let wrong = with_query(&bare, "sasl.password", Some("wrong-kafka-secret-51"));
    check(&right, &secret, &wrong, "wrong-kafka-secret-51", "refused")
}

fn rabbitmq(url: String) -> Result<(), String> {
    let secret = tls_secret("amqp.password")?;
    let bare = with_query(&url, "password_file", None);
    let right = bare.replacen("event-retry@", &format!("event-retry:{secret}@"), 1);
    let wrong = bare.replacen("event-retry@", "event-retry:wrong-amqp-secret-52@", 1);
    check(
        &right,
        &secret,
        &wrong,
        "wrong-amqp-secret-52",
        "refused the login",
    )
}

fn pulsar(url: String) -> Result<(), String> {
    let token = tls_secret("pulsar.token")?;
    let wrong_token = tls_secret("pulsar-wrong.token")?;
    let bare = with_query(&url, "token_file", None);
    let right = with_query(&bare, "token", Some(&token));
    let wrong = with_query(&bare, "token", Some(&wrong_token));
    check(
        &right,
        &token,
        &wrong,
        &wrong_token,
        "refused the authentication",
    )
}

fn sqs(url: String) -> Result<(), String> {
    let address = url
        .split_once("://")
        .map_or(url.as_str(), |(_, r)| r)
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
        .to_string();
    let secret = "sqs-url-secret-7d1e0a55";
    let right = format!("sqs://AKIARETRYCTLKEY0001:{secret}@{address}");
    // Nothing listens on port 1: the connect fails, and its error must not carry the URL's secret.
    let wrong = "sqs://AKIARETRYCTLKEY0001:wrong-sqs-secret-53@127.0.0.1:1".to_string();
    check(&right, secret, &wrong, "wrong-sqs-secret-53", "SQS")
}
