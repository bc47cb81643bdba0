//! What the secured-listener tests of every adapter share: the material `scripts/brokers start --tls`
//! wrote, editing a URL's query for the negative cases, a bound on "fails fast", and the check that a
//! secret shows up in no captured output — tracing events included.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use event_retry_core::adapter::Scheme;
use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::error::{Error, Kind};
use event_retry_core::event::Event;
use event_retry_core::options::Options;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{Context, handler_fn};

/// The folder of the throwaway CA, certificates, passwords and tokens (`RETRY_TEST_TLS_DIR`).
pub fn tls_dir() -> Result<PathBuf, String> {
    crate::broker::url("RETRY_TEST_TLS_DIR")
        .map(PathBuf::from)
        .ok_or_else(|| {
            "RETRY_TEST_TLS_DIR is not set (scripts/brokers start --tls writes it)".into()
        })
}

/// A file of [`tls_dir`], as a string for a URL query.
pub fn tls_file(name: &str) -> Result<String, String> {
    Ok(tls_dir()?.join(name).display().to_string())
}

/// The content of a secret file of [`tls_dir`] (one trailing line break removed).
pub fn tls_secret(name: &str) -> Result<String, String> {
    let path = tls_dir()?.join(name);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text.trim_end_matches(['\r', '\n']).to_string())
}

/// `url` with query parameter `key` set to `value` (replaced when present, else appended), or removed
/// when `value` is `None`. Values are written as they are: paths and the mechanism names need no
/// escaping.
pub fn with_query(url: &str, key: &str, value: Option<&str>) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut pairs: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty() && p.split('=').next() != Some(key))
        .map(str::to_string)
        .collect();
    if let Some(v) = value {
        pairs.push(format!("{key}={v}"));
    }
    if pairs.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", pairs.join("&"))
    }
}

/// The `host:port` of `url` (without user and password).
fn address(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split(['/', '?']).next().unwrap_or(rest);
    rest.rsplit_once('@').map_or(rest, |(_, h)| h)
}

/// `url` with its host and port replaced by those of `other` (the same broker's other listener).
pub fn with_address_of(url: &str, other: &str) -> String {
    url.replacen(address(url), address(other), 1)
}

/// The address the test certificate does not name (it names `localhost` and 127.0.0.1), where
/// [`expect_name_refused`] forwards the broker's secured listener.
pub const UNNAMED_ADDRESS: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 2);

/// Forwards [`UNNAMED_ADDRESS`] to the secured listener of `url` (an address of 127.0.0.1) and expects
/// `connect` to that address to be refused as [`fails_fast`] describes: a client that checks the name
/// in the broker's certificate refuses it, one that does not connects.
pub fn expect_name_refused<T, F, Fut>(
    broker: &str,
    words: &[&str],
    url: &str,
    connect: F,
) -> Result<(), String>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let listener: std::net::SocketAddr = address(url)
        .parse()
        .map_err(|e| format!("the address of {url:?} is not ip:port: {e}"))?;
    crate::broker::runtime()?.block_on(async {
        let forwarded = crate::forward::forward(UNNAMED_ADDRESS.into(), listener)
            .await
            .map_err(|e| format!("forward {UNNAMED_ADDRESS} to {listener}: {e}"))?;
        let url = url.replacen(address(url), &forwarded.to_string(), 1);
        let said = fails_fast(broker, words, connect(url)).await?;
        println!("  {said}");
        Ok(())
    })
}

/// How long a refused connection may take to fail: well under a broker client's reconnect storm.
pub const FAIL_FAST: Duration = Duration::from_secs(20);

