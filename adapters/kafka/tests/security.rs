//! The adapter over Kafka's SASL_SSL listener (`RETRY_TEST_KAFKA_TLS`, started by
//! `scripts/brokers start --tls`: a throwaway CA, SCRAM and PLAIN users, the broker's unsecured
//! OAUTHBEARER validator):
//!
//! * every SASL mechanism librdkafka offers here — PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER
//!   (an unsecured test token) — carries an event with one broker retry, over TLS with hostname
//!   verification on (librdkafka's default);
//! * a wrong password, an untrusted certificate, a certificate that does not name the address connected
//!   to (127.0.0.2, forwarded to the listener), plaintext to the TLS port and TLS to the plaintext port
//!   (also with librdkafka's debug lines on) each fail at connect time within 20 s with a security
//!   error naming Kafka and the cause;
//! * the password appears in no `Debug` or `Display` output, no error and no tracing event, whether it
//!   came from a file or inline in the URL.
//!
//! They fail when `RETRY_TEST_REQUIRE` names `kafka-tls` and the variable is unset, and are skipped
//! loudly otherwise.

use event_retry_core::broker::Broker;
use event_retry_core::error::Error;
use event_retry_core::options::Options;
use event_retry_kafka::{KafkaConfig, KafkaTransport, SCHEME};
use libtest_mimic::Arguments;
use test_support::broker::runtime;
use test_support::security::{
    Printed, capture_tracing, expect_name_refused, expect_refused, round_trip, tls_file,
    tls_secret, with_address_of, with_query,
};

fn main() {
    capture_tracing();
    let args = Arguments::from_args();
    let tests = test_support::named_tests![
        a_certificate_without_the_address_is_refused_fast,
        every_sasl_mechanism_carries_an_event,
        a_wrong_password_is_refused_fast,
        an_untrusted_certificate_is_refused_fast,
        plaintext_to_the_tls_port_is_refused_fast,
        tls_to_the_plaintext_port_is_refused_fast,
        tls_to_the_plaintext_port_is_refused_fast_with_debug_logs_on,
        the_password_is_never_printed,
    ];
    let trials = test_support::broker::trials("kafka-tls", "RETRY_TEST_KAFKA_TLS", &tests);
    libtest_mimic::run(&args, trials).exit();
}

/// Connects as `event_retry::connect` does: the URL's query is the adapter's options.
async fn connect(url: &str) -> Result<Broker, Error> {
    test_support::security::connect(&SCHEME, url).await
}

fn every_sasl_mechanism_carries_an_event(url: String) -> Result<(), String> {
    let oauth = with_query(&url, "sasl.username", None);
    let oauth = with_query(&oauth, "sasl.password_file", None);
    let oauth = with_query(&oauth, "sasl.mechanism", Some("OAUTHBEARER"));
    let oauth = with_query(&oauth, "enable.sasl.oauthbearer.unsecure.jwt", Some("true"));
    let oauth = with_query(
        &oauth,
        "sasl.oauthbearer.config",
        Some("principal%3Devent-retry"),
    );
    let mut urls: Vec<(&str, String)> = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        .into_iter()
        .map(|m| (m, with_query(&url, "sasl.mechanism", Some(m))))
        .collect();
    urls.push(("OAUTHBEARER", oauth));
    runtime()?.block_on(async {
        for (mechanism, url) in urls {
            let broker = connect(&url)
                .await
                .map_err(|e| format!("{mechanism}: connect: {e}"))?;
            round_trip(&broker, "sasl")
                .await
                .map_err(|e| format!("{mechanism}: {e}"))?;
            println!("  {mechanism} over TLS: one event, one broker retry, handled");
        }
        Ok(())
    })
}

fn a_wrong_password_is_refused_fast(url: String) -> Result<(), String> {
    let url = with_query(&url, "sasl.password_file", None);
    let url = with_query(&url, "sasl.password", Some("not-the-password-0451"));
    expect_refused("Kafka", &["authentication"], connect(&url))
}

/// Through an address the broker's certificate does not name (127.0.0.2, forwarded to the listener):
/// the client checks the name and refuses; with the check off it would connect.
fn a_certificate_without_the_address_is_refused_fast(url: String) -> Result<(), String> {
    expect_name_refused("Kafka", &[], &url, |url| async move { connect(&url).await })
}

fn an_untrusted_certificate_is_refused_fast(url: String) -> Result<(), String> {
    let url = with_query(&url, "ssl.ca.location", Some(&tls_file("other-ca.pem")?));
    expect_refused("Kafka", &["certificate verify failed"], connect(&url))
}

fn plaintext_to_the_tls_port_is_refused_fast(url: String) -> Result<(), String> {
    let plain = url.split('?').next().unwrap_or(&url).to_string();
    expect_refused("Kafka", &["a TLS listener?"], connect(&plain))
}

fn tls_to_the_plaintext_port_is_refused_fast(url: String) -> Result<(), String> {
    let plaintext = std::env::var("RETRY_TEST_KAFKA")
        .map_err(|_| "RETRY_TEST_KAFKA (the plaintext listener) is not set".to_string())?;
    let url = with_address_of(&url, &plaintext);
    // librdkafka words this two ways ("SSL handshake failed … PLAINTEXT broker listener?" or "SSL
    // connection closed by peer … in state SSL_HANDSHAKE"), whichever it sees first; the adapter names
    // the cause the same in both.
    expect_refused(
        "Kafka",
        &["the TLS handshake failed: a plaintext listener?"],
        connect(&url),
    )
}

/// The same with librdkafka's every debug line on: a connect check that served one queued event per
/// metadata request fell behind the log lines and timed out with a connection error instead (the race
/// one CI run lost without the debug lines).
fn tls_to_the_plaintext_port_is_refused_fast_with_debug_logs_on(url: String) -> Result<(), String> {
    tls_to_the_plaintext_port_is_refused_fast(with_query(&url, "rdkafka.debug", Some("all")))
}

fn the_password_is_never_printed(url: String) -> Result<(), String> {
    let captured = capture_tracing();
    let password = tls_secret("kafka.password")?;
    let bare = with_query(&url, "sasl.password_file", None);
    let inline = with_query(&bare, "sasl.password", Some(&password));
    let wrong = with_query(&bare, "sasl.password", Some("wrong-password-3141"));
    let settings = |o: &Options| KafkaConfig::from_options(o).map(|c| format!("{c:?}"));
    runtime()?.block_on(async {
        let mut printed = Printed::default();
        for (how, url) in [("file", &url), ("inline", &inline)] {
            printed.connect_and_use(&SCHEME, how, url, settings).await?;
            // The transport's own Debug (bootstrap and settings), which the broker's does not show.
            let (base, options) = Options::split_url(url).map_err(|e| e.to_string())?;
            let config = KafkaConfig::from_options(&options).map_err(|e| e.to_string())?;
            let transport = KafkaTransport::connect_with(&base, config)
                .await
                .map_err(|e| format!("{how}: {e}"))?;
            printed.add(
                format!("Debug of the transport ({how})"),
                format!("{transport:?}"),
            );
        }
        // The right password inline, refused for the CA; then a wrong one.
        let untrusted = with_query(&inline, "ssl.ca.location", Some(&tls_file("other-ca.pem")?));
        printed
            .refused(&SCHEME, "an untrusted CA", &untrusted)
            .await?;
        printed.refused(&SCHEME, "a wrong password", &wrong).await?;
        printed.search(&captured, &[&password, "wrong-password-3141"])
    })
}
