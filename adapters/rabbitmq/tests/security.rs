//! The adapter over RabbitMQ's TLS listener (`RETRY_TEST_AMQP_TLS`, started by
//! `scripts/brokers start --tls`: a throwaway CA, a user of its own, the EXTERNAL mechanism on):
//!
//! * `amqps://` with the password from a file, and with a client certificate and EXTERNAL (no
//!   password at all), each carry an event with one broker retry;
//! * a wrong password, an untrusted certificate, a certificate that does not name the address connected
//!   to (127.0.0.2, forwarded to the listener), plaintext to the TLS port and TLS to the plaintext port
//!   each fail at connect time within 20 s with a security error naming RabbitMQ and the cause;
//! * the password appears in no `Debug` or `Display` output, no error and no tracing event, whether it
//!   came from a file, the option, or the URL's user info.
//!
//! Each case runs on Debian 12's RabbitMQ and, marked `[rabbitmq4]`, on RabbitMQ 4's TLS listener
//! (`RETRY_TEST_AMQP4_TLS`). They fail when `RETRY_TEST_REQUIRE` names `rabbitmq-tls` (or `rabbitmq4`)
//! and the variable is unset, and are skipped loudly otherwise.

use event_retry_core::options::Options;
use event_retry_rabbitmq::{RabbitConfig, SCHEME};
use libtest_mimic::Arguments;
use test_support::broker::runtime;
use test_support::security::{
    Printed, capture_tracing, connect, expect_name_refused, expect_refused, round_trip, tls_file,
    tls_secret, with_address_of, with_query,
};

fn main() {
    capture_tracing();
    let args = Arguments::from_args();
    let tests = test_support::named_tests![
        a_certificate_without_the_address_is_refused_fast,
        a_password_from_a_file_carries_an_event,
        a_client_certificate_logs_in_with_external,
        a_wrong_password_is_refused_fast,
        an_untrusted_certificate_is_refused_fast,
        plaintext_to_the_tls_port_is_refused_fast,
        tls_to_the_plaintext_port_is_refused_fast,
        the_password_is_never_printed,
    ];
    // The same cases on RabbitMQ 4's TLS listener, each trial marked `[rabbitmq4]`.
    let mut trials = test_support::broker::trials("rabbitmq-tls", "RETRY_TEST_AMQP_TLS", &tests);
    trials.extend(
        test_support::broker::trials("rabbitmq4-tls", "RETRY_TEST_AMQP4_TLS", &tests)
            .into_iter()
            .map(|t| t.with_kind("rabbitmq4")),
    );
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
    expect_refused("RabbitMQ", &["refused the login"], connect(&SCHEME, &url))
}

/// Through an address the broker's certificate does not name (127.0.0.2, forwarded to the listener):
/// the client checks the name and refuses; with the check off it would connect.
fn a_certificate_without_the_address_is_refused_fast(url: String) -> Result<(), String> {
    expect_name_refused("RabbitMQ", &[], &url, |url| async move {
        connect(&SCHEME, &url).await
    })
}

fn an_untrusted_certificate_is_refused_fast(url: String) -> Result<(), String> {
    let url = with_query(&url, "tls_ca", Some(&tls_file("other-ca.pem")?));
    expect_refused("RabbitMQ", &["does not trust"], connect(&SCHEME, &url))
}

fn plaintext_to_the_tls_port_is_refused_fast(url: String) -> Result<(), String> {
    let url = with_query(&url, "tls_ca", None).replacen("amqps://", "amqp://", 1);
    expect_refused("RabbitMQ", &["TLS port"], connect(&SCHEME, &url))
}

fn tls_to_the_plaintext_port_is_refused_fast(url: String) -> Result<(), String> {
    // The plaintext listener of the node whose TLS listener `url` is.
    let node = if std::env::var("RETRY_TEST_AMQP4_TLS").is_ok_and(|tls| tls == url) {
        "RETRY_TEST_AMQP4"
    } else {
        "RETRY_TEST_AMQP"
    };
    let plaintext =
        std::env::var(node).map_err(|_| format!("{node} (the plaintext listener) is not set"))?;
    let url = with_address_of(&url, &plaintext);
    expect_refused("RabbitMQ", &["did not answer TLS"], connect(&SCHEME, &url))
}

fn the_password_is_never_printed(url: String) -> Result<(), String> {
    let captured = capture_tracing();
    let password = tls_secret("amqp.password")?;
    let bare = with_query(&url, "password_file", None);
    let as_option = with_query(&bare, "password", Some(&password));
    let in_user_info = bare.replacen("event-retry@", &format!("event-retry:{password}@"), 1);
    let wrong = with_query(&bare, "password", Some("wrong-password-3141"));
    let settings = |o: &Options| RabbitConfig::from_options(o).map(|c| format!("{c:?}"));
    runtime()?.block_on(async {
        let mut printed = Printed::default();
        for (how, url) in [
            ("file", &url),
            ("option", &as_option),
            ("user info", &in_user_info),
        ] {
            printed.connect_and_use(&SCHEME, how, url, settings).await?;
        }
        let untrusted = with_query(&as_option, "tls_ca", Some(&tls_file("other-ca.pem")?));
        printed
            .refused(&SCHEME, "an untrusted CA", &untrusted)
            .await?;
        printed.refused(&SCHEME, "a wrong password", &wrong).await?;
        printed.search(&captured, &[&password, "wrong-password-3141"])
    })
}