/// Awaits `attempt`, which must fail with [`Kind::Security`] within [`FAIL_FAST`] and a message
/// containing every word of `words` (case ignored) and `broker`'s name; returns the error's text.
pub async fn fails_fast<T>(
    broker: &str,
    words: &[&str],
    attempt: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<String, String> {
    let started = Instant::now();
    let outcome = tokio::time::timeout(FAIL_FAST * 2, attempt).await;
    let took = started.elapsed();
    let error = match outcome {
        Err(_) => return Err(format!("still trying after {:?}", FAIL_FAST * 2)),
        Ok(Ok(_)) => return Err("connected, but must have been refused".into()),
        Ok(Err(e)) => e,
    };
    let text = format!("{error}");
    if error.kind() != Kind::Security {
        return Err(format!("kind {} (want security): {text}", error.kind()));
    }
    if took > FAIL_FAST {
        return Err(format!("took {took:?} (more than {FAIL_FAST:?}): {text}"));
    }
    let lower = text.to_lowercase();
    for word in words.iter().chain([&broker]) {
        if !lower.contains(&word.to_lowercase()) {
            return Err(format!("the error does not say {word:?}: {text}"));
        }
    }
    Ok(format!("{text} (after {} ms)", took.as_millis()))
}

/// Runs `attempt` (a connect) on a runtime of its own and expects the refusal [`fails_fast`]
/// describes; prints what the error said.
pub fn expect_refused<T>(
    broker: &str,
    words: &[&str],
    attempt: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<(), String> {
    let said = crate::broker::runtime()?.block_on(fails_fast(broker, words, attempt))?;
    println!("  {said}");
    Ok(())
}

/// What a careless service could print about its broker connections — `Debug` of the options, the
/// adapter's settings and the broker, the redacted URL, the errors of refused connects — gathered to
/// be searched for a secret together with every tracing event.
#[derive(Default)]
pub struct Printed(Vec<(String, String)>);

impl Printed {
    /// Adds one output, named for the failure message.
    pub fn add(&mut self, what: impl Into<String>, text: impl Into<String>) {
        self.0.push((what.into(), text.into()));
    }

    /// Connects with `url` (the secret given as `how` says) and carries an event through the broker,
    /// adding `Debug` of the options, of `settings` (the adapter's configuration read from them), of
    /// the broker, and the redacted URL.
    pub async fn connect_and_use(
        &mut self,
        scheme: &Scheme,
        how: &str,
        url: &str,
        settings: impl Fn(&Options) -> Result<String, Error>,
    ) -> Result<(), String> {
        let (_, options) = Options::split_url(url).map_err(|e| e.to_string())?;
        self.add(
            format!("Debug of the options ({how})"),
            format!("{options:?}"),
        );
        let config = settings(&options).map_err(|e| e.to_string())?;
        self.add(format!("Debug of the settings ({how})"), config);
        self.add(
            format!("the URL redacted ({how})"),
            event_retry_core::options::redact_url(url),
        );
        let broker = connect(scheme, url)
            .await
            .map_err(|e| format!("{how}: {e}"))?;
        self.add(
            format!("Debug of the broker ({how})"),
            format!("{broker:?}"),
        );
        round_trip(&broker, "redaction").await
    }

    /// Connects with `url`, which must be refused (`why` names what is wrong with it), adding the
    /// error's `Display` and `Debug`.
    pub async fn refused(&mut self, scheme: &Scheme, why: &str, url: &str) -> Result<(), String> {
        let e = connect(scheme, url)
            .await
            .err()
            .ok_or_else(|| format!("connected with {why}"))?;
        self.add(format!("Display of a connect with {why}"), format!("{e}"));
        self.add(format!("Debug of a connect with {why}"), format!("{e:?}"));
        Ok(())
    }

    /// Adds the tracing events captured so far (there must be some, or the search proves nothing) and
    /// fails if any of `secrets` appears in any output; prints how much was searched.
    pub fn search(mut self, captured: &Captured, secrets: &[&str]) -> Result<(), String> {
        let tracing = captured.text();
        if tracing.is_empty() {
            return Err("no tracing event was captured: the search would prove nothing".into());
        }
        let bytes = tracing.len();
        self.add("the tracing events", tracing);
        let named: Vec<(&str, String)> = self
            .0
            .iter()
            .map(|(w, t)| (w.as_str(), t.clone()))
            .collect();
        for secret in secrets {
            assert_hidden(secret, &named)?;
        }
        println!(
            "  searched {} outputs ({bytes} bytes of tracing) for {}: absent",
            named.len(),
            if secrets.len() == 1 {
                "the secret"
            } else {
                "the secrets"
            }
        );
        Ok(())
    }
}

/// Connects as `event_retry::connect` does: the URL's query is the adapter's options.
pub async fn connect(scheme: &Scheme, url: &str) -> Result<Broker, Error> {
    let (base, options) = Options::split_url(url)?;
    Ok(Broker::from((scheme.connect)(base, options).await?))
}

/// One event through `broker` on a fresh topic named after `prefix`: a consumer starts, the producer
/// publishes, the handler sees it within 60 s (retried once through the broker on the way, so its delay
/// route is crossed too), then the consumer stops.
pub async fn round_trip(broker: &Broker, prefix: &str) -> Result<(), String> {
    let topic = format!("{prefix}-{}", std::process::id() as u64 * 1000 + unique());
    let handle = broker
        .consumer(&topic)
        .policy(RetryPolicy::parse("1s x3").map_err(|e| e.to_string())?)
        .start(handler_fn(|_event: Event, ctx: Context| async move {
            if ctx.attempt == 1 {
                Err(HandlerError::deferred("once, through the broker"))
            } else {
                Ok(())
            }
        }))
        .await
        .map_err(|e| format!("start a consumer of {topic}: {e}"))?;
    broker
        .producer()
        .publish(&topic, Event::new(&b"over a secured listener"[..]))
        .await
        .map_err(|e| format!("publish to {topic}: {e}"))?;
    let done = tokio::time::timeout(
        Duration::from_secs(60),
        handle.wait_until(|s| s.succeeded == 1),
    )
    .await;
    let stats = handle.stats();
    handle.shutdown().await.map_err(|e| e.to_string())?;
    match done {
        Ok(_) if stats.retries_scheduled >= 1 => Ok(()),
        Ok(_) => Err(format!(
            "succeeded without the retry it asked for: {stats:?}"
        )),
        Err(_) => Err(format!("the event did not come through in 60 s: {stats:?}")),
    }
}

/// A number that differs between calls in one process.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Everything the tracing subscriber of this test binary printed, from [`capture_tracing`] on.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// The captured text so far.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs (once per process) a subscriber that records every tracing event at every level, fields
/// and spans included, and returns the record.
pub fn capture_tracing() -> Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured = Captured::default();
            let writer = captured.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish();
            // Another subscriber set first would make the check vacuous: say so.
            if tracing::subscriber::set_global_default(subscriber).is_err() {
                eprintln!("capture_tracing: a global subscriber was already set");
            }
            captured
        })
        .clone()
}

