//! A round's clock: its rates from the consumer's start and from its first message, the CPU each message
//! cost (from `/proc`), and a countdown to the round's last handler call.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use event_retry_core::runtime::ConsumerHandle;

use super::Error;

/// A round's rate measured two ways: from the consumer's start (joining the group, declaring its
/// topics, the first fetch) and from its first message (the steady state).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Messages per second from the consumer's start to the last message.
    pub whole: f64,
    /// Messages per second from the first message to the last.
    pub steady: f64,
    /// From the consumer's start to its first message: joining the group, finding where to start and
    /// the first fetch (a large share of a short round's time).
    pub start_up: Duration,
    /// The CPU time each message cost over the round, where `/proc` tells it (Linux).
    pub cpu: Option<CpuPerMessage>,
}

/// CPU time per message over a round: the bench process's own (the consumer: raw client or SDK) and the
/// rest of the machine's (the broker, and anything else running) — where a round's time went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuPerMessage {
    /// This process's user + system time per message.
    pub process: Duration,
    /// Every other process's busy time per message (the machine's minus this process's).
    pub rest: Duration,
    /// This process's read and write system calls per message (sockets included), from
    /// `/proc/self/io`: how many round trips and writes the client made of the work.
    pub syscalls: (f64, f64),
}

/// CPU time used so far, in `/proc`'s clock ticks (USER_HZ, 100 per second on Linux).
#[derive(Debug, Clone, Copy)]
struct CpuTicks {
    process: u64,
    machine: u64,
    /// Read and write system calls so far (`syscr`, `syscw`).
    syscalls: (u64, u64),
}

/// `/proc`'s clock tick (USER_HZ is 100 on every Linux architecture).
const TICK: Duration = Duration::from_millis(10);

impl CpuTicks {
    /// Reads this process's and the whole machine's busy ticks; `None` without `/proc`.
    fn now() -> Option<CpuTicks> {
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        let machine = std::fs::read_to_string("/proc/stat").ok()?;
        let io = std::fs::read_to_string("/proc/self/io").ok()?;
        Some(CpuTicks {
            process: process_ticks(&own)?,
            machine: machine_busy_ticks(&machine)?,
            syscalls: (io_field(&io, "syscr")?, io_field(&io, "syscw")?),
        })
    }
}

/// utime + stime of a `/proc/<pid>/stat` line (fields 14 and 15; the command name before them, in
/// parentheses, may hold spaces).
fn process_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// One counter of `/proc/<pid>/io`.
fn io_field(io: &str, name: &str) -> Option<u64> {
    crate::child::proc_field(io, name)?.parse().ok()
}

/// The busy ticks of `/proc/stat`'s `cpu` line: user, nice, system, irq, softirq, steal (not idle or
/// iowait; guest time is already inside user).
fn machine_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    Some(at(0) + at(1) + at(2) + at(5) + at(6) + at(7))
}

pub(super) fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `d` in milliseconds, for a report.
pub(super) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Times one consumer: started when made, marked at its first message.
#[derive(Debug)]
pub struct Clock {
    started: Instant,
    first: std::sync::OnceLock<Instant>,
    cpu_at_start: Option<CpuTicks>,
}

impl Clock {
    /// Starts the clock (just before the consumer is made).
    pub fn start() -> Clock {
        Clock {
            started: Instant::now(),
            first: std::sync::OnceLock::new(),
            cpu_at_start: CpuTicks::now(),
        }
    }

    /// Marks a message in hand (only the first counts).
    pub fn message(&self) {
        self.first.get_or_init(Instant::now);
    }

    /// The rates for `messages` messages, now that the last one is done.
    pub fn rate(&self, messages: usize) -> Rate {
        let per_second = |since: Instant| messages as f64 / since.elapsed().as_secs_f64().max(1e-9);
        let cpu = self.cpu_at_start.zip(CpuTicks::now()).map(|(start, end)| {
            let per_message = |ticks: u64| {
                TICK * u32::try_from(ticks).unwrap_or(u32::MAX) / messages.max(1) as u32
            };
            let process = end.process.saturating_sub(start.process);
            let machine = end.machine.saturating_sub(start.machine);
            let calls =
                |end: u64, start: u64| end.saturating_sub(start) as f64 / messages.max(1) as f64;
            CpuPerMessage {
                process: per_message(process),
                rest: per_message(machine.saturating_sub(process)),
                syscalls: (
                    calls(end.syscalls.0, start.syscalls.0),
                    calls(end.syscalls.1, start.syscalls.1),
                ),
            }
        });
        let first = *self.first.get().unwrap_or(&self.started);
        Rate {
            whole: per_second(self.started),
            steady: per_second(first),
            start_up: first.duration_since(self.started),
            cpu,
        }
    }
}

