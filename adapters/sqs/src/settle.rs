//! Settling in batches: the deletes and visibility changes of one queue go to SQS up to ten per call.
//!
//! Every acknowledgement of an SQS message is a `DeleteMessage`, and every visibility retry, heartbeat or
//! release a `ChangeMessageVisibility`: one request per message caps a busy consumer at the round trips it
//! can make. Receipts hand their requests to one task per subscription, which sends whatever has queued
//! up since its last call as `DeleteMessageBatch` and `ChangeMessageVisibilityBatch` calls of at most ten
//! entries, and answers each receipt with its own entry's outcome (SQS reports per-entry failures inside
//! a successful response, so each is checked). Nothing waits to fill a batch: a lone request goes out at
//! once, as a batch of one; under load the batches fill by themselves.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
};
use event_retry_core::error::{Error, Kind};
use tokio::sync::{mpsc, oneshot};

use crate::error::sdk_error;

/// SQS's limit on entries per batch call.
pub(crate) const MAX_BATCH: usize = 10;

/// What to do with one received message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Delete it (acknowledge).
    Delete,
    /// Hide it for this many seconds from now (0: visible again at once).
    Hide(i32),
}

/// One entry of a batch call: its id within the call, the receipt handle and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) handle: String,
    pub(crate) op: Op,
}

/// The two batch calls, apart from SQS so the batching can be tested alone. Each returns, per failed
/// entry, its id and why; a call that fails as a whole is an error.
#[async_trait]
pub(crate) trait BatchApi: Send + Sync + 'static {
    async fn delete(&self, entries: &[Entry]) -> Result<Vec<(String, String)>, Error>;
    async fn hide(&self, entries: &[Entry]) -> Result<Vec<(String, String)>, Error>;
}

/// The batch calls on one SQS queue.
pub(crate) struct SqsBatches {
    pub(crate) client: Client,
    pub(crate) url: String,
}

#[async_trait]
impl BatchApi for SqsBatches {
    async fn delete(&self, entries: &[Entry]) -> Result<Vec<(String, String)>, Error> {
        let batch = entries
            .iter()
            .filter_map(|e| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(&e.id)
                    .receipt_handle(&e.handle)
                    .build()
                    .ok()
            })
            .collect();
        let out = self
            .client
            .delete_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(batch))
            .send()
            .await
            .map_err(|e| sdk_error("delete messages", e))?;
        Ok(out
            .failed()
            .iter()
            .map(|f| (f.id().to_string(), failure(f.code(), f.message())))
            .collect())
    }

    async fn hide(&self, entries: &[Entry]) -> Result<Vec<(String, String)>, Error> {
        let batch = entries
            .iter()
            .filter_map(|e| {
                let Op::Hide(seconds) = e.op else { return None };
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(&e.id)
                    .receipt_handle(&e.handle)
                    .visibility_timeout(seconds)
                    .build()
                    .ok()
            })
            .collect();
        let out = self
            .client
            .change_message_visibility_batch()
            .queue_url(&self.url)
            .set_entries(Some(batch))
            .send()
            .await
            .map_err(|e| sdk_error("change the visibility of messages", e))?;
        Ok(out
            .failed()
            .iter()
            .map(|f| (f.id().to_string(), failure(f.code(), f.message())))
            .collect())
    }
}

fn failure(code: &str, message: Option<&str>) -> String {
    match message {
        Some(m) => format!("{code}: {m}"),
        None => code.to_string(),
    }
}

/// One request from a receipt, with where its outcome goes.
struct Request {
    handle: String,
    op: Op,
    done: oneshot::Sender<Result<(), Error>>,
}

/// The handle receipts send their deletes and visibility changes through.
#[derive(Clone)]
pub(crate) struct Settler {
    requests: mpsc::UnboundedSender<Request>,
}

impl Settler {
    /// A settler over `api`, with its task (which ends when every handle is gone).
    pub(crate) fn new(api: Arc<dyn BatchApi>) -> Self {
        let (requests, rx) = mpsc::unbounded_channel();
        tokio::spawn(serve(api, rx));
        Self { requests }
    }

    /// Does `op` to the message of `handle`, in the next batch; returns its entry's outcome.
    pub(crate) async fn settle(&self, handle: &str, op: Op) -> Result<(), Error> {
        let (done, outcome) = oneshot::channel();
        self.requests
            .send(Request {
                handle: handle.to_string(),
                op,
                done,
            })
            .map_err(|_| Error::closed())?;
        outcome.await.map_err(|_| Error::closed())?
    }

    /// Does `op` without waiting for the outcome (a receipt dropped unsettled gives its message back).
    pub(crate) fn settle_later(&self, handle: &str, op: Op) {
        let (done, _) = oneshot::channel();
        let _ = self.requests.send(Request {
            handle: handle.to_string(),
            op,
            done,
        });
    }
}