/// Fails when `secret` appears in any of `outputs` (named, for the message), or when it is too short
/// to be a meaningful search.
pub fn assert_hidden(secret: &str, outputs: &[(&str, String)]) -> Result<(), String> {
    if secret.len() < 8 {
        return Err(format!(
            "the secret to search for is too short ({} chars)",
            secret.len()
        ));
    }
    for (what, text) in outputs {
        if text.contains(secret) {
            return Err(format!("the secret appears in {what}"));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn query_edits() {
        let url = "kafka://h:1?a=1&sasl.mechanism=PLAIN&b=2";
        assert_eq!(
            with_query(url, "sasl.mechanism", Some("SCRAM-SHA-256")),
            "kafka://h:1?a=1&b=2&sasl.mechanism=SCRAM-SHA-256"
        );
        assert_eq!(with_query("kafka://h:1?a=1", "a", None), "kafka://h:1");
        assert_eq!(
            with_address_of(
                "amqps://u@127.0.0.1:5671/%2f?x=1",
                "amqp://guest:guest@127.0.0.1:5672/%2f"
            ),
            "amqps://u@127.0.0.1:5672/%2f?x=1"
        );
    }

    #[test]
    fn printed_outputs_and_tracing_are_searched_and_empty_tracing_proves_nothing() {
        let mut tracing = Captured::default();
        assert!(Printed::default().search(&tracing, &["hunter22"]).is_err());
        tracing.write_all(b"INFO connected").unwrap();
        let mut printed = Printed::default();
        printed.add("Debug of the config", "password: hunter22");
        let e = printed.search(&tracing, &["hunter22"]).unwrap_err();
        assert_eq!(e, "the secret appears in Debug of the config");
        tracing.write_all(b" token=hunter23").unwrap();
        let e = Printed::default()
            .search(&tracing, &["hunter23"])
            .unwrap_err();
        assert_eq!(e, "the secret appears in the tracing events");
        assert!(Printed::default().search(&tracing, &["hunter24"]).is_ok());
    }

    #[test]
    fn a_secret_in_any_output_is_found() {
        let outputs = [
            ("a", "x".to_string()),
            ("b", "has hunter22 in it".to_string()),
        ];
        assert_eq!(
            assert_hidden("hunter22", &outputs).unwrap_err(),
            "the secret appears in b"
        );
        assert!(assert_hidden("hunter23", &outputs).is_ok());
        assert!(assert_hidden("short", &outputs).is_err());
    }
}
