//! Stalling a broker started by `scripts/brokers`: SIGSTOP on its server process, SIGCONT when the
//! stall ends or is dropped. Every client sees the broker stop answering while its connections stay
//! open, as a long garbage-collection pause or a frozen machine looks from outside.

use std::path::{Path, PathBuf};

/// A broker's server process, stopped until [`Stall::resume`] or the drop.
#[derive(Debug)]
pub struct Stall {
    pid: i32,
    stopped: bool,
}

/// The workspace root (where `target/brokers/` lives).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Stall {
    /// Stops the broker whose pid `scripts/brokers` wrote to `target/brokers/<name>/<pid_file>`
    /// (`kafka`/`pid`, `rabbitmq`/`server.pid`).
    pub fn start(name: &str, pid_file: &str) -> Result<Self, String> {
        let file = root().join("target/brokers").join(name).join(pid_file);
        let pid: i32 = std::fs::read_to_string(&file)
            .map_err(|e| {
                format!(
                    "{}: {e} (the broker must be started by scripts/brokers)",
                    file.display()
                )
            })?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", file.display()))?;
        signal(pid, "STOP")?;
        Ok(Self { pid, stopped: true })
    }

    /// Lets the broker run again.
    pub fn resume(&mut self) -> Result<(), String> {
        if self.stopped {
            signal(self.pid, "CONT")?;
            self.stopped = false;
        }
        Ok(())
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        let _ = self.resume();
    }
}

fn signal(pid: i32, name: &str) -> Result<(), String> {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{name} {pid} failed"))
    }
}
