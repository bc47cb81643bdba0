//! The SDK's metrics for Prometheus (feature `prometheus`): an exporter whose histograms have buckets
//! fit for what they measure, so a dashboard can take quantiles of them across instances.
//!
//! Retry lateness is most of the time a few milliseconds and, when a delay mechanism misbehaves, seconds
//! or minutes; handler time is milliseconds to seconds. Without buckets the exporter would publish
//! summaries, whose quantiles cannot be added up across consumers.
//!
//! ```no_run
//! # fn demo() -> Result<(), event_retry::Error> {
//! // Scrape http://127.0.0.1:9464/metrics; the dashboard is docs/grafana/event-retry.json.
//! event_retry::prometheus::serve("127.0.0.1:9464".parse().expect("an address"))?;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;

use event_retry_core::error::{Error, Kind};
use event_retry_core::telemetry;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// Buckets of retry lateness, in seconds: from 5 ms to 10 minutes.
pub const LATENESS_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 180.0, 600.0,
];
/// Buckets of handler time, in seconds: from 1 ms to 1 minute.
pub const HANDLER_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 60.0,
];

/// A Prometheus exporter with the SDK's buckets; add a listener, or install it as a recorder.
pub fn builder() -> PrometheusBuilder {
    let with_buckets = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(telemetry::LATENESS_SECONDS.to_string()),
            &LATENESS_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(telemetry::HANDLER_SECONDS.to_string()),
                &HANDLER_BUCKETS,
            )
        });
    // Setting buckets fails only for an empty list; these are constants.
    with_buckets.unwrap_or_else(|_| PrometheusBuilder::new())
}

/// Installs the exporter as the process's metrics recorder and serves it on `addr` (any path answers,
/// `/metrics` included). Call it once, inside a Tokio runtime.
pub fn serve(addr: SocketAddr) -> Result<(), Error> {
    builder().with_http_listener(addr).install().map_err(|e| {
        Error::from_source(Kind::Config, e).with_operation(format!("serve metrics on {addr}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_rise() {
        assert!(LATENESS_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        assert!(HANDLER_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}
