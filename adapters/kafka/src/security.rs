//! TLS and SASL: which librdkafka settings a URL or config file may give without the `rdkafka.`
//! prefix, which of them are secrets, and the connect check that turns a refused handshake into one
//! clear error instead of librdkafka's endless reconnecting.
//!
//! librdkafka is built with OpenSSL, so `security.protocol` `SSL` and `SASL_SSL`, SASL `PLAIN`,
//! `SCRAM-SHA-256`, `SCRAM-SHA-512` and `OAUTHBEARER` work in every build; hostname verification is
//! librdkafka's default (`ssl.endpoint.identification.algorithm=https`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use event_retry_core::error::{Error, Kind};
use event_retry_core::options::OptionReader;
use event_retry_core::secret::Secret;
use rdkafka::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};

/// librdkafka's security settings a URL query or the config file may give by their own names
/// (`kafka://h:9093?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-512`).
pub const SECURITY_KEYS: [&str; 20] = [
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.certificate.pem",
    "ssl.key.location",
    "ssl.keystore.location",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
    "ssl.cipher.suites",
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.token.endpoint.url",
    "enable.sasl.oauthbearer.unsecure.jwt",
];

/// The secret ones: each may also be given as `<key>_env` or `<key>_file`, and is never shown.
pub const SECRET_KEYS: [&str; 5] = [
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "ssl.key.pem",
    "sasl.oauthbearer.client.secret",
];

/// librdkafka settings by name: the plain ones and the secret ones.
pub(crate) type Settings = (Vec<(String, String)>, Vec<(String, Secret)>);

/// Reads the security settings: the plain ones, then the secrets.
pub(crate) fn read(read: &mut OptionReader<'_>) -> Result<Settings, Error> {
    let mut plain = Vec::new();
    for key in SECURITY_KEYS {
        if let Some(v) = read.string(key) {
            plain.push((key.to_string(), v));
        }
    }
    let mut secrets = Vec::new();
    for key in SECRET_KEYS {
        if let Some(v) = read.secret(key)? {
            secrets.push((key.to_string(), v));
        }
    }
    Ok((plain, secrets))
}

/// How long one metadata request of the connect check waits before the check looks at what the
/// client reported.
const PROBE_SLICE: Duration = Duration::from_millis(500);
/// How long the connect check serves the probe's queued events after each metadata request.
const DRAIN: Duration = Duration::from_millis(50);

/// A client context that keeps the first security failure librdkafka reports, and its latest report.
#[derive(Default)]
struct Watch {
    /// Whether the client speaks plaintext (`security.protocol` PLAINTEXT or SASL_PLAINTEXT).
    plaintext: bool,
    failure: Mutex<Option<String>>,
    last: Mutex<Option<String>>,
}

impl Watch {
    /// librdkafka's report of a refused connection, with the likely cause where librdkafka's words vary:
    /// a TLS client whose handshake the broker hung up on (not over a certificate) met a plaintext
    /// listener, which librdkafka reports as "SSL handshake failed … PLAINTEXT broker listener?" or as
    /// "SSL connection closed by peer (… in state SSL_HANDSHAKE)", whichever it sees first.
    fn explained(&self, reason: &str) -> String {
        if !self.plaintext && is_failed_handshake(reason) && !reason.contains("certificate") {
            format!("{reason} (the TLS handshake failed: a plaintext listener?)")
        } else {
            reason.to_string()
        }
    }
}

impl ClientContext for Watch {
    fn error(&self, error: KafkaError, reason: &str) {
        if let Ok(mut last) = self.last.lock() {
            *last = Some(reason.to_string());
        }
        if is_security_failure(&error, reason)
            && let Ok(mut failure) = self.failure.lock()
            && failure.is_none()
        {
            *failure = Some(self.explained(reason));
        }
    }

