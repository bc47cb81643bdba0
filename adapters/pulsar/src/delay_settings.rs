//! The broker's own delayed-delivery settings, read from its admin REST API when the transport
//! connects, so that retry policies are checked against what the broker will really do.
//!
//! How a Pulsar broker honours `deliverAt` is its configuration: whether delayed delivery is on, the tick
//! it dispatches on, whether it may dispatch a tick early, and the longest delay it accepts — each set for
//! the broker (`broker.conf`) and overridable per namespace. A consumer must check its retry policy
//! against the settings that really apply, not against what the service was told, so the adapter reads
//! them: the broker's runtime configuration, then the namespace's policy. Without an `admin_url` it asks
//! the admin API a bare service URL implies (the same host on Pulsar's web port, 8080, or 8443 over TLS);
//! where nothing answers there within [`IMPLIED_ADMIN_TIMEOUT`], it keeps the conservative assumption (a
//! 1 s tick that may dispatch a tick early), which costs every retry up to about a second.

use std::time::Duration;

use event_retry_core::error::{Error, Kind};

use crate::admin::rest::{get, get_within};
use crate::config::PulsarConfig;

/// How long the admin API a bare service URL implies is given to answer before the adapter keeps its
/// conservative assumption.
pub(crate) const IMPLIED_ADMIN_TIMEOUT: Duration = Duration::from_secs(3);

