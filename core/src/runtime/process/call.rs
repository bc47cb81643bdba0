//! Calling the handler: the context of a call, its start, its end (a panic becomes an unclassified
//! error) and its time.
//!
//! Separate from the decision on what the call returned, which does not care how the call was made.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};

use futures::FutureExt;

use super::Handling;
use super::clock::elapsed_since;
use crate::classify::HandlerError;
use crate::runtime::handler::{Context, HandlerCall};

impl Handling<'_> {
    /// The context of this event's next call.
    pub(super) fn context(&self, lateness: Option<Duration>) -> Context {
        let meta = &self.event.meta;
        Context {
            topic: self.shared.topic.clone(),
            event_id: self.id.clone(),
            attempt: meta.attempts.saturating_add(1),
            retries: meta.retries,
            due_at: meta.due_at,
            lateness,
            replay_count: meta.replay_count,
        }
    }

    /// Starts a handler call with this event's context, counted.
    pub(super) fn start_call(&mut self, lateness: Option<Duration>) -> HandlerCall {
        let ctx = self.context(lateness);
        self.shared.counters.bump(&self.shared.counters.attempts);
        self.shared.handler.clone().call(self.event.clone(), ctx)
    }

    /// Awaits a call made at `started` (a panic is its error) and records how long it took.
    pub(super) async fn finish_call(
        &mut self,
        call: HandlerCall,
        started: SystemTime,
    ) -> Result<(), HandlerError> {
        let result = AssertUnwindSafe(call)
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(panicked(&*panic)));
        self.shared.telemetry.attempt(elapsed_since(started));
        result
    }
}

/// The error a handler's panic becomes: unclassified, with the panic's message.
pub(super) fn panicked(panic: &(dyn std::any::Any + Send)) -> HandlerError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string());
    HandlerError::unclassified(format!("handler panicked: {message}"))
}
