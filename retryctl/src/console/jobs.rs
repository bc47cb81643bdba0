//! Replays and purges run as jobs in the background, so the page that started one can show it live: the
//! job records how far it is (the library's progress reports) and how it ended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use event_retry_core::dlq::Progress;

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

/// Finished jobs kept for their pages; older ones are forgotten.
const KEPT_FINISHED: usize = 100;

impl Jobs {
    /// Registers a new running job on DLQ `dlq`; returns its id and the job, or `None` while another job
    /// runs on that DLQ (two operations on one DLQ at once could act on an entry twice).
    pub(crate) fn add(&self, title: String, dlq: usize) -> Option<(u64, Arc<Job>)> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if jobs
            .values()
            .any(|j| j.dlq == dlq && j.state() == State::Running)
        {
            return None;
        }
        let mut finished: Vec<u64> = jobs
            .iter()
            .filter(|(_, j)| j.state() != State::Running)
            .map(|(id, _)| *id)
            .collect();
        if finished.len() >= KEPT_FINISHED {
            finished.sort_unstable();
            for old in &finished[..=finished.len() - KEPT_FINISHED] {
                jobs.remove(old);
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let job = Arc::new(Job {
            title,
            dlq,
            total: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            state: Mutex::new(State::Running),
        });
        jobs.insert(id, job.clone());
        Some((id, job))
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
    fn one_job_at_a_time_per_dlq_and_old_ones_are_forgotten() {
        let jobs = Jobs::default();
        let (first, job) = jobs.add("replay".into(), 0).unwrap();
        assert!(
            jobs.add("purge".into(), 0).is_none(),
            "one at a time on DLQ 0"
        );
        assert!(jobs.add("purge".into(), 1).is_some(), "another DLQ may run");
        job.end(State::Done("replayed 1".into()));
        for _ in 0..KEPT_FINISHED + 5 {
            let (_, j) = jobs.add("purge".into(), 0).unwrap();
            j.end(State::Done("purged 0".into()));
        }
        assert!(
            jobs.get(first).is_none(),
            "the oldest finished jobs are forgotten"
        );
        let kept = jobs.jobs.lock().unwrap().len();
        assert!(kept <= KEPT_FINISHED + 2, "{kept} jobs kept");
    }

    #[test]
    fn a_job_records_its_progress_and_its_end() {
        let jobs = Jobs::default();
        let (id, job) = jobs.add("purge 2 entries".into(), 0).unwrap();
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