/// Reads the delayed-delivery settings that apply to `config.namespace` and writes them into `config`:
/// from the admin API at `config.admin_url` (an error if it does not answer), or else from the one
/// `service_url` implies (nothing changes if that one does not answer).
pub(crate) async fn apply(config: &mut PulsarConfig, service_url: &str) -> Result<(), Error> {
    let (admin, implied) = match config.admin_url.clone() {
        Some(admin) => (admin, false),
        None => match implied_admin_url(service_url) {
            Some(admin) => (admin, true),
            None => return Ok(()),
        },
    };
    let namespace = config.namespace.clone();
    let security = config.security.clone();
    let url = admin.clone();
    let read = tokio::task::spawn_blocking(move || {
        let get = |path: &str| {
            if implied {
                get_within(&format!("{url}{path}"), &security, IMPLIED_ADMIN_TIMEOUT)
            } else {
                get(&format!("{url}{path}"), &security)
            }
        };
        let broker = get("/admin/v2/brokers/configuration/runtime")?;
        let policy = get(&format!("/admin/v2/namespaces/{namespace}/delayedDelivery"))?;
        Ok::<_, Error>((broker, policy))
    })
    .await
    .map_err(|e| Error::from_source(Kind::Other, e).with_operation("read the broker's settings"))?;
    match read {
        Ok((broker, policy)) => merge(config, &broker, &policy),
        Err(e) if implied => {
            tracing::warn!(
                admin = %admin,
                error = %e,
                tick = ?config.tick,
                strict = config.strict_deliver_at,
                "the broker's delayed-delivery settings could not be read (set admin_url): assuming \
                 the tick above, which makes every retry up to a tick late"
            );
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The admin URL a service URL implies: its first host on Pulsar's default web port — `http://host:8080`
/// for `pulsar://`, `https://host:8443` for `pulsar+ssl://`; `None` for anything else.
pub(crate) fn implied_admin_url(service_url: &str) -> Option<String> {
    let (scheme, rest) = service_url.split_once("://")?;
    let (web, port) = match scheme {
        "pulsar" => ("http", 8080),
        "pulsar+ssl" => ("https", 8443),
        _ => return None,
    };
    let first = rest.split([',', '/', '?']).next()?;
    // The host: without its port (an IPv6 literal keeps its brackets).
    let host = match first.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => first,
    };
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    (!host.is_empty()).then(|| format!("{web}://{host}:{port}"))
}

/// Applies the broker's runtime configuration (`broker`, a JSON object of strings) and the namespace's
/// delayed-delivery policy (`policy`, a JSON object, or empty when the namespace has none).
fn merge(config: &mut PulsarConfig, broker: &str, policy: &str) -> Result<(), Error> {
    let bad = |what: &str, e: serde_json::Error| {
        Error::from_source(Kind::Other, e).with_operation(format!("read the {what}"))
    };
    let broker: serde_json::Value =
        serde_json::from_str(broker).map_err(|e| bad("broker's configuration", e))?;
    let setting = |name: &str| broker[name].as_str().map(str::to_string);
    if let Some(on) = setting("delayedDeliveryEnabled") {
        config.delayed_delivery = on == "true";
    }
    if let Some(tick) = setting("delayedDeliveryTickTimeMillis").and_then(|t| t.parse().ok()) {
        config.tick = Duration::from_millis(tick);
    }
    if let Some(strict) = setting("isDelayedDeliveryDeliverAtTimeStrict") {
        config.strict_deliver_at = strict == "true";
    }
    if let Some(max) = setting("delayedDeliveryMaxDelayInMillis").and_then(|t| t.parse().ok()) {
        set_max(config, max);
    }
    if !policy.trim().is_empty() {
        let policy: serde_json::Value = serde_json::from_str(policy)
            .map_err(|e| bad("namespace's delayed-delivery policy", e))?;
        if let Some(active) = policy["active"].as_bool() {
            config.delayed_delivery = active;
        }
        if let Some(tick) = policy["tickTime"].as_u64().filter(|t| *t > 0) {
            config.tick = Duration::from_millis(tick);
        }
        if let Some(max) = policy["maxDeliveryDelayInMillis"].as_i64() {
            set_max(config, max);
        }
    }
    Ok(())
}

/// A broker limit of `ms` (0 or less: none); a limit set by hand that is shorter stays.
fn set_max(config: &mut PulsarConfig, ms: i64) {
    let Ok(ms) = u64::try_from(ms) else { return };
    if ms == 0 {
        return;
    }
    let broker = Duration::from_millis(ms);
    config.max_delay = Some(config.max_delay.map_or(broker, |own| own.min(broker)));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_service_url_implies_its_hosts_admin_api() {
        let cases = [
            ("pulsar://127.0.0.1:6650", Some("http://127.0.0.1:8080")),
            (
                "pulsar://broker.internal:6650,b2:6650",
                Some("http://broker.internal:8080"),
            ),
            ("pulsar+ssl://broker:6651/?x=1", Some("https://broker:8443")),
            ("pulsar://broker", Some("http://broker:8080")),
            ("pulsar://[::1]:6650", Some("http://[::1]:8080")),
            ("pulsar://", None),
            ("http://broker:8080", None),
            ("broker:6650", None),
        ];
        for (service, want) in cases {
            assert_eq!(implied_admin_url(service).as_deref(), want, "{service}");
        }
    }

    #[test]
    fn the_namespace_policy_overrides_the_broker() {
        let mut c = PulsarConfig::default();
        let broker = r#"{"delayedDeliveryEnabled":"true","delayedDeliveryTickTimeMillis":"100",
            "isDelayedDeliveryDeliverAtTimeStrict":"true","delayedDeliveryMaxDelayInMillis":"0"}"#;
        merge(&mut c, broker, "").unwrap();
        assert_eq!(
            (c.delayed_delivery, c.tick, c.strict_deliver_at, c.max_delay),
            (true, Duration::from_millis(100), true, None)
        );
        merge(
            &mut c,
            broker,
            r#"{"active":true,"tickTime":250,"maxDeliveryDelayInMillis":60000}"#,
        )
        .unwrap();
        assert_eq!(
            (c.tick, c.max_delay),
            (Duration::from_millis(250), Some(Duration::from_secs(60)))
        );
        merge(&mut c, broker, r#"{"active":false}"#).unwrap();
        assert_eq!(c.delay_capability().max_native, Some(Duration::ZERO));
        assert!(merge(&mut c, "not json", "").is_err());
    }

    #[test]
    fn a_shorter_limit_set_by_hand_stays() {
        let mut c = PulsarConfig {
            max_delay: Some(Duration::from_secs(10)),
            ..PulsarConfig::default()
        };
        set_max(&mut c, 60_000);
        assert_eq!(c.max_delay, Some(Duration::from_secs(10)));
    }
}
