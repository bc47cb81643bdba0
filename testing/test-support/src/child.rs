//! A bench binary's helper process: the same binary run again with one part named (for example
//! `backlog-consumer`), so a consumer under measurement has a process, a resident set and a CPU share
//! of its own. Its standard output comes back line by line; its standard error goes to a log file.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::sync::mpsc;

use crate::bench::Error;

/// A running helper process and the lines it prints.
pub struct Helper {
    /// The process (killed when dropped).
    pub child: Child,
    /// Its pid.
    pub pid: u32,
    /// Its standard output, line by line (closed when it exits).
    pub lines: mpsc::UnboundedReceiver<String>,
    /// Where its standard error goes.
    pub log: PathBuf,
}

impl Helper {
    /// Writes one line to its standard input (when started with [`spawn_with_input`]).
    pub async fn tell(&mut self, line: &str) -> Result<(), Error> {
        use tokio::io::AsyncWriteExt;
        let stdin = self.child.stdin.as_mut().ok_or("the helper has no stdin")?;
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }
}

/// Starts this binary again with `part` as its only argument and `env` added to its environment.
pub fn spawn(part: &str, env: &[(&str, String)], log: &Path) -> Result<Helper, Error> {
    start(part, env, log, Stdio::null())
}

/// As [`spawn`], with its standard input open for [`Helper::tell`].
pub fn spawn_with_input(part: &str, env: &[(&str, String)], log: &Path) -> Result<Helper, Error> {
    start(part, env, log, Stdio::piped())
}

fn start(part: &str, env: &[(&str, String)], log: &Path, stdin: Stdio) -> Result<Helper, Error> {
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .arg(part)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log)?)
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().ok_or("the helper process has no pid")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, lines) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(Helper {
        child,
        pid,
        lines,
        log: log.to_path_buf(),
    })
}

/// `target/bench/<name>` in the workspace (the folder created).
pub fn log_path(name: &str) -> Result<PathBuf, Error> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/bench");
    std::fs::create_dir_all(&dir)?;
    Ok(dir.join(name))
}

/// The resident set of a live process, in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> Result<u64, Error> {
    status_kib(pid, "VmRSS")
}

/// A size field of a live process's `/proc/PID/status` (`VmRSS`, `VmHWM`, …), in KiB.
pub fn status_kib(pid: u32, field: &str) -> Result<u64, Error> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_status_kib(&status, field).ok_or_else(|| format!("no {field} for pid {pid}").into())
}

fn parse_status_kib(status: &str, field: &str) -> Option<u64> {
    proc_field(status, field)?
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// The value of a `name: value` line of a `/proc` file (`status`, `io`), trimmed.
pub(crate) fn proc_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_resident_set_and_fields_are_read_by_name() {
        assert!(rss_kib(std::process::id()).expect("own status") > 0);
        assert!(status_kib(std::process::id(), "VmHWM").expect("own peak") > 0);
        let status = "Name:\tjava\nVmPeak:\t 9000 kB\nVmHWM:\t  330752 kB\nVmRSS:\t 1 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(330_752));
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(1));
        assert_eq!(parse_status_kib("VmRSS:\t1 kB\n", "VmHWM"), None);
    }
}
