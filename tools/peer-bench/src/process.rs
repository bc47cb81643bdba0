//! A consumer under test as a child process: started, read line by line until it reports done, its peak
//! RSS read from the kernel, then killed. Its other output goes to a log file for when a round fails.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::Error;
use crate::protocol::Line;

/// Which consumer a round runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// event-retry (this bench binary, run again as the consumer).
    Sdk,
    /// The Spring Boot app with `@RetryableTopic`.
    Spring,
}

impl Side {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Side::Sdk => "event-retry",
            Side::Spring => "spring-kafka",
        }
    }
}

/// What one consumer process reported in one round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Events that succeeded.
    pub events: u64,
    /// Milliseconds from its first record to its last success.
    pub millis: u64,
    /// Each retry's lateness in milliseconds.
    pub late_ms: Vec<i64>,
    /// The process's peak resident set, in KiB (`VmHWM`).
    pub peak_rss_kib: u64,
}

impl Outcome {
    /// Events per second from the first record to the last success.
    pub fn rate(&self) -> f64 {
        self.events as f64 / (self.millis.max(1) as f64 / 1000.0)
    }
}

/// Runs `command` until it prints `PEER done`, collecting its `PEER late` lines; fails if it exits
/// first or `deadline` passes. Its standard error and other output go to `log`.
pub async fn run(mut command: Command, log: &Path, deadline: Duration) -> Result<Outcome, Error> {
    let log_file = std::fs::File::create(log)?;
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let result = tokio::time::timeout(deadline, read_until_done(&mut child, log)).await;
    let peak = child
        .id()
        .map(|pid| test_support::child::status_kib(pid, "VmHWM"))
        .transpose();
    child.kill().await.ok();
    let mut outcome = match result {
        Ok(outcome) => outcome?,
        Err(_) => {
            return Err(format!(
                "no `PEER done` within {deadline:?} (log: {})",
                log.display()
            )
            .into());
        }
    };
    outcome.peak_rss_kib = peak?.unwrap_or(0);
    Ok(outcome)
}

async fn read_until_done(child: &mut Child, log: &Path) -> Result<Outcome, Error> {
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut outcome = Outcome::default();
    let mut other = std::fs::OpenOptions::new().append(true).open(log)?;
    while let Some(line) = lines.next_line().await? {
        match Line::parse(&line) {
            Some(Line::Late(ms)) => outcome.late_ms.push(ms),
            Some(Line::Done { events, millis }) => {
                outcome.events = events;
                outcome.millis = millis;
                return Ok(outcome);
            }
            None => {
                use std::io::Write;
                writeln!(other, "{line}")?;
            }
        }
    }
    let status = child.wait().await?;
    Err(format!(
        "the consumer exited ({status}) before reporting done (log: {})",
        log.display()
    )
    .into())
}

/// Where the round logs go (`target/peer-bench/` of the workspace, created).
pub fn log_dir() -> Result<PathBuf, Error> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/peer-bench");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_events_over_the_reported_time() {
        let o = Outcome {
            events: 100_000,
            millis: 500,
            ..Outcome::default()
        };
        assert_eq!(o.rate(), 200_000.0);
    }
}