/// Counts a bench's handler calls and signals the one that reaches a target, so the bench waits for its
/// last event without being woken at every change of the consumer's counters (`wait_until` is: several
/// wake-ups per event, another thread's work on a 2-core machine that a raw client's loop never pays).
#[derive(Debug)]
pub struct Countdown {
    target: u64,
    calls: AtomicU64,
    reached: tokio::sync::Notify,
}

impl Countdown {
    /// A countdown to `target` calls.
    pub fn new(target: usize) -> Arc<Countdown> {
        Arc::new(Countdown {
            target: target as u64,
            calls: AtomicU64::new(0),
            reached: tokio::sync::Notify::new(),
        })
    }

    /// Counts one handler call.
    pub fn tick(&self) {
        if self.calls.fetch_add(1, Ordering::Relaxed) + 1 == self.target {
            self.reached.notify_one();
        }
    }

    /// Waits until the target is reached or `consumer` has stopped (checked every 100 ms); an error if
    /// no handler call came for [`Countdown::STALL`] before that.
    pub async fn wait(&self, consumer: &ConsumerHandle) -> Result<(), Error> {
        let (mut seen, mut since) = (0, Instant::now());
        while !consumer.is_finished() {
            tokio::select! {
                () = self.reached.notified() => return Ok(()),
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            let calls = self.calls.load(Ordering::Relaxed);
            if calls != seen {
                (seen, since) = (calls, Instant::now());
            } else if since.elapsed() >= Self::STALL {
                return Err(format!(
                    "the consumer stalled: {calls} of {} handler calls, none for {:?}; its counters: {:?}",
                    self.target,
                    Self::STALL,
                    consumer.stats()
                )
                .into());
            }
        }
        Ok(())
    }

    /// How long a bench waits for a next handler call before it reports a stalled consumer.
    pub const STALL: Duration = Duration::from_secs(20);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_from_proc_lines() {
        // A command name with spaces and a parenthesis; utime 1234, stime 56.
        let own = "4242 (bench (x) y) R 1 2 3 4 5 6 7 8 9 10 1234 56 0 0 20 0 1";
        assert_eq!(process_ticks(own), Some(1290));
        let machine = "cpu  100 2 30 5000 7 1 4 3 0 0\ncpu0 50 1 15 2500 3 0 2 1 0 0\n";
        assert_eq!(machine_busy_ticks(machine), Some(100 + 2 + 30 + 1 + 4 + 3));
        assert_eq!(process_ticks("garbage"), None);
        let io = "rchar: 6976\nwchar: 0\nsyscr: 10\nsyscw: 3\n";
        assert_eq!(
            (io_field(io, "syscr"), io_field(io, "syscw")),
            (Some(10), Some(3))
        );
        assert_eq!(io_field(io, "syscx"), None);
    }

    #[test]
    fn a_round_of_work_shows_in_the_process_cpu_per_message() {
        let clock = Clock::start();
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let cpu = clock.rate(1_000).cpu.expect("/proc is there on Linux");
        // About 200 ms of spinning over 1,000 messages: 200 µs each (ticks are 10 ms).
        assert!(
            cpu.process >= Duration::from_micros(150),
            "{cpu:?} for 200 ms of work over 1,000 messages"
        );
    }

    #[test]
    fn the_steady_rate_leaves_out_the_wait_for_the_first_message() {
        let clock = Clock::start();
        std::thread::sleep(Duration::from_millis(60));
        clock.message();
        std::thread::sleep(Duration::from_millis(20));
        clock.message(); // only the first counts
        let rate = clock.rate(100);
        assert!(rate.whole < 100.0 / 0.07, "{rate:?}");
        assert!(rate.steady > 100.0 / 0.05, "{rate:?}");
        // No message at all: both from the start.
        let idle = Clock::start().rate(1);
        assert!(idle.steady <= idle.whole * 1.5, "{idle:?}");
    }
}
