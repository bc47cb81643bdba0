//! How far a long operation (replay, purge, migrate) is: a bar on a terminal, and otherwise — a log, a
//! CI job, a script reading the output — a plain line at each tenth of the way. Always on standard
//! error, so standard output stays the command's result.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};

use event_retry_core::dlq::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress report for one operation, named by its verb (`replayed`, `purged`, `migrated`).
#[derive(Debug)]
pub struct Bar {
    verb: &'static str,
    bar: Option<ProgressBar>,
    total: AtomicUsize,
    printed: AtomicUsize,
}

impl Bar {
    /// A bar when standard error is a terminal, plain lines otherwise.
    pub fn new(verb: &'static str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{msg} [{bar:40}] {pos}/{len} ({per_sec}, {eta} left)",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_message(verb);
            bar
        });
        Self {
            verb,
            bar,
            total: AtomicUsize::new(0),
            printed: AtomicUsize::new(0),
        }
    }

    /// The line printed where there is no terminal.
    fn line(&self, done: usize, total: usize) -> String {
        format!("{} {done}/{total}", self.verb)
    }
}

impl Progress for Bar {
    fn start(&self, total: usize) {
        self.total.store(total, Ordering::Relaxed);
        match &self.bar {
            Some(bar) => bar.set_length(total as u64),
            None => eprintln!("{}", self.line(0, total)),
        }
    }

    fn advance(&self, done: usize) {
        let total = self.total.load(Ordering::Relaxed);
        match &self.bar {
            Some(bar) => bar.set_position(done as u64),
            None => {
                let step = (total / 10).max(1);
                let printed = self.printed.load(Ordering::Relaxed);
                if done == total || done >= printed + step {
                    self.printed.store(done, Ordering::Relaxed);
                    eprintln!("{}", self.line(done, total));
                }
            }
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_name_the_verb_and_the_count() {
        let bar = Bar::new("migrated");
        assert_eq!(bar.line(3, 300), "migrated 3/300");
    }
}
