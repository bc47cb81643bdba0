//! `retryctl policy explain`: a policy's schedule — attempt, delay, cumulative time — and, given a
//! broker, how that broker honours each delay, so a policy a broker cannot honour is seen before a
//! consumer refuses to start with it.

use std::io::Write;
use std::time::Duration;

use clap::Subcommand;
use event_retry::Broker;
use event_retry_core::adapter::Honour;
use event_retry_core::check::DelayReport;
use event_retry_core::policy::RetryPolicy;

use crate::{CliError, render};

/// `retryctl policy …`
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Prints the schedule of a policy: attempt, delay before it, cumulative time.
    Explain {
        /// The policy, e.g. '5000x3,10000x5' or 'exp(500ms, 1m, 2, 6); jitter=full'.
        policy: String,
        /// A broker URL: also show how that broker honours each delay.
        #[arg(long)]
        broker: Option<String>,
        /// At most this many retries (for unlimited policies).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// One JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// Writes the schedule table of `policy` (and how `broker` honours each delay).
pub fn explain(
    policy: &str,
    broker: Option<&Broker>,
    limit: u32,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let policy = RetryPolicy::parse(policy).map_err(|e| CliError::Policy(e.render()))?;
    let rows = policy.explain(limit);
    let attempts = policy
        .max_attempts()
        .map_or("unlimited".to_string(), |n| n.to_string());
    writeln!(out, "policy: {policy}")?;
    writeln!(out, "attempts: {attempts}")?;
    let capability = broker.map(|b| (b.name(), b.capabilities().delay));
    let header = capability.map_or(String::new(), |(name, _)| format!("  {name}"));
    writeln!(
        out,
        "{:>7}  {:>10}  {:>12}{header}",
        "attempt", "delay", "cumulative"
    )?;
    writeln!(out, "{:>7}  {:>10}  {:>12}", 1, "-", "0s")?;
    for row in &rows {
        let honour = capability.map_or(String::new(), |(_, cap)| match cap.honour(row.delay) {
            Honour::Exact => "  exact".to_string(),
            other => format!("  {other}"),
        });
        writeln!(
            out,
            "{:>7}  {:>10}  {:>12}{honour}",
            row.attempt,
            render::duration(row.delay),
            render::duration(row.cumulative)
        )?;
    }
    if policy.max_retries().is_none_or(|max| max > limit) {
        writeln!(out, "   ...  (showing the first {limit} retries)")?;
    }
    if let Some(budget) = policy.max_elapsed() {
        writeln!(
            out,
            "budget: retries stop once {} have passed since the first attempt",
            render::duration(budget)
        )?;
    }
    let bound = policy.chosen_delay(Duration::MAX);
    let stated = if policy.max_chosen_delay().is_some() {
        "max-delay"
    } else {
        "the longest delay; max-delay= sets another"
    };
    let honour = capability.map_or(String::new(), |(name, cap)| {
        format!(", which {name} honours: {}", cap.honour(bound))
    });
    writeln!(
        out,
        "chosen delay: a handler's retry_after waits at most {} ({stated}){honour}",
        render::duration(bound)
    )?;
    if let Some((name, cap)) = capability {
        let report = DelayReport::new(&policy, &cap);
        if !report.is_ok() {
            writeln!(
                out,
                "\nthe {name} transport refuses this policy; a consumer with it will not start:\n{report}"
            )?;
        }
    }
    Ok(())
}

/// `policy explain --json`: the policy, its attempts, and per retry the delay and cumulative time in
/// milliseconds (and how the broker honours it).
pub fn explain_json(
    policy: &str,
    broker: Option<&Broker>,
    limit: u32,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let policy = RetryPolicy::parse(policy).map_err(|e| CliError::Policy(e.render()))?;
    let capability = broker.map(|b| (b.name(), b.capabilities().delay));
    let rows: Vec<serde_json::Value> = policy
        .explain(limit)
        .iter()
        .map(|row| {
            serde_json::json!({
                "attempt": row.attempt,
                "delay_ms": row.delay.as_millis() as u64,
                "cumulative_ms": row.cumulative.as_millis() as u64,
                "delay": render::duration(row.delay),
                "cumulative": render::duration(row.cumulative),
                "broker": capability.map(|(_, cap)| match cap.honour(row.delay) {
                    Honour::Exact => "exact".to_string(),
                    other => other.to_string(),
                }),
            })
        })
        .collect();
    let refused = capability.and_then(|(_, cap)| {
        let report = DelayReport::new(&policy, &cap);
        (!report.is_ok()).then(|| report.to_string())
    });
    let doc = serde_json::json!({
        "policy": policy.to_string(),
        "max_attempts": policy.max_attempts(),
        "broker": capability.map(|(name, _)| name),
        "retries": rows,
        "truncated": policy.max_retries().is_none_or(|max| max > limit),
        "budget_ms": policy.max_elapsed().map(|d| d.as_millis() as u64),
        "max_delay_ms": policy.max_chosen_delay().map(|d| d.as_millis() as u64),
        "chosen_delay_bound_ms": policy.chosen_delay(Duration::MAX).as_millis() as u64,
        "refused": refused,
    });
    writeln!(
        out,
        "{}",
        serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?
    )?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn text(f: impl FnOnce(&mut Vec<u8>) -> Result<(), CliError>) -> Result<String, CliError> {
        let mut out = Vec::new();
        f(&mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn explain_prints_nine_attempts_for_the_classic_policy() {
        let out = text(|o| explain("5000x3,10000x5", None, 20, o)).unwrap();
        assert!(out.contains("attempts: 9"), "{out}");
        let rows: Vec<_> = out
            .lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .collect();
        assert_eq!(rows.len(), 9, "{out}");
        assert!(
            rows[8].contains("10s") && rows[8].contains("1m 5s"),
            "{out}"
        );
    }

    #[test]
    fn explain_points_at_the_column_of_a_parse_error() {
        let err = text(|o| explain("5000x", None, 20, o)).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let msg = err.to_string();
        assert!(msg.contains("column 6") && msg.contains('^'), "{msg}");
    }

    #[test]
    fn explain_with_a_broker_shows_how_it_honours_delays() {
        let memory = Broker::memory();
        let out = text(|o| explain("exp(1s, 8s, 2)", Some(&memory), 5, o)).unwrap();
        assert!(
            out.contains("memory") && out.contains("exact") && out.contains("first 5 retries"),
            "{out}"
        );
    }

    #[test]
    fn explain_shows_the_bound_on_a_chosen_delay() {
        let out = text(|o| explain("1s x3; max-delay=5m", None, 20, o)).unwrap();
        assert!(
            out.contains("policy: 1s x3; max-delay=5m")
                && out.contains("retry_after waits at most 5m (max-delay)"),
            "{out}"
        );
        let out = text(|o| explain("1s x3, 10s", None, 20, o)).unwrap();
        assert!(out.contains("at most 10s (the longest delay"), "{out}");
        let json = text(|o| explain_json("1s x3; max-delay=5m", None, 20, o)).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(doc["max_delay_ms"], 300_000);
        assert_eq!(doc["chosen_delay_bound_ms"], 300_000);
    }

    #[test]
    fn explain_speaks_in_human_durations_and_json() {
        let out = text(|o| explain("exp(1s, 1h, 2, 14)", None, 20, o)).unwrap();
        assert!(out.contains("34m 7s") || out.contains("1h 8m"), "{out}");
        assert!(!out.contains("2047s"), "{out}");
        let json = text(|o| explain_json("5000x3,10000x5", None, 20, o)).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(doc["max_attempts"], 9);
        assert_eq!(doc["retries"].as_array().unwrap().len(), 8);
        assert_eq!(doc["retries"][7]["cumulative_ms"], 65_000);
        assert_eq!(doc["retries"][7]["cumulative"], "1m 5s");
    }
}
