//! The adapter over Kafka's SASL_SSL listener (`RETRY_TEST_KAFKA_TLS`, started by
//! `scripts/brokers start --tls`: a throwaway CA, SCRAM and PLAIN users, the broker's unsecured
//! OAUTHBEARER validator):
//!
//! * every SASL mechanism librdkafka offers here — PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER
//!   (an unsecured test token) — carries an event with one broker retry, over TLS with hostname
//!   verification on (librdkafka's default);
//! * a wrong password, an untrusted certificate, plaintext to the TLS port and TLS to the plaintext
//!   port each fail at connect time within 20 s with a security error naming Kafka and the cause;
//! * the password appears in no `Debug` or `Display` output, no error and no tracing event, whether it
//!   came from a file or inline in the URL.
//!
//! They fail when `RETRY_TEST_REQUIRE` names `kafka-tls` and the variable is unset, and are skipped
//! loudly otherwise.

use event_retry_kafka::{KafkaConfig, KafkaTransport};
use libtest_mimic::Arguments;
use retry_core::broker::Broker;
use retry_core::error::Error;
use retry_core::options::Options;
use test_support::broker::{Test, runtime};
use test_support::security::{
    assert_hidden, capture_tracing, fails_fast, round_trip, tls_file, tls_secret, with_address_of,
    with_query,
};

fn main() {
    capture_tracing();
    let args = Arguments::from_args();
    let tests: [(&str, Test); 6] = [
        (
            "every_sasl_mechanism_carries_an_event",
            every_sasl_mechanism_carries_an_event,
        ),
        (
            "a_wrong_password_is_refused_fast",
            a_wrong_password_is_refused_fast,
        ),
        (
            "an_untrusted_certificate_is_refused_fast",
            an_untrusted_certificate_is_refused_fast,
        ),
        (
            "plaintext_to_the_tls_port_is_refused_fast",
            plaintext_to_the_tls_port_is_refused_fast,
        ),
        (
            "tls_to_the_plaintext_port_is_refused_fast",
            tls_to_the_plaintext_port_is_refused_fast,
        ),
        (
            "the_password_is_never_printed",
            the_password_is_never_printed,
        ),
    ];
    let trials = test_support::broker::trials("kafka-tls", "RETRY_TEST_KAFKA_TLS", &tests);
    libtest_mimic::run(&args, trials).exit();
}

/// Connects as `event_retry::connect` does: the URL's query is the adapter's options.
async fn connect(url: &str) -> Result<KafkaTransport, Error> {
    let (base, options) = Options::split_url(url)?;
    KafkaTransport::connect_with(&base, KafkaConfig::from_options(&options)?).await
}

