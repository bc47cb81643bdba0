//! From a URL to an SQS client: endpoint, region and credentials.
//!
//! * `sqs://` — AWS's own endpoint for the region in the `region` option (`?region=`), `AWS_REGION` or
//!   `AWS_DEFAULT_REGION`;
//! * `sqs://host:port`, `http://host:port` — an SQS-compatible endpoint (plain HTTP on loopback, HTTPS
//!   elsewhere with `sqs://`);
//! * `https://sqs.<region>.amazonaws.com/<account>/<queue>` — a queue URL: its endpoint and region.
//!
//! Credentials: `key:secret@` in the URL (percent-encoded), else `AWS_ACCESS_KEY_ID` /
//! `AWS_SECRET_ACCESS_KEY` (/ `AWS_SESSION_TOKEN`), else, for a loopback endpoint, placeholders (local
//! emulators accept any). The rest of the AWS credential chain (profiles, SSO, instance roles) comes with
//! a client built by `aws-config`, passed to `SqsTransport::from_client`.

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use retry_core::error::{Error, Kind};

/// What a URL says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) endpoint: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) user: Option<(String, String)>,
    pub(crate) loopback: bool,
}

fn percent_decode(s: &str) -> Result<String, Error> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    Error::new(Kind::Config, format!("bad percent-encoding in {s:?}"))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| Error::new(Kind::Config, "credentials are not UTF-8".to_string()))
}

pub(crate) fn parse(url: &str) -> Result<Target, Error> {
    let bad = |why: &str| Error::new(Kind::Config, format!("SQS URL {url:?}: {why}"));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("expected scheme://"))?;
    let scheme = scheme.to_ascii_lowercase();
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, _path) = rest.split_once('/').unwrap_or((rest, ""));
    let (user, host) = match authority.rsplit_once('@') {
        Some((user, host)) => {
            let (k, s) = user
                .split_once(':')
                .ok_or_else(|| bad("credentials must be key:secret@"))?;
            (Some((percent_decode(k)?, percent_decode(s)?)), host)
        }
        None => (None, authority),
    };
    let mut region = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "region")
        .map(|(_, v)| v.to_string());
    let hostname = host
        .rsplit_once(':')
        .map_or(host, |(h, _)| h)
        .trim_matches(['[', ']']);
    let loopback = matches!(hostname, "127.0.0.1" | "localhost" | "::1");
    let endpoint = match scheme.as_str() {
        "sqs" if host.is_empty() => None,
        "sqs" if loopback => Some(format!("http://{host}")),
        "sqs" => Some(format!("https://{host}")),
        "http" | "https" => {
            if region.is_none()
                && let Some(r) = hostname
                    .strip_prefix("sqs.")
                    .and_then(|h| h.split('.').next())
                && hostname.ends_with(".amazonaws.com")
            {
                region = Some(r.to_string());
            }
            Some(format!("{scheme}://{host}"))
        }
        _ => return Err(bad("expected sqs://, http:// or https://")),
    };
    if scheme == "http" && !loopback {
        return Err(bad("plain http is only for a loopback endpoint; use https"));
    }
    Ok(Target {
        endpoint,
        region,
        user,
        loopback,
    })
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A client for `url`; `region` (the `region` option) overrides the URL's and the environment's.
pub(crate) fn client_for(url: &str, region: Option<String>) -> Result<Client, Error> {
    let target = parse(url)?;
    let region = region
        .or_else(|| target.region.clone())
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .or_else(|| target.loopback.then(|| "us-east-1".to_string()))
        .ok_or_else(|| {
            Error::new(
                Kind::Config,
                format!("SQS URL {url:?}: no region (add ?region= or set AWS_REGION)"),
            )
        })?;
    let credentials = match (
        &target.user,
        env("AWS_ACCESS_KEY_ID"),
        env("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Some((k, s)), _, _) => Credentials::new(k, s, None, None, "url"),
        (None, Some(k), Some(s)) => {
            Credentials::new(k, s, env("AWS_SESSION_TOKEN"), None, "environment")
        }
        (None, _, _) if target.loopback => {
            Credentials::new("local", "local", None, None, "loopback")
        }
        _ => {
            return Err(Error::new(
                Kind::Config,
                format!(
                    "SQS URL {url:?}: no credentials (key:secret@ in the URL, AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY, or a client from aws-config through SqsTransport::from_client)"
                ),
            ));
        }
    };
    let mut builder = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region))
        .credentials_provider(credentials);
    if let Some(endpoint) = target.endpoint {
        builder = builder.endpoint_url(endpoint);
    }
    Ok(Client::from_conf(builder.build()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        let local = parse("http://127.0.0.1:9324").unwrap();
        assert_eq!(local.endpoint.as_deref(), Some("http://127.0.0.1:9324"));
        assert!(local.loopback && local.user.is_none());
        let with_user = parse("sqs://AK:se%2Fcret@localhost:9324?region=eu-west-1").unwrap();
        assert_eq!(with_user.endpoint.as_deref(), Some("http://localhost:9324"));
        assert_eq!(with_user.user, Some(("AK".into(), "se/cret".into())));
        assert_eq!(with_user.region.as_deref(), Some("eu-west-1"));
        let queue = parse("https://sqs.eu-central-1.amazonaws.com/123456789012/orders").unwrap();
        assert_eq!(
            queue.endpoint.as_deref(),
            Some("https://sqs.eu-central-1.amazonaws.com")
        );
        assert_eq!(queue.region.as_deref(), Some("eu-central-1"));
        let aws = parse("sqs://?region=us-west-2").unwrap();
        assert_eq!(aws.endpoint, None);
        assert!(
            parse("http://example.com:9324").is_err(),
            "plain http off loopback"
        );
        assert!(parse("kafka://x").is_err());
    }
}
