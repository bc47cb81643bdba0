//! Where the SQS adapter's credentials and region come from, shown by what reaches the endpoint: a
//! recording TCP relay in front of ElasticMQ (`RETRY_TEST_SQS`) reads the `Credential=<key id>/<date>/
//! <region>/sqs/aws4_request` scope of every request the AWS SDK signed. ElasticMQ has no TLS and
//! accepts any signature, so the relay, not the emulator, is the witness. Each case runs the adapter in
//! a child process (this binary again) with its own environment:
//!
//! * a shared profile (`AWS_PROFILE`, `AWS_CONFIG_FILE`, `AWS_SHARED_CREDENTIALS_FILE`) gives the key
//!   and the region, with no `AWS_*` key variables set;
//! * the environment's key wins over the profile's, as in every AWS tool;
//! * the `profile` option picks a profile over `AWS_PROFILE`;
//! * the secret access key appears in none of the child's output: `Debug` of the options, config and
//!   broker, errors, and every tracing event at every level (the AWS SDK's own included), whether it
//!   came from the profile file or `key:secret@` in the URL.
//!
//! They fail when `RETRY_TEST_REQUIRE` names `sqs` and `RETRY_TEST_SQS` is unset.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};

use event_retry_core::options::Options;
use event_retry_sqs::{SCHEME, SqsConfig};
use libtest_mimic::Arguments;
use test_support::broker::runtime;
use test_support::security::{assert_hidden, capture_tracing, connect, round_trip};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Set in the child: the URL it connects to.
const CHILD: &str = "SQS_CREDENTIALS_CHILD";
const PROFILE_KEY: &str = "AKIAPROFILEKEY000001";
const OTHER_PROFILE_KEY: &str = "AKIAOTHERPROFILE0003";
const ENV_KEY: &str = "AKIAENVIRONMENTKEY02";

fn main() {
    if let Ok(url) = std::env::var(CHILD) {
        std::process::exit(match child(&url) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("child failed: {e}");
                1
            }
        });
    }
    let args = Arguments::from_args();
    let tests = test_support::named_tests![
        a_profile_gives_the_key_and_the_region,
        the_environment_wins_over_the_profile,
        the_profile_option_picks_a_profile,
        the_secret_key_is_never_printed,
    ];
    let trials = test_support::broker::trials("sqs", "RETRY_TEST_SQS", &tests);
    libtest_mimic::run(&args, trials).exit();
}

/// The child: connect, one event with one broker retry, then print what a careless program might
/// print — the options, the config, the broker, and every tracing event.
fn child(url: &str) -> Result<(), String> {
    let captured = capture_tracing();
    runtime()?.block_on(async {
        let (_, options) = Options::split_url(url).map_err(|e| e.to_string())?;
        println!("options: {options:?}");
        println!(
            "config: {:?}",
            SqsConfig::from_options(&options).map_err(|e| e.to_string())?
        );
        let broker = connect(&SCHEME, url).await.map_err(|e| e.to_string())?;
        println!("broker: {broker:?}");
        round_trip(&broker, "credentials").await?;
        println!(
            "redacted URL: {}",
            event_retry_core::options::redact_url(url)
        );
        Ok::<(), String>(())
    })?;
    eprintln!("{}", captured.text());
    Ok(())
}

/// A relay to ElasticMQ that keeps the credential scopes of the requests passing through.
struct Relay {
    address: String,
    scopes: Arc<Mutex<Vec<String>>>,
}

async fn relay(target: String) -> Result<Relay, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let address = listener
        .local_addr()
        .map_err(|e| e.to_string())?
        .to_string();
    let scopes = Arc::new(Mutex::new(Vec::new()));
    let seen = scopes.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (target, seen) = (target.clone(), seen.clone());
            tokio::spawn(async move {
                if let Ok(server) = TcpStream::connect(&target).await {
                    pass(client, server, seen).await;
                }
            });
        }
    });
    Ok(Relay { address, scopes })
}

/// Copies both ways; from the client's bytes, notes every `Credential=…,` scope.
async fn pass(client: TcpStream, server: TcpStream, seen: Arc<Mutex<Vec<String>>>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut tail = String::new();
        while let Ok(n) = client_read.read(&mut buf).await {
            if n == 0 || server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
            tail.push_str(&String::from_utf8_lossy(&buf[..n]));
            while let Some(at) = tail.find("Credential=") {
                let rest = &tail[at + "Credential=".len()..];
                let Some(end) = rest.find([',', ' ', '\r']) else {
                    break;
                };
                if let Ok(mut s) = seen.lock() {
                    s.push(rest[..end].to_string());
                }
                tail = rest[end..].to_string();
            }
            if tail.len() > 8192 {
                tail = tail.split_off(tail.len() - 256);
            }
        }
        let _ = server_write.shutdown().await;
    };
    let downstream = async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

