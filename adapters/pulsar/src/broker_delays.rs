//! The broker's own delayed-delivery settings, read from its admin REST API.
//!
//! How a Pulsar broker honours `deliverAt` is its configuration: whether delayed delivery is on, the tick
//! it dispatches on, whether it may dispatch a tick early, and the longest delay it accepts — each set for
//! the broker (`broker.conf`) and overridable per namespace. A consumer must check its retry policy
//! against the settings that really apply, not against what the service was told, so when the admin URL
//! is known the adapter reads them: the broker's runtime configuration, then the namespace's policy.

use std::time::Duration;

use event_retry_core::error::{Error, Kind};

use crate::admin_api::get;
use crate::config::PulsarConfig;

/// Reads the delayed-delivery settings that apply to `config.namespace` from the admin API at
/// `config.admin_url` and writes them into `config` (nothing is read without an admin URL).
pub(crate) async fn apply(config: &mut PulsarConfig) -> Result<(), Error> {
    let Some(admin) = config.admin_url.clone() else {
        return Ok(());
    };
    let namespace = config.namespace.clone();
    let security = config.security.clone();
    let (broker, policy) = tokio::task::spawn_blocking(move || {
        let broker = get(
            &format!("{admin}/admin/v2/brokers/configuration/runtime"),
            &security,
        )?;
        let policy = get(
            &format!("{admin}/admin/v2/namespaces/{namespace}/delayedDelivery"),
            &security,
        )?;
        Ok::<_, Error>((broker, policy))
    })
    .await
    .map_err(|e| {
        Error::from_source(Kind::Other, e).with_operation("read the broker's settings")
    })??;
    merge(config, &broker, &policy)
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
