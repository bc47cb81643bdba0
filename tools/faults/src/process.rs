//! The consumer under test, in a process of its own (`faults consume`): started with the run's
//! settings, read until it says it started, stopped with SIGTERM or killed, and signalled. Kept apart
//! from the run so that what a fault does to the process is one place.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use raw_brokers::BoxError;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::netns::Namespace;
use crate::target::Target;

/// The pace of a run's handler.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    /// Work per event.
    pub(crate) work: Duration,
    /// How long a failing-once event waits before its retry.
    pub(crate) retry_after: Duration,
}

/// What a consumer process is started with.
pub(crate) struct Launch<'a> {
    /// The broker.
    pub(crate) target: &'a Target,
    /// The topic and the consumer group.
    pub(crate) topic: &'a str,
    /// The consumer group.
    pub(crate) group: &'a str,
    /// The record file the handler appends to.
    pub(crate) record: &'a Path,
    /// The inbox database, if the run has one.
    pub(crate) inbox: Option<&'a str>,
    /// The handler's pace.
    pub(crate) pace: Pace,
    /// The network namespace to run in (F4).
    pub(crate) namespace: Option<&'a Namespace>,
}

/// The consumer under test, in a process of its own.
pub(crate) struct Consumer {
    child: Child,
    pid: u32,
    /// The consumer's stdin: it exits when this closes, so a harness that dies (killed by an operator)
    /// leaves no consumer behind to write into the next run's record and inbox.
    _lifeline: tokio::process::ChildStdin,
}

impl Consumer {
    /// Starts `faults consume` as `launch` says (inside its network namespace, if any) and waits until
    /// its consumer started.
    pub(crate) async fn start(
        launch: Launch<'_>,
        log: &Path,
        hold: Option<usize>,
    ) -> Result<Self, BoxError> {
        let Launch {
            target,
            topic,
            group,
            record,
            inbox,
            pace,
            namespace,
        } = launch;
        let exe = std::env::current_exe()?;
        let mut command = match namespace {
            Some(_) => Namespace::exec(&exe),
            None => Command::new(&exe),
        };
        command
            .args(["consume", "--url", &target.url, "--topic", topic])
            .args(["--group", group, "--record"])
            .arg(record);
        if let Some(url) = inbox {
            command.args(["--inbox", url]);
        }
        command
            .args(["--work-ms", &pace.work.as_millis().to_string()])
            .args([
                "--retry-after-ms",
                &pace.retry_after.as_millis().to_string(),
            ]);
        for (k, v) in &target.options {
            command.args(["--option", &format!("{k}={v}")]);
        }
        if let Some(n) = hold {
            command.args(["--hold-after-commits", &n.to_string()]);
        }
        command.arg("--exit-with-stdin");
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().ok_or("the consumer exited at once")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let started = tokio::time::timeout(Duration::from_secs(120), async {
            while let Some(line) = lines.next_line().await? {
                if line.starts_with("consumer started") {
                    return Ok::<bool, std::io::Error>(true);
                }
            }
            Ok(false)
        })
        .await;
        if !matches!(started, Ok(Ok(true))) {
            // Its output ended (rather than the wait): it is exiting, and its status says how.
            let how = match started {
                Err(_) => "the consumer did not start within 120 s".to_string(),
                Ok(_) => match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
                    Ok(Ok(status)) => format!("the consumer exited ({status}) before it started"),
                    _ => "the consumer closed its output before it started".to_string(),
                },
            };
            let _ = child.start_kill();
            // The report's row holds one line; the log's tail goes to the run's output, which a CI
            // run keeps after its clone (and the log file) is gone.
            eprintln!(
                "   {}: {how}; the end of its log:{}",
                target.name,
                log_tail(log, 20)
            );
            return Err(format!("{how} (its log: {})", log.display()).into());
        }
        // Keep reading its output, so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let lifeline = child.stdin.take().ok_or("no stdin")?;
        Ok(Self {
            child,
            pid,
            _lifeline: lifeline,
        })
    }

    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub(crate) async fn kill(&mut self) -> Result<(), BoxError> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// SIGTERM, then waits up to a minute for a clean exit; `true` if it exited cleanly.
    pub(crate) async fn stop(&mut self) -> bool {
        if signal(self.pid, "TERM").await.is_err() {
            return false;
        }
        match tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => {
                let _ = self.child.start_kill();
                false
            }
        }
    }
}

/// The last `lines` lines of the log at `path`, each on a line of its own and indented.
fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let all: Vec<&str> = text.lines().collect();
    let tail = &all[all.len().saturating_sub(lines)..];
    if tail.is_empty() {
        return " (empty)".to_string();
    }
    let mut out = String::new();
    for line in tail {
        out.push_str("\n      ");
        out.push_str(line);
    }
    out
}

/// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`) to `pid`.
pub(crate) async fn signal(pid: u32, signal: &str) -> Result<(), BoxError> {
    let status = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status()
        .await?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -s {signal} {pid} failed").into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_tail_keeps_the_last_lines_in_order() -> Result<(), BoxError> {
        let dir = std::env::temp_dir().join(format!("faults-log-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("consumer.log");
        std::fs::write(&path, "one\ntwo\nthree\n")?;
        assert_eq!(log_tail(&path, 2), "\n      two\n      three");
        std::fs::write(&path, "")?;
        assert_eq!(log_tail(&path, 2), " (empty)");
        assert_eq!(log_tail(&dir.join("missing.log"), 2), "");
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
