//! The broker's admin REST API, where the adapter is given its URL (`admin_url`): reading settings and
//! creating subscriptions without attaching a consumer. The `pulsar` client crate speaks only the binary
//! protocol, so these are plain HTTP requests.

use std::time::Duration;

use retry_core::error::{Error, Kind};

/// How long one admin request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The body of a GET of `url`.
pub(crate) fn get(url: &str) -> Result<String, Error> {
    request("GET", url)
}

/// Creates subscription `subscription` on `topic` (its full name, `persistent://tenant/ns/topic`) at
/// the topic's end, the topic too if it is missing; one that exists already is left as it is.
pub(crate) fn create_subscription(
    admin: &str,
    topic: &str,
    subscription: &str,
) -> Result<(), Error> {
    let path = topic.replacen("://", "/", 1);
    let url = format!("{admin}/admin/v2/{path}/subscription/{subscription}");
    match request("PUT", &url) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == Kind::AlreadySettled => Ok(()),
        Err(e) => Err(e),
    }
}

/// A request's body, or an error naming the URL (a 409 Conflict is [`Kind::AlreadySettled`]: what was
/// asked for exists already).
fn request(method: &str, url: &str) -> Result<String, Error> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .http_status_as_error(true)
        .build()
        .into();
    let response = match method {
        "PUT" => agent.put(url).send_empty(),
        _ => agent.get(url).call(),
    };
    response
        .and_then(|mut response| response.body_mut().read_to_string())
        .map_err(|e| {
            let kind = match e {
                ureq::Error::StatusCode(404) => Kind::NotFound,
                ureq::Error::StatusCode(409) => Kind::AlreadySettled,
                ureq::Error::StatusCode(401 | 403) => Kind::Config,
                ureq::Error::StatusCode(_) => Kind::Rejected,
                _ => Kind::Connection,
            };
            Error::from_source(kind, e).with_operation(format!("{method} {url}"))
        })
}
