//! Replays and purges run as jobs in the background, so the page that started one can show it live: the
//! job records how far it is (the library's progress reports) and how it ended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use event_retry::dlq::Progress;

/// How a job stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Still running.
    Running,
    /// Done, with what it did in words.
    Done(String),
    /// Stopped by an error (what was done before it stays done).
    Failed(String),
}

/// One replay or purge.
#[derive(Debug)]
pub(crate) struct Job {
    /// What it does, in words ("replay 3 entries of orders").
    pub(crate) title: String,
    /// The DLQ it works on.
    pub(crate) dlq: usize,
    total: AtomicUsize,
    done: AtomicUsize,
    state: Mutex<State>,
}

impl Job {
    /// Entries selected and entries done so far.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (
            self.total.load(Ordering::Relaxed),
            self.done.load(Ordering::Relaxed),
        )
    }

    /// How it stands.
    pub(crate) fn state(&self) -> State {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records how it ended.
    pub(crate) fn end(&self, state: State) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
    }
}

impl Progress for Job {
    fn start(&self, total: usize) {
        self.total.store(total, Ordering::Relaxed);
    }

    fn advance(&self, done: usize) {
        self.done.store(done, Ordering::Relaxed);
    }
}

/// The console's jobs, by id.
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    next: AtomicU64,
    jobs: Mutex<HashMap<u64, Arc<Job>>>,
}

impl Jobs {
    /// Registers a new running job; returns its id and the job.
    pub(crate) fn add(&self, title: String, dlq: usize) -> (u64, Arc<Job>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let job = Arc::new(Job {
            title,
            dlq,
            total: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            state: Mutex::new(State::Running),
        });
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, job.clone());
        (id, job)
    }

    /// Job `id`.
    pub(crate) fn get(&self, id: u64) -> Option<Arc<Job>> {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_job_records_its_progress_and_its_end() {
        let jobs = Jobs::default();
        let (id, job) = jobs.add("purge 2 entries".into(), 0);
        job.start(2);
        job.advance(1);
        assert_eq!(jobs.get(id).unwrap().counts(), (2, 1));
        assert_eq!(job.state(), State::Running);
        job.end(State::Done("purged 2".into()));
        assert_eq!(
            jobs.get(id).unwrap().state(),
            State::Done("purged 2".into())
        );
        assert!(jobs.get(id + 1).is_none());
    }
}
