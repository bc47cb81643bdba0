//! The broker's admin REST API, where the adapter is given its URL (`admin_url`): reading settings and
//! creating subscriptions without attaching a consumer. The `pulsar` client crate speaks only the binary
//! protocol, so these are plain HTTP requests — over HTTPS (native-tls, trusting the adapter's `tls_ca`
//! when given) for an `https://` admin URL, with the adapter's token as a bearer token. Separate from
//! the `Admin` implementation beside it: this is the HTTP client, which the link and the delay
//! settings use too.

use std::time::Duration;

use event_retry_core::error::{Error, Kind};
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};

use crate::security::PulsarSecurity;

/// The header naming the authentication method of a request.
const AUTH_METHOD: &str = "X-Pulsar-Auth-Method-Name";

/// How long one admin request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The body of a GET of `url`.
pub(crate) fn get(url: &str, security: &PulsarSecurity) -> Result<String, Error> {
    request("GET", url, security, TIMEOUT)
}

/// The body of a GET of `url`, given up after `timeout`.
pub(crate) fn get_within(
    url: &str,
    security: &PulsarSecurity,
    timeout: Duration,
) -> Result<String, Error> {
    request("GET", url, security, timeout)
}

/// Creates subscription `subscription` on `topic` (its full name, `persistent://tenant/ns/topic`) at
/// the topic's end, the topic too if it is missing; one that exists already is left as it is.
pub(crate) fn create_subscription(
    admin: &str,
    topic: &str,
    subscription: &str,
    security: &PulsarSecurity,
) -> Result<(), Error> {
    let path = topic.replacen("://", "/", 1);
    let url = format!("{admin}/admin/v2/{path}/subscription/{subscription}");
    match request("PUT", &url, security, TIMEOUT) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == Kind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// TLS for an `https://` admin URL: native-tls, trusting the adapter's `tls_ca` when given, else the
/// platform's roots.
fn tls_config(security: &PulsarSecurity) -> Result<TlsConfig, Error> {
    let roots = match &security.tls_ca {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                Error::new(
                    Kind::Config,
                    format!(
                        "cannot read {} for the Apache Pulsar adapter: {e}",
                        path.display()
                    ),
                )
            })?;
            let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            RootCerts::new_with_certs(&certs)
        }
        None => RootCerts::PlatformVerifier,
    };
    Ok(TlsConfig::builder()
        .provider(TlsProvider::NativeTls)
        .root_certs(roots)
        .build())
}

/// A request's body, or an error naming the URL (a 409 Conflict is [`Kind::AlreadyExists`]: what was
/// asked for exists already).
fn request(
    method: &str,
    url: &str,
    security: &PulsarSecurity,
    timeout: Duration,
) -> Result<String, Error> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(true)
        .tls_config(tls_config(security)?)
        .build()
        .into();
    let bearer = security
        .token
        .as_ref()
        .map(|t| format!("Bearer {}", t.expose()));
    // The method header makes the broker check the token rather than fall back to its anonymous role
    // (as Pulsar's own admin client does).
    let response = match (method, bearer) {
        ("PUT", Some(b)) => agent
            .put(url)
            .header("Authorization", b)
            .header(AUTH_METHOD, "token")
            .send_empty(),
        ("PUT", None) => agent.put(url).send_empty(),
        (_, Some(b)) => agent
            .get(url)
            .header("Authorization", b)
            .header(AUTH_METHOD, "token")
            .call(),
        (_, None) => agent.get(url).call(),
    };
    response
        .and_then(|mut response| response.body_mut().read_to_string())
        .map_err(|e| {
            Error::from_source(crate::error::admin_kind(&e), e)
                .with_operation(format!("{method} {url}"))
        })
}
