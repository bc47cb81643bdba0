//! The adapter over RabbitMQ's TLS listener (`RETRY_TEST_AMQP_TLS`, started by
//! `scripts/brokers start --tls`: a throwaway CA, a user of its own, the EXTERNAL mechanism on):
//!
//! * `amqps://` with the password from a file, and with a client certificate and EXTERNAL (no
//!   password at all), each carry an event with one broker retry;
//! * a wrong password, an untrusted certificate, plaintext to the TLS port and TLS to the plaintext
//!   port each fail at connect time within 20 s with a security error naming RabbitMQ and the cause;
//! * the password appears in no `Debug` or `Display` output, no error and no tracing event, whether it
//!   came from a file, the option, or the URL's user info.
//!
//! They fail when `RETRY_TEST_REQUIRE` names `rabbitmq-tls` and the variable is unset, and are skipped
//! loudly otherwise.

use event_retry_rabbitmq::{RabbitConfig, SCHEME};
use libtest_mimic::Arguments;
use retry_core::options::Options;
use test_support::broker::{Test, runtime};
use test_support::security::{
    assert_hidden, capture_tracing, connect, fails_fast, round_trip, tls_file, tls_secret,
    with_address_of, with_query,
};

fn main() {
    capture_tracing();
    let args = Arguments::from_args();
    let tests: [(&str, Test); 7] = [
        (
            "a_password_from_a_file_carries_an_event",
            a_password_from_a_file_carries_an_event,
        ),
        (
            "a_client_certificate_logs_in_with_external",
            a_client_certificate_logs_in_with_external,
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
    let trials = test_support::broker::trials("rabbitmq-tls", "RETRY_TEST_AMQP_TLS", &tests);
    libtest_mimic::run(&args, trials).exit();
}

fn a_password_from_a_file_carries_an_event(url: String) -> Result<(), String> {
    runtime()?.block_on(async {
        let broker = connect(&SCHEME, &url).await.map_err(|e| e.to_string())?;
        round_trip(&broker, "amqps").await
    })
}

fn a_client_certificate_logs_in_with_external(url: String) -> Result<(), String> {
    // A user that does not exist and no password: only the certificate (its common name,
    // event-retry) can log this in, so a fallback to PLAIN (or to the guest user) would be refused.
    let url =
        with_query(&url, "password_file", None).replacen("event-retry@", "nobody-by-name@", 1);
    let url = with_query(&url, "auth_mechanism", Some("external"));
    let with_cert = with_query(&url, "tls_cert", Some(&tls_file("client.pem")?));
    let with_cert = with_query(&with_cert, "tls_key", Some(&tls_file("client.key")?));
    runtime()?.block_on(async {
        let broker = connect(&SCHEME, &with_cert)
            .await
            .map_err(|e| e.to_string())?;
        round_trip(&broker, "amqps-external").await?;
        // The same without the certificate: EXTERNAL has nothing to go on.
        let e = connect(&SCHEME, &url)
            .await
            .err()
            .ok_or("EXTERNAL logged in without a certificate")?;
        println!("  without the certificate: {e}");
        Ok(())
    })
}

fn a_wrong_password_is_refused_fast(url: String) -> Result<(), String> {
    let url = with_query(&url, "password_file", None);
    let url = with_query(&url, "password", Some("not-the-password-0451"));
    let said = runtime()?.block_on(fails_fast(
        "RabbitMQ",
        &["refused the login"],
        connect(&SCHEME, &url),
    ))?;
    println!("  {said}");
    Ok(())
}

fn an_untrusted_certificate_is_refused_fast(url: String) -> Result<(), String> {
    let url = with_query(&url, "tls_ca", Some(&tls_file("other-ca.pem")?));
    let said = runtime()?.block_on(fails_fast(
        "RabbitMQ",
        &["does not trust"],
        connect(&SCHEME, &url),
    ))?;
    println!("  {said}");
    Ok(())
}

fn plaintext_to_the_tls_port_is_refused_fast(url: String) -> Result<(), String> {
    let url = with_query(&url, "tls_ca", None).replacen("amqps://", "amqp://", 1);
    let said = runtime()?.block_on(fails_fast(
        "RabbitMQ",
        &["TLS port"],
        connect(&SCHEME, &url),
    ))?;
    println!("  {said}");
    Ok(())
}

fn tls_to_the_plaintext_port_is_refused_fast(url: String) -> Result<(), String> {
    let plaintext = std::env::var("RETRY_TEST_AMQP")
        .map_err(|_| "RETRY_TEST_AMQP (the plaintext listener) is not set".to_string())?;
    let url = with_address_of(&url, &plaintext);
    let said = runtime()?.block_on(fails_fast(
        "RabbitMQ",
        &["did not answer TLS"],
        connect(&SCHEME, &url),
    ))?;
    println!("  {said}");
    Ok(())
}

fn the_password_is_never_printed(url: String) -> Result<(), String> {
    let captured = capture_tracing();
    let password = tls_secret("amqp.password")?;
    let bare = with_query(&url, "password_file", None);
    let as_option = with_query(&bare, "password", Some(&password));
    let in_user_info = bare.replacen("event-retry@", &format!("event-retry:{password}@"), 1);
    let wrong = with_query(&bare, "password", Some("wrong-password-3141"));
    runtime()?.block_on(async {
        let mut outputs = Vec::new();
        for (how, url) in [
            ("file", &url),
            ("option", &as_option),
            ("user info", &in_user_info),
        ] {
            let (_, options) = Options::split_url(url).map_err(|e| e.to_string())?;
            let config = RabbitConfig::from_options(&options).map_err(|e| e.to_string())?;
            outputs.push((
                format!("Debug of the options ({how})"),
                format!("{options:?}"),
            ));
            outputs.push((
                format!("Debug of the config ({how})"),
                format!("{config:?}"),
            ));
            outputs.push((
                format!("the URL redacted ({how})"),
                retry_core::options::redact_url(url),
            ));
            let broker = connect(&SCHEME, url)
                .await
                .map_err(|e| format!("{how}: {e}"))?;
            outputs.push((
                format!("Debug of the broker ({how})"),
                format!("{broker:?}"),
            ));
            round_trip(&broker, "redaction").await?;
        }
        let refused = with_query(&as_option, "tls_ca", Some(&tls_file("other-ca.pem")?));
        let e = connect(&SCHEME, &refused)
            .await
            .err()
            .ok_or("connected with an untrusted CA")?;
        outputs.push(("Display of a refused connect".into(), format!("{e}")));
        outputs.push(("Debug of a refused connect".into(), format!("{e:?}")));
        let e = connect(&SCHEME, &wrong)
            .await
            .err()
            .ok_or("connected with a wrong password")?;
        outputs.push(("Display of a wrong-password connect".into(), format!("{e}")));
        outputs.push(("Debug of a wrong-password connect".into(), format!("{e:?}")));
        if captured.text().is_empty() {
            return Err("no tracing event was captured: the search would prove nothing".into());
        }
        outputs.push(("the tracing events".into(), captured.text()));
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