/// Sends whatever has queued up, in batches, until every sender is gone.
async fn serve(api: Arc<dyn BatchApi>, mut rx: mpsc::UnboundedReceiver<Request>) {
    while let Some(first) = rx.recv().await {
        let mut queued = vec![first];
        while queued.len() < 4 * MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => queued.push(r),
                Err(_) => break,
            }
        }
        let (deletes, hides): (Vec<Request>, Vec<Request>) =
            queued.into_iter().partition(|r| r.op == Op::Delete);
        // Each call on a task of its own: a slow one holds up only its own entries.
        for requests in [deletes, hides] {
            let mut requests = requests.into_iter().peekable();
            while requests.peek().is_some() {
                let chunk: Vec<Request> = requests.by_ref().take(MAX_BATCH).collect();
                tokio::spawn(send(api.clone(), chunk));
            }
        }
    }
}

/// One batch call for `chunk` (all deletes or all visibility changes), each request answered.
async fn send(api: Arc<dyn BatchApi>, chunk: Vec<Request>) {
    let entries: Vec<Entry> = chunk
        .iter()
        .enumerate()
        .map(|(i, r)| Entry {
            id: i.to_string(),
            handle: r.handle.clone(),
            op: r.op,
        })
        .collect();
    let result = match entries[0].op {
        Op::Delete => api.delete(&entries).await,
        Op::Hide(_) => api.hide(&entries).await,
    };
    for (i, request) in chunk.into_iter().enumerate() {
        let outcome = match &result {
            Ok(failed) => match failed.iter().find(|(id, _)| *id == i.to_string()) {
                Some((_, why)) => Err(Error::new(entry_failure_kind(why), why.clone())
                    .with_operation(describe(request.op))),
                None => Ok(()),
            },
            Err(e) => Err(Error::new(e.kind(), e.message().to_string())
                .with_operation(e.operation().unwrap_or_default().to_string())),
        };
        let _ = request.done.send(outcome);
    }
}

/// The kind of one entry's failure: a receipt handle SQS no longer knows names a message that is not
/// there for this receipt any more (its queue was recreated, or the handle is from an earlier receive):
/// [`Kind::NotFound`]; any other refusal is [`Kind::Rejected`].
fn entry_failure_kind(why: &str) -> Kind {
    if why.starts_with("ReceiptHandleIsInvalid") {
        Kind::NotFound
    } else {
        Kind::Rejected
    }
}

fn describe(op: Op) -> &'static str {
    match op {
        Op::Delete => "delete a message",
        Op::Hide(_) => "change a message's visibility",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn a_handle_sqs_no_longer_knows_is_not_found_and_other_refusals_are_rejected() {
        assert_eq!(
            entry_failure_kind("ReceiptHandleIsInvalid: the receipt handle is not valid"),
            Kind::NotFound
        );
        assert_eq!(
            entry_failure_kind("InvalidParameterValue: too long"),
            Kind::Rejected
        );
    }

    /// Records each call's entries; refuses the handles named `bad-*`.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<(&'static str, Vec<Entry>)>>,
    }

    impl Recorder {
        fn record(&self, kind: &'static str, entries: &[Entry]) -> Vec<(String, String)> {
            self.calls.lock().unwrap().push((kind, entries.to_vec()));
            entries
                .iter()
                .filter(|e| e.handle.starts_with("bad-"))
                .map(|e| (e.id.clone(), "InvalidParameterValue".to_string()))
                .collect()
        }
    }

    #[async_trait]
    impl BatchApi for Recorder {
        async fn delete(&self, entries: &[Entry]) -> Result<Vec<(String, String)>, Error> {
            Ok(self.record("delete", entries))
        }
        async fn hide(&self, entries: &[Entry]) -> Result<Vec<(String, String)>, Error> {
            Ok(self.record("hide", entries))
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn queued_requests_go_out_ten_at_a_time_and_each_gets_its_own_outcome() {
        let api = Arc::new(Recorder::default());
        let settler = Settler::new(api.clone());
        let mut waiting = Vec::new();
        for i in 0..23 {
            let handle = if i == 7 {
                "bad-7".to_string()
            } else {
                format!("h{i}")
            };
            let s = settler.clone();
            waiting.push(tokio::spawn(
                async move { s.settle(&handle, Op::Delete).await },
            ));
        }
        for i in 0..3 {
            let s = settler.clone();
            waiting.push(tokio::spawn(async move {
                s.settle(&format!("v{i}"), Op::Hide(30)).await
            }));
        }
        let mut outcomes = Vec::new();
        for w in waiting {
            outcomes.push(w.await.unwrap());
        }
        let failed: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| o.is_err())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(failed, [7], "only the refused entry fails");
        assert_eq!(outcomes[7].as_ref().unwrap_err().kind(), Kind::Rejected);
        let calls = api.calls.lock().unwrap();
        let sizes: Vec<(&str, usize)> = calls.iter().map(|(k, e)| (*k, e.len())).collect();
        assert_eq!(
            sizes,
            [("delete", 10), ("delete", 10), ("delete", 3), ("hide", 3)]
        );
        assert!(calls[3].1.iter().all(|e| e.op == Op::Hide(30)));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_lone_request_goes_out_at_once() {
        let api = Arc::new(Recorder::default());
        let settler = Settler::new(api.clone());
        settler.settle("only", Op::Delete).await.unwrap();
        assert_eq!(api.calls.lock().unwrap().len(), 1);
    }
}