fn every_sasl_mechanism_carries_an_event(url: String) -> Result<(), String> {
    runtime()?.block_on(async {
        let oauth = with_query(
            &with_query(
                &with_query(&url, "sasl.username", None),
                "sasl.password_file",
                None,
            ),
            "sasl.mechanism",
            Some("OAUTHBEARER"),
        );
        let oauth = with_query(&oauth, "enable.sasl.oauthbearer.unsecure.jwt", Some("true"));
        let oauth = with_query(
            &oauth,
            "sasl.oauthbearer.config",
            Some("principal%3Devent-retry"),
        );
        let urls = [
            ("PLAIN", with_query(&url, "sasl.mechanism", Some("PLAIN"))),
            (
                "SCRAM-SHA-256",
                with_query(&url, "sasl.mechanism", Some("SCRAM-SHA-256")),
            ),
            (
                "SCRAM-SHA-512",
                with_query(&url, "sasl.mechanism", Some("SCRAM-SHA-512")),
            ),
            ("OAUTHBEARER", oauth),
        ];
        for (mechanism, url) in urls {
            let transport = connect(&url)
                .await
                .map_err(|e| format!("{mechanism}: connect: {e}"))?;
            round_trip(&Broker::new(transport), "sasl")
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
    let said = runtime()?.block_on(fails_fast("Kafka", &["authentication"], connect(&url)))?;
    println!("  {said}");
    Ok(())
}

fn an_untrusted_certificate_is_refused_fast(url: String) -> Result<(), String> {
    let url = with_query(&url, "ssl.ca.location", Some(&tls_file("other-ca.pem")?));
    let said = runtime()?.block_on(fails_fast(
        "Kafka",
        &["certificate verify failed"],
        connect(&url),
    ))?;
    println!("  {said}");
    Ok(())
}

fn plaintext_to_the_tls_port_is_refused_fast(url: String) -> Result<(), String> {
    let plain = url.split('?').next().unwrap_or(&url).to_string();
    let said = runtime()?.block_on(fails_fast("Kafka", &["a TLS listener?"], connect(&plain)))?;
    println!("  {said}");
    Ok(())
}

fn tls_to_the_plaintext_port_is_refused_fast(url: String) -> Result<(), String> {
    let plaintext = std::env::var("RETRY_TEST_KAFKA")
        .map_err(|_| "RETRY_TEST_KAFKA (the plaintext listener) is not set".to_string())?;
    let url = with_address_of(&url, &plaintext);
    let said = runtime()?.block_on(fails_fast(
        "Kafka",
        &["SSL handshake failed"],
        connect(&url),
    ))?;
    println!("  {said}");
    Ok(())
}

fn the_password_is_never_printed(url: String) -> Result<(), String> {
    let captured = capture_tracing();
    let password = tls_secret("kafka.password")?;
    let inline = with_query(
        &with_query(&url, "sasl.password_file", None),
        "sasl.password",
        Some(&password),
    );
    let wrong = with_query(
        &with_query(&url, "sasl.password_file", None),
        "sasl.password",
        Some("wrong-password-3141"),
    );
    runtime()?.block_on(async {
        let mut outputs = Vec::new();
        for (how, url) in [("file", &url), ("inline", &inline)] {
            let (_, options) = Options::split_url(url).map_err(|e| e.to_string())?;
            let config = KafkaConfig::from_options(&options).map_err(|e| e.to_string())?;
            outputs.push((
                format!("Debug of the options ({how})"),
                format!("{options:?}"),
            ));
            outputs.push((
                format!("Debug of the config ({how})"),
                format!("{config:?}"),
            ));
            let transport = connect(url).await.map_err(|e| format!("{how}: {e}"))?;
            outputs.push((
                format!("Debug of the transport ({how})"),
                format!("{transport:?}"),
            ));
            let broker = Broker::new(transport);
            outputs.push((
                format!("Debug of the broker ({how})"),
                format!("{broker:?}"),
            ));
            round_trip(&broker, "redaction").await?;
        }
        // The error of a refused connection, with the right password of another mechanism inline.
        let refused = with_query(&inline, "ssl.ca.location", Some(&tls_file("other-ca.pem")?));
        let e = connect(&refused)
            .await
            .err()
            .ok_or("connected with an untrusted CA")?;
        outputs.push(("Display of a refused connect".into(), format!("{e}")));
        outputs.push(("Debug of a refused connect".into(), format!("{e:?}")));
        let e = connect(&wrong)
            .await
            .err()
            .ok_or("connected with a wrong password")?;
        outputs.push(("Debug of a wrong-password connect".into(), format!("{e:?}")));
        outputs.push(("the tracing events".into(), captured.text()));
        if captured.text().is_empty() {
            return Err("no tracing event was captured: the search would prove nothing".into());
        }
        let named: Vec<(&str, String)> = outputs
            .iter()
            .map(|(w, t)| (w.as_str(), t.clone()))
            .collect();
        assert_hidden(&password, &named)?;
        assert_hidden("wrong-password-3141", &named)?;
        println!(
            "  searched {} outputs ({} bytes of tracing) for the password: absent",
            named.len(),
            captured.text().len()
        );
        Ok(())
    })
}
