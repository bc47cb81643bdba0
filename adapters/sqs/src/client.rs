//! From a URL to an SQS client: endpoint, region and credentials.
//!
//! * `sqs://` — AWS's own endpoint for the region in the `region` option (`?region=`), `AWS_REGION` or
//!   `AWS_DEFAULT_REGION`;
//! * `sqs://host:port`, `http://host:port` — an SQS-compatible endpoint (plain HTTP on loopback, HTTPS
//!   elsewhere with `sqs://`);
//! * `https://sqs.<region>.amazonaws.com/<account>/<queue>` — a queue URL: its endpoint and region.
//!
//! Credentials and region come from the AWS SDK's own chain (`aws-config`), as every AWS tool finds
//! them: the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_REGION`), the shared config and credentials files (`AWS_PROFILE` or the `profile` option,
//! `AWS_CONFIG_FILE`, `AWS_SHARED_CREDENTIALS_FILE`) with SSO and `credential_process` profiles, web
//! identity (`AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ROLE_ARN`), the container role (ECS, EKS pod identity)
//! and the instance role (IMDS). `key:secret@` in the URL (percent-encoded) overrides the chain. For a
//! loopback endpoint (a local emulator) the chain stops at the environment and the profile files, and
//! ends in placeholders (emulators accept any), so a laptop never waits on the instance-metadata
//! service; its region defaults to `us-east-1`.

use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::environment::{
    EnvironmentVariableCredentialsProvider, EnvironmentVariableRegionProvider,
};
use aws_config::meta::credentials::CredentialsProviderChain;
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::{ProfileFileCredentialsProvider, ProfileFileRegionProvider};
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use event_retry_core::error::{Error, Kind};
use event_retry_core::options::redact_url;

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
    let bad = |why: &str| {
        Error::new(
            Kind::Config,
            format!("SQS URL {:?}: {why}", redact_url(url)),
        )
    };
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

/// How the client finds its region and credentials beyond the URL: the options `region` and
/// `profile`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientSettings {
    /// The region, over the URL's and the chain's (option `region`).
    pub region: Option<String>,
    /// The shared-config profile to read, over `AWS_PROFILE` (option `profile`).
    pub profile: Option<String>,
}

/// The AWS configuration for `url` (endpoint, region and credentials from the URL, `settings` and the
/// AWS chain), which the SQS client and, with consumer groups through SNS, the SNS client are built from.
pub(crate) async fn sdk_config_for(
    url: &str,
    settings: &ClientSettings,
) -> Result<aws_config::SdkConfig, Error> {
    let target = parse(url)?;
    let shown = redact_url(url);
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if let Some(profile) = &settings.profile {
        loader = loader.profile_name(profile);
    }
    let region = settings.region.clone().or_else(|| target.region.clone());
    if let Some(region) = region {
        loader = loader.region(Region::new(region));
    } else if target.loopback {
        loader = loader.region(local_region(settings.profile.as_deref()));
    }
    if let Some((key, secret)) = &target.user {
        loader = loader.credentials_provider(Credentials::new(key, secret, None, None, "url"));
    } else if target.loopback {
        loader = loader.credentials_provider(local_credentials(settings.profile.as_deref()));
    } else {
        let mut chain = DefaultCredentialsChain::builder();
        if let Some(profile) = &settings.profile {
            chain = chain.profile_name(profile);
        }
        loader = loader.credentials_provider(chain.build().await);
    }
    if let Some(endpoint) = &target.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    let shared = loader.load().await;
    if shared.region().is_none() {
        return Err(Error::new(
            Kind::Config,
            format!(
                "SQS URL {shown:?}: no region (add ?region=, set AWS_REGION, or give the profile one)"
            ),
        ));
    }
    Ok(shared)
}

/// A local emulator's region: the environment's, the profile's, else `us-east-1`.
fn local_region(profile: Option<&str>) -> RegionProviderChain {
    let mut from_profile = ProfileFileRegionProvider::builder();
    if let Some(p) = profile {
        from_profile = from_profile.profile_name(p);
    }
    RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
        .or_else(from_profile.build())
        .or_else(Region::new("us-east-1"))
}

/// A local emulator's credentials: the environment's, the profile's, else placeholders.
fn local_credentials(profile: Option<&str>) -> CredentialsProviderChain {
    let mut from_profile = ProfileFileCredentialsProvider::builder();
    if let Some(p) = profile {
        from_profile = from_profile.profile_name(p);
    }
    CredentialsProviderChain::first_try(
        "Environment",
        EnvironmentVariableCredentialsProvider::new(),
    )
    .or_else("Profile", from_profile.build())
    .or_else(
        "Loopback",
        Credentials::new("local", "local", None, None, "loopback"),
    )
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