    /// librdkafka reports every broker failure as a `FAIL` log line, some only there: a plaintext client
    /// on a TLS listener (the broker hung up before answering the first request, which a Kafka listener
    /// speaking the client's protocol never does) and a hang-up in the middle of a TLS handshake are
    /// informational lines with no error event. A failed TLS handshake is both, and the log line comes
    /// first (log events jump the queue), so it is read here too.
    fn log(&self, _level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if fac != "FAIL" {
            return;
        }
        if let Ok(mut last) = self.last.lock() {
            *last = Some(log_message.to_string());
        }
        let hung_up_on_plaintext = self.plaintext
            && log_message.contains("closed by peer")
            && log_message.contains("APIVERSION_QUERY");
        let reason = if hung_up_on_plaintext || log_message.contains("incorrect security.protocol")
        {
            format!("{log_message} (a TLS listener? this client's security.protocol is plaintext)")
        } else if is_failed_handshake(log_message) {
            self.explained(log_message)
        } else {
            return;
        };
        if let Ok(mut failure) = self.failure.lock()
            && failure.is_none()
        {
            *failure = Some(reason);
        }
    }
}

/// Whether a librdkafka failure line is a TLS handshake that failed or was hung up on (a TLS client on a
/// plaintext listener, an untrusted certificate), as opposed to a broker that is not there (yet): a
/// connection refused, or a handshake that got no answer ("Connection setup timed out in state
/// SSL_HANDSHAKE", which a TLS broker still starting also causes).
fn is_failed_handshake(line: &str) -> bool {
    line.contains("SSL handshake failed")
        || (line.contains("in state SSL_HANDSHAKE") && line.contains("Disconnected"))
}

impl ProducerContext for Watch {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        // The probe produces nothing.
    }
}

/// Whether a client with this `security.protocol` speaks plaintext (librdkafka's default does).
fn speaks_plaintext(protocol: Option<&str>) -> bool {
    protocol.is_none_or(|p| {
        p.eq_ignore_ascii_case("plaintext") || p.eq_ignore_ascii_case("sasl_plaintext")
    })
}

/// Whether librdkafka's report is a refused handshake rather than a broker that is not there (yet):
/// failed SASL authentication, a failed TLS handshake, or a plaintext client on a TLS listener.
fn is_security_failure(error: &KafkaError, reason: &str) -> bool {
    let code = error.rdkafka_error_code();
    matches!(
        code,
        Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed)
    ) || is_failed_handshake(reason)
        || reason.contains("SASL")
        || reason.contains("incorrect security.protocol")
}

