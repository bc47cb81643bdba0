//! The handler's own record: one line per handler call, appended to a file that outlives the process.
//!
//! The consumer writes the line inside the handler, before it returns, with one `write` on a file opened
//! for appending: a SIGKILL after the line and before the acknowledgement leaves the line (the side
//! effect happened) and the broker redelivers the event (a duplicate the count then shows). The harness
//! reads the file as it grows, so it sees progress without asking the consumer anything.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// What one handler call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Returned success.
    Ok,
    /// Returned a deferred (retryable) error.
    Failed,
    /// Returned a non-retryable error.
    Refused,
    /// Committed its side effect and was then held by design, never to return: the consumer is
    /// killed with it in flight, so the broker hands it out again after a commit.
    Held,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Refused => "refused",
            Outcome::Held => "held",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "ok" => Some(Outcome::Ok),
            "failed" => Some(Outcome::Failed),
            "refused" => Some(Outcome::Refused),
            "held" => Some(Outcome::Held),
            _ => None,
        }
    }
}

/// Milliseconds since the Unix epoch, the record's clock (shared by every process on the machine).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Appends handler calls to the record file.
pub(crate) struct Recorder {
    file: Mutex<File>,
    pid: u32,
}

impl Recorder {
    /// Opens (creating) the record at `path` for appending.
    pub(crate) fn open(path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            file: Mutex::new(file),
            pid: std::process::id(),
        })
    }

    /// Records one call: the line is written with a single `write` before this returns.
    pub(crate) fn call(&self, id: &str, attempt: u32, outcome: Outcome) -> std::io::Result<()> {
        self.write(id, attempt, outcome, "")
    }

    /// Records a successful call whose side effect the inbox skipped: the event's effect had
    /// committed in an earlier call, and the broker handed it out again.
    pub(crate) fn call_skipped(&self, id: &str, attempt: u32) -> std::io::Result<()> {
        self.write(id, attempt, Outcome::Ok, " skipped")
    }

    fn write(&self, id: &str, attempt: u32, outcome: Outcome, tail: &str) -> std::io::Result<()> {
        let line = format!(
            "{} {} {id} {attempt} {}{tail}\n",
            now_ms(),
            self.pid,
            outcome.as_str()
        );
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(line.as_bytes())
    }
}

/// One id's calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Calls {
    /// Handler calls in all.
    pub(crate) calls: u32,
    /// Calls that succeeded.
    pub(crate) oks: u32,
    /// Calls that were refused (non-retryable).
    pub(crate) refusals: u32,
    /// When the first call was written.
    pub(crate) first_at: u64,
}

/// What the record says so far.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Calls per event id.
    pub(crate) by_id: HashMap<String, Calls>,
    /// The time of every call, in the order written.
    pub(crate) times: Vec<u64>,
    /// The time of every refused (non-retryable) call.
    pub(crate) refusal_times: Vec<u64>,
    /// The processes that wrote calls.
    pub(crate) pids: Vec<u32>,
    /// Lines that did not parse (a torn line would show here).
    pub(crate) unreadable: usize,
    /// Successful calls whose side effect the inbox skipped (already committed by an earlier call).
    pub(crate) inbox_skips: usize,
    /// Calls held after their commit ([`Outcome::Held`]).
    pub(crate) held: usize,
}

impl Tally {
    /// Events with at least one successful call.
    pub(crate) fn succeeded(&self) -> usize {
        self.by_id.values().filter(|c| c.oks > 0).count()
    }

    /// Handler calls in all.
    pub(crate) fn calls(&self) -> usize {
        self.times.len()
    }

    /// Calls written within `[from, to)`.
    pub(crate) fn calls_between(&self, from: u64, to: u64) -> usize {
        self.times.iter().filter(|&&t| t >= from && t < to).count()
    }

    /// Events whose first call was written within `[from, to)`.
    pub(crate) fn started_between(&self, from: u64, to: u64) -> usize {
        self.by_id
            .values()
            .filter(|c| c.first_at >= from && c.first_at < to)
            .count()
    }

    /// Refused events first called within `[from, to)` that were called more than once.
    pub(crate) fn refused_again(&self, from: u64, to: u64) -> Vec<&str> {
        self.by_id
            .iter()
            .filter(|(_, c)| c.refusals > 0 && c.calls > 1 && c.first_at >= from && c.first_at < to)
            .map(|(id, _)| id.as_str())
            .collect()
    }

    /// The first call at or after `ms`.
    pub(crate) fn first_call_since(&self, ms: u64) -> Option<u64> {
        self.times.iter().copied().filter(|&t| t >= ms).min()
    }

    fn add(&mut self, line: &str) {
        let mut words = line.split(' ');
        let parsed = (|| {
            let at: u64 = words.next()?.parse().ok()?;
            let pid: u32 = words.next()?.parse().ok()?;
            let id = words.next()?;
            let _attempt: u32 = words.next()?.parse().ok()?;
            let outcome = Outcome::parse(words.next()?)?;
            let skipped = match words.next() {
                None => false,
                Some("skipped") if outcome == Outcome::Ok => true,
                Some(_) => return None,
            };
            Some((at, pid, id, outcome, skipped))
        })();
        let Some((at, pid, id, outcome, skipped)) = parsed else {
            self.unreadable += 1;
            return;
        };
        let calls = self.by_id.entry(id.to_string()).or_default();
        if calls.calls == 0 {
            calls.first_at = at;
        }
        calls.calls += 1;
        match outcome {
            Outcome::Ok => calls.oks += 1,
            Outcome::Refused => {
                calls.refusals += 1;
                self.refusal_times.push(at);
            }
            Outcome::Failed => {}
            Outcome::Held => self.held += 1,
        }
        if skipped {
            self.inbox_skips += 1;
        }
        self.times.push(at);
        if !self.pids.contains(&pid) {
            self.pids.push(pid);
        }
    }
}