/// Environment variables for a child process.
type Env = Vec<(&'static str, String)>;

/// Profile files with two profiles — `event-retry-test` (eu-west-3) and `other` (ap-south-1) — in a
/// scratch folder of their own named `name`, and the environment that points the AWS chain at them
/// with `AWS_PROFILE=event-retry-test`. Returns the folder (to remove) and the environment.
fn profile_env(name: &str, secret: &str) -> Result<(PathBuf, Env), String> {
    let dir = std::env::temp_dir().join(format!("sqs-credentials-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let config = dir.join("config");
    let credentials = dir.join("credentials");
    std::fs::write(
        &config,
        "[profile event-retry-test]\nregion = eu-west-3\n\n[profile other]\nregion = ap-south-1\n",
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(
        &credentials,
        format!(
            "[event-retry-test]\naws_access_key_id = {PROFILE_KEY}\naws_secret_access_key = {secret}\n\n\
             [other]\naws_access_key_id = {OTHER_PROFILE_KEY}\naws_secret_access_key = {secret}-other\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let env = vec![
        ("AWS_CONFIG_FILE", config.display().to_string()),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            credentials.display().to_string(),
        ),
        ("AWS_PROFILE", "event-retry-test".to_string()),
    ];
    Ok((dir, env))
}

/// Runs the child against the relay in an environment of only the given AWS variables; returns its
/// output and the scopes the relay saw.
fn run_child(
    sqs_url: &str,
    url_of_relay: impl Fn(&str) -> String,
    env: &[(&str, String)],
) -> Result<(String, Vec<String>), String> {
    let target = sqs_url
        .split_once("://")
        .map_or(sqs_url, |(_, r)| r)
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
        .to_string();
    let rt = runtime()?;
    let relay = rt.block_on(relay(target))?;
    let url = url_of_relay(&relay.address);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = Command::new(exe);
    command.env(CHILD, &url);
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            command.env_remove(k);
        }
    }
    command.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let output = command.output().map_err(|e| e.to_string())?;
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        let tail: String = text
            .lines()
            .filter(|l| l.contains("child failed"))
            .collect();
        return Err(format!("the child failed: {tail}"));
    }
    let scopes = relay.scopes.lock().map(|s| s.clone()).unwrap_or_default();
    drop(rt);
    Ok((text, scopes))
}

/// Fails unless every scope the relay saw is `key`'s, in `region`, and there was at least one.
fn signed_by(scopes: &[String], key: &str, region: &str) -> Result<(), String> {
    if scopes.is_empty() {
        return Err("no signed request passed the relay".into());
    }
    let wrong: Vec<&String> = scopes
        .iter()
        .filter(|s| !(s.starts_with(&format!("{key}/")) && s.contains(&format!("/{region}/sqs/"))))
        .collect();
    if let Some(first) = wrong.first() {
        return Err(format!(
            "{} of {} requests signed otherwise than by {key} in {region}, e.g. {first}",
            wrong.len(),
            scopes.len()
        ));
    }
    println!("  {} requests signed with {key} for {region}", scopes.len());
    Ok(())
}

fn a_profile_gives_the_key_and_the_region(url: String) -> Result<(), String> {
    let (dir, env) = profile_env("profile", "profile-secret-4f1d9c2e")?;
    let (_, scopes) = run_child(&url, |a| format!("http://{a}"), &env)?;
    let _ = std::fs::remove_dir_all(&dir);
    signed_by(&scopes, PROFILE_KEY, "eu-west-3")
}

fn the_environment_wins_over_the_profile(url: String) -> Result<(), String> {
    let (dir, mut env) = profile_env("environment", "profile-secret-4f1d9c2e")?;
    env.extend([
        ("AWS_ACCESS_KEY_ID", ENV_KEY.to_string()),
        (
            "AWS_SECRET_ACCESS_KEY",
            "environment-secret-77aa".to_string(),
        ),
        ("AWS_REGION", "eu-north-1".to_string()),
    ]);
    let (_, scopes) = run_child(&url, |a| format!("http://{a}"), &env)?;
    let _ = std::fs::remove_dir_all(&dir);
    signed_by(&scopes, ENV_KEY, "eu-north-1")
}

fn the_profile_option_picks_a_profile(url: String) -> Result<(), String> {
    let (dir, env) = profile_env("option", "profile-secret-4f1d9c2e")?;
    let (_, scopes) = run_child(&url, |a| format!("http://{a}?profile=other"), &env)?;
    let _ = std::fs::remove_dir_all(&dir);
    signed_by(&scopes, OTHER_PROFILE_KEY, "ap-south-1")
}

fn the_secret_key_is_never_printed(url: String) -> Result<(), String> {
    let secret = "profile-secret-9b7e31c05d";
    let (dir, env) = profile_env("redaction", secret)?;
    let (from_profile, scopes) = run_child(&url, |a| format!("http://{a}"), &env)?;
    signed_by(&scopes, PROFILE_KEY, "eu-west-3")?;
    // The key in the URL's user info: the child's URL is sqs://key:secret@relay.
    let inline_secret = "url-secret-0c4a99d2e1";
    let (from_url, scopes) = run_child(
        &url,
        |a| format!("sqs://AKIAURLKEY0000000004:{inline_secret}@{a}"),
        &[],
    )?;
    signed_by(&scopes, "AKIAURLKEY0000000004", "us-east-1")?;
    let _ = std::fs::remove_dir_all(&dir);
    for (what, text) in [
        ("the profile child", &from_profile),
        ("the URL child", &from_url),
    ] {
        if !text.contains("TRACE") && !text.contains("DEBUG") {
            return Err(format!(
                "{what} printed no tracing event: the search would prove nothing"
            ));
        }
    }
    assert_hidden(secret, &[("the profile child's output", from_profile)])?;
    assert_hidden(inline_secret, &[("the URL child's output", from_url)])?;
    println!("  the secret access keys are absent from both children's output");
    Ok(())
}