/// Connects a throwaway client with `config` and waits until the cluster answers a metadata request,
/// for at most `timeout`. A refused handshake fails at once with [`Kind::Security`] and librdkafka's
/// reason (which never holds a password); a cluster that does not answer fails with
/// [`Kind::Connection`] when the time is up.
pub(crate) fn check_connection(
    bootstrap: &str,
    config: &ClientConfig,
    timeout: Duration,
) -> Result<(), Error> {
    // Informational lines too: a plaintext client on a TLS listener is told only at that level.
    let probe: BaseProducer<Watch> = config
        .clone()
        .set("log_level", "6")
        .set_log_level(RDKafkaLogLevel::Info)
        .create_with_context(Watch {
            plaintext: speaks_plaintext(config.get("security.protocol")),
            ..Watch::default()
        })
        .map_err(|e| Error::from_source(Kind::Config, e).with_operation("Kafka client settings"))?;
    let deadline = Instant::now() + timeout;
    loop {
        let answer = probe.client().fetch_metadata(None, PROBE_SLICE);
        // Errors and log lines reach the context's callbacks only while the client is polled, one event
        // a poll: a poll with a deadline serves every event queued (a zero one served one, and a
        // connection failing over and over queued log lines faster than that drained them).
        probe.poll(DRAIN);
        let failure = probe.context().failure.lock().ok().and_then(|f| f.clone());
        if let Some(reason) = failure {
            return Err(Error::new(
                Kind::Security,
                format!("Apache Kafka at {bootstrap} refused the connection: {reason}"),
            )
            .with_operation(format!("connect to {bootstrap}"))
            .temporary(false));
        }
        match answer {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                let last = probe.context().last.lock().ok().and_then(|l| l.clone());
                let told =
                    last.map_or_else(String::new, |l| format!("; librdkafka last said: {l}"));
                return Err(
                    Error::from_source(Kind::Connection, e).with_operation(format!(
                        "connect to Apache Kafka at {bootstrap} (no answer in {} s{told})",
                        timeout.as_secs()
                    )),
                );
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_handshakes_are_told_from_a_missing_broker() {
        let transport = KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure);
        assert!(is_security_failure(
            &transport,
            "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: certificate verify failed"
        ));
        assert!(is_security_failure(
            &transport,
            "Disconnected while requesting ApiVersion: might be caused by incorrect \
             security.protocol configuration (connecting to a SSL listener?)"
        ));
        assert!(is_security_failure(
            &KafkaError::Global(RDKafkaErrorCode::Authentication),
            "SASL authentication error: Authentication failed"
        ));
        assert!(!is_security_failure(
            &transport,
            "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused"
        ));
        assert!(!is_security_failure(
            &KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down"
        ));
    }

    fn failure_after_log(plaintext: bool, line: &str) -> Option<String> {
        let watch = Watch {
            plaintext,
            ..Watch::default()
        };
        watch.log(RDKafkaLogLevel::Error, "FAIL", line);
        watch.failure.lock().ok().and_then(|f| f.clone())
    }

    #[test]
    fn a_failed_tls_handshake_is_told_from_its_log_line_alone() {
        // A TLS client on a plaintext listener: the line librdkafka logs before (or without) the error
        // event.
        let line = "sasl_ssl://127.0.0.1:19092/bootstrap: SSL handshake failed: Disconnected: \
                    connecting to a PLAINTEXT broker listener? (after 3ms in state SSL_HANDSHAKE)";
        assert!(
            failure_after_log(false, line).is_some_and(|f| f.contains("a plaintext listener?"))
        );
        // The first SSL_connect failing at once, a hang-up while the handshake waits, and the broker
        // closing the connection (librdkafka's other words for the same mismatch): each says the same.
        for line in [
            "ssl://127.0.0.1:19092/bootstrap: Disconnected: connection reset by peer (after 0ms in \
             state SSL_HANDSHAKE)",
            "ssl://127.0.0.1:19092/bootstrap: Disconnected: during SSL connection handshake (after \
             2ms in state SSL_HANDSHAKE)",
            "sasl_ssl://127.0.0.1:19092/bootstrap: Disconnected: SSL connection closed by peer (after \
             0ms in state SSL_HANDSHAKE)",
        ] {
            assert!(
                failure_after_log(false, line).is_some_and(|f| f.contains("a plaintext listener?")),
                "{line}"
            );
        }
        // An untrusted certificate is not a plaintext listener.
        let line = "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL \
                    routines::certificate verify failed (after 5ms in state SSL_HANDSHAKE)";
        assert!(failure_after_log(false, line).is_some_and(|f| !f.contains("plaintext listener")));
        // Not a refusal: a broker that is not there, or a handshake that got no answer yet.
        for line in [
            "ssl://127.0.0.1:19092/bootstrap: Connect to ipv4#127.0.0.1:19092 failed: Connection \
             refused (after 0ms in state CONNECT)",
            "ssl://127.0.0.1:19092/bootstrap: Connection setup timed out in state SSL_HANDSHAKE \
             (after 30029ms in state SSL_HANDSHAKE)",
        ] {
            assert!(failure_after_log(false, line).is_none(), "{line}");
        }
    }

    #[test]
    fn a_hang_up_before_the_first_answer_is_a_tls_listener_only_for_a_plaintext_client() {
        let line = "127.0.0.1:9093/bootstrap: Disconnected: connection closed by peer: receive 0 \
                    after POLLIN (after 0ms in state APIVERSION_QUERY)";
        let plaintext = Watch {
            plaintext: speaks_plaintext(None),
            ..Watch::default()
        };
        plaintext.log(RDKafkaLogLevel::Info, "FAIL", line);
        let said = plaintext
            .failure
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        assert!(said.is_some_and(|s| s.contains("a TLS listener?")));
        let tls = Watch {
            plaintext: speaks_plaintext(Some("SASL_SSL")),
            ..Watch::default()
        };
        tls.log(RDKafkaLogLevel::Info, "FAIL", line);
        assert!(tls.failure.lock().map(|f| f.is_none()).unwrap_or(false));
    }
}
