//! The adapter over Pulsar's TLS listener with token authentication (`RETRY_TEST_PULSAR_TLS`, started
//! by `scripts/brokers start --tls`: a throwaway CA, HS256 tokens signed with the broker's secret key):
//!
//! * `pulsar+ssl://` with a token from a file carries an event with one broker retry, hostname
//!   verification on;
//! * a token with a wrong signature, an untrusted certificate, a certificate that does not name the
//!   address connected to (127.0.0.2, forwarded to the listener), plaintext to the TLS port and TLS to
//!   the plaintext port each fail at connect time within 20 s with a security error naming Pulsar and
//!   the cause;
//! * the token appears in no `Debug` or `Display` output, no error and no tracing event, whether it
//!   came from a file or inline in the URL.
//!
//! They fail when `RETRY_TEST_REQUIRE` names `pulsar-tls` and the variable is unset, and are skipped
//! loudly otherwise.

use event_retry_core::options::Options;
use event_retry_pulsar::{PulsarConfig, SCHEME};
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
        a_token_over_tls_carries_an_event,
        the_admin_api_is_read_over_https_with_the_token,
        a_wrongly_signed_token_is_refused_fast,
        an_untrusted_certificate_is_refused_fast,
        plaintext_to_the_tls_port_is_refused_fast,
        tls_to_the_plaintext_port_is_refused_fast,
        the_token_is_never_printed,
    ];
    let trials = test_support::broker::trials("pulsar-tls", "RETRY_TEST_PULSAR_TLS", &tests);
    libtest_mimic::run(&args, trials).exit();
}

fn a_token_over_tls_carries_an_event(url: String) -> Result<(), String> {
    runtime()?.block_on(async {
        let broker = connect(&SCHEME, &url).await.map_err(|e| e.to_string())?;
        round_trip(&broker, "pulsar-tls").await
    })
}

/// The broker's 100 ms strict tick (the adapter's defaults are 1 s, not strict) is read through the
/// admin API over HTTPS with the token; with a wrongly signed token the admin API answers 401, a
/// security error.
fn the_admin_api_is_read_over_https_with_the_token(url: String) -> Result<(), String> {
    let admin = test_support::broker::url("RETRY_TEST_PULSAR_TLS_ADMIN")
        .ok_or("RETRY_TEST_PULSAR_TLS_ADMIN is not set")?;
    if !admin.starts_with("https://") {
        return Err(format!("the admin URL {admin} is not HTTPS"));
    }
    let with_admin = with_query(&url, "admin_url", Some(&admin));
    runtime()?.block_on(async {
        let (base, options) = Options::split_url(&with_admin).map_err(|e| e.to_string())?;
        let config = PulsarConfig::from_options(&options).map_err(|e| e.to_string())?;
        let transport = event_retry_pulsar::PulsarTransport::connect_with(&base, config)
            .await
            .map_err(|e| e.to_string())?;
        let read = transport.config();
        if read.tick != std::time::Duration::from_millis(100) || !read.strict_deliver_at {
            return Err(format!(
                "the broker's settings were not read: tick {:?}, strict {}",
                read.tick, read.strict_deliver_at
            ));
        }
        let wrong = with_query(
            &with_admin,
            "token_file",
            Some(&tls_file("pulsar-wrong.token")?),
        );
        let (base, options) = Options::split_url(&wrong).map_err(|e| e.to_string())?;
        let config = PulsarConfig::from_options(&options).map_err(|e| e.to_string())?;
        let e = event_retry_pulsar::PulsarTransport::connect_with(&base, config)
            .await
            .err()
            .ok_or("the admin API took a wrongly signed token")?;
        if e.kind() != event_retry_core::error::Kind::Security || !e.to_string().contains("401") {
            return Err(format!(
                "want a security error with 401, got {}: {e}",
                e.kind()
            ));
        }
        println!("  tick 100 ms strict read over HTTPS; a wrong token: {e}");
        Ok(())
    })
}

fn a_wrongly_signed_token_is_refused_fast(url: String) -> Result<(), String> {
    let url = with_query(&url, "token_file", Some(&tls_file("pulsar-wrong.token")?));
    expect_refused(
        "Pulsar",
        &["refused the authentication"],
        connect(&SCHEME, &url),
    )
}

/// Through an address the broker's certificate does not name (127.0.0.2, forwarded to the listener):
/// the client checks the name and refuses; with the check off it would connect.
fn a_certificate_without_the_address_is_refused_fast(url: String) -> Result<(), String> {
    expect_name_refused("Pulsar", &[], &url, |url| async move {
        connect(&SCHEME, &url).await
    })
}

fn an_untrusted_certificate_is_refused_fast(url: String) -> Result<(), String> {
    let url = with_query(&url, "tls_ca", Some(&tls_file("other-ca.pem")?));
    expect_refused("Pulsar", &["does not trust"], connect(&SCHEME, &url))
}

fn plaintext_to_the_tls_port_is_refused_fast(url: String) -> Result<(), String> {
    let url = with_query(&url, "tls_ca", None).replacen("pulsar+ssl://", "pulsar://", 1);
    expect_refused("Pulsar", &["TLS port"], connect(&SCHEME, &url))
}

fn tls_to_the_plaintext_port_is_refused_fast(url: String) -> Result<(), String> {
    let plaintext = std::env::var("RETRY_TEST_PULSAR")
        .map_err(|_| "RETRY_TEST_PULSAR (the plaintext listener) is not set".to_string())?;
    let url = with_address_of(&url, &plaintext);
    expect_refused("Pulsar", &["TLS handshake failed"], connect(&SCHEME, &url))
}

fn the_token_is_never_printed(url: String) -> Result<(), String> {
    let captured = capture_tracing();
    let token = tls_secret("pulsar.token")?;
    let wrong = tls_secret("pulsar-wrong.token")?;
    let inline = with_query(&with_query(&url, "token_file", None), "token", Some(&token));
    let wrong_inline = with_query(&inline, "token", Some(&wrong));
    let settings = |o: &Options| PulsarConfig::from_options(o).map(|c| format!("{c:?}"));
    runtime()?.block_on(async {
        let mut printed = Printed::default();
        for (how, url) in [("file", &url), ("inline", &inline)] {
            printed.connect_and_use(&SCHEME, how, url, settings).await?;
        }
        let untrusted = with_query(&inline, "tls_ca", Some(&tls_file("other-ca.pem")?));
        printed
            .refused(&SCHEME, "an untrusted CA", &untrusted)
            .await?;
        printed
            .refused(&SCHEME, "a wrong token", &wrong_inline)
            .await?;
        printed.search(&captured, &[&token, &wrong])
    })
}