/// Reads a record file as it grows.
pub(crate) struct RecordReader {
    path: PathBuf,
    offset: u64,
    partial: String,
    tally: Tally,
}

impl RecordReader {
    /// Reads the record at `path` (which may not exist yet).
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            offset: 0,
            partial: String::new(),
            tally: Tally::default(),
        }
    }

    /// Reads what was appended since the last call; returns the tally so far.
    pub(crate) fn refresh(&mut self) -> std::io::Result<&Tally> {
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(&self.tally),
            Err(e) => return Err(e),
        };
        file.seek(SeekFrom::Start(self.offset))?;
        let mut fresh = String::new();
        let read = file.read_to_string(&mut fresh)?;
        self.offset += read as u64;
        self.partial.push_str(&fresh);
        // Only whole lines: a line still being written stays for the next refresh.
        if let Some(end) = self.partial.rfind('\n') {
            let complete: String = self.partial.drain(..=end).collect();
            for line in complete.lines() {
                self.tally.add(line);
            }
        }
        Ok(&self.tally)
    }

    /// The tally so far, without reading.
    pub(crate) fn tally(&self) -> &Tally {
        &self.tally
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_per_id_as_the_file_grows() {
        let path = std::env::temp_dir().join(format!("faults-record-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let recorder = Recorder::open(&path).unwrap();
        let mut reader = RecordReader::new(&path);
        recorder.call("ev-00003", 1, Outcome::Failed).unwrap();
        assert_eq!(reader.refresh().unwrap().calls(), 1);
        recorder.call("ev-00003", 2, Outcome::Ok).unwrap();
        recorder.call("ev-00007", 1, Outcome::Refused).unwrap();
        recorder.call("ev-00003", 2, Outcome::Ok).unwrap();
        let tally = reader.refresh().unwrap();
        let first = tally.by_id["ev-00003"].first_at;
        assert_eq!(
            tally.by_id["ev-00003"],
            Calls {
                calls: 3,
                oks: 2,
                refusals: 0,
                first_at: first,
            }
        );
        assert_eq!(tally.by_id["ev-00007"].refusals, 1);
        assert_eq!(tally.succeeded(), 1);
        assert_eq!(tally.calls(), 4);
        assert_eq!(tally.unreadable, 0);
        assert_eq!((tally.inbox_skips, tally.held), (0, 0));
        recorder.call("ev-00011", 1, Outcome::Held).unwrap();
        recorder.call_skipped("ev-00011", 1).unwrap();
        let tally = reader.refresh().unwrap();
        assert_eq!((tally.inbox_skips, tally.held), (1, 1));
        assert_eq!(tally.by_id["ev-00011"].calls, 2);
        assert_eq!(tally.by_id["ev-00011"].oks, 1, "a held call is no success");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_skip_mark_on_anything_but_a_success_is_unreadable() {
        let path = std::env::temp_dir().join(format!("faults-skip-{}", std::process::id()));
        std::fs::write(
            &path,
            "1 2 ev-00001 1 failed skipped\n3 4 ev-00002 1 ok extra\n",
        )
        .unwrap();
        let tally = RecordReader::new(&path).refresh().unwrap().inbox_skips;
        assert_eq!(tally, 0);
        let unreadable = RecordReader::new(&path).refresh().unwrap().unreadable;
        assert_eq!(unreadable, 2);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn events_are_placed_by_their_first_call() {
        let path = std::env::temp_dir().join(format!("faults-first-{}", std::process::id()));
        std::fs::write(
            &path,
            "100 1 ev-00001 1 failed\n200 1 ev-00007 1 refused\n300 1 ev-00001 2 ok\n\
             400 1 ev-00107 1 refused\n450 1 ev-00107 1 refused\n500 1 ev-00002 1 ok\n",
        )
        .unwrap();
        let mut reader = RecordReader::new(&path);
        let tally = reader.refresh().unwrap();
        assert_eq!(tally.started_between(150, 500), 2, "ev-00007 and ev-00107");
        assert_eq!(tally.started_between(0, 1000), 4);
        assert_eq!(tally.refused_again(0, 1000), vec!["ev-00107"]);
        assert!(tally.refused_again(0, 300).is_empty());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_half_written_line_waits_for_its_end() {
        let path = std::env::temp_dir().join(format!("faults-partial-{}", std::process::id()));
        std::fs::write(&path, "1 2 ev-00001 1 ok\n3 4 ev-0").unwrap();
        let mut reader = RecordReader::new(&path);
        assert_eq!(reader.refresh().unwrap().calls(), 1);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"0002 1 ok\n").unwrap();
        let tally = reader.refresh().unwrap();
        assert_eq!(tally.calls(), 2);
        assert!(tally.by_id.contains_key("ev-00002"));
        std::fs::remove_file(&path).unwrap();
    }
}
