//! The console's request handlers: the middleware that admits a caller and sets protective headers,
//! sign-in and out, the views (DLQs, one DLQ's entries, one entry, a job), and the confirmed replay and
//! purge jobs. The routes that reach them are [`super::Console::router`]'s.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{AppendHeaders, IntoResponse, Redirect, Response};
use event_retry::{DeadLetter, DlqFilter};
use maud::Markup;

use super::auth::Caller;
use super::jobs::State as JobState;
use super::pages::{FilterForm, Frame};
use super::{Console, Dlq, auth, pages};
use crate::{CliError, render};

type Shared = Arc<Console>;

/// Admits a request with the token or a session, or answers 401 with the login form (after the
/// failed-login delay when it carried a wrong token).
pub(super) async fn require_caller(
    State(console): State<Shared>,
    mut request: Request,
    next: Next,
) -> Response {
    match console.auth.caller(request.headers()) {
        Some(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        None => {
            // A wrong token, not a missing one: answered as a wrong login is, so guesses are slow.
            if request.headers().contains_key(header::AUTHORIZATION) {
                console.auth.failed_login().await;
            }
            (StatusCode::UNAUTHORIZED, pages::login(false)).into_response()
        }
    }
}

/// Turns away a request naming a host the console does not serve; sets headers on every answer: no
/// framing by other sites, scripts and styles from the console only, no type sniffing, no caching of
/// pages that show dead letters.
pub(super) async fn protective_headers(
    State(console): State<Shared>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(hosts) = &console.hosts {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        if !hosts.iter().any(|h| h == host) {
            return refusal(
                None,
                StatusCode::MISDIRECTED_REQUEST,
                "this console does not serve that host name",
            );
        }
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'; \
             form-action 'self'",
        ),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

pub(super) async fn css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        pages::CSS,
    )
}

pub(super) async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        pages::JS,
    )
}

pub(super) async fn login_page(State(console): State<Shared>, headers: HeaderMap) -> Response {
    if console.auth.caller(&headers).is_some() {
        return Redirect::to("/").into_response();
    }
    pages::login(false).into_response()
}

/// Checks the token from the login form and opens a session.
pub(super) async fn login(
    State(console): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !auth::same_origin(&headers) {
        return refusal(None, StatusCode::FORBIDDEN, auth::Refusal::Origin.reason());
    }
    let form = Form::parse(&body);
    if !console.auth.is_token(form.get("token")) {
        // Wrong tokens are answered one at a time, a second each: guessing is slow.
        console.auth.failed_login().await;
        return (StatusCode::UNAUTHORIZED, pages::login(true)).into_response();
    }
    let id = console.auth.open_session();
    (
        AppendHeaders([(header::SET_COOKIE, auth::session_cookie(&id))]),
        Redirect::to("/"),
    )
        .into_response()
}

pub(super) async fn logout(
    State(console): State<Shared>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = Form::parse(&body);
    if let Err(refused) = console
        .auth
        .check_change(&caller, form.get("csrf"), &headers)
    {
        return refusal(None, StatusCode::FORBIDDEN, refused.reason());
    }
    console.auth.close_session(&headers);
    (
        AppendHeaders([(header::SET_COOKIE, auth::expired_cookie())]),
        Redirect::to("/login"),
    )
        .into_response()
}

/// A form body: its pairs, repeated names kept (`id=a&id=b`).
pub(super) struct Form(Vec<(String, String)>);

impl Form {
    pub(super) fn parse(body: &[u8]) -> Self {
        Form(form_urlencoded::parse(body).into_owned().collect())
    }

    /// The first value of `name`, or "".
    fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    }

    /// Every value of `name`.
    fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .collect()
    }

    fn filter_form(&self) -> FilterForm {
        FilterForm::from_fields(|k| self.get(k).to_string())
    }
}

/// The library's filter for the form's values.
pub(super) fn to_filter(form: &FilterForm) -> Result<DlqFilter, CliError> {
    let text = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_string());
    let kind = match text(&form.kind) {
        Some(k) => Some(
            k.parse()
                .map_err(|_| CliError::Usage(format!("{k:?} is not an error kind")))?,
        ),
        None => None,
    };
    let mut filter = DlqFilter::all();
    filter.error_kind = kind;
    filter.key = text(&form.key).map(Into::into);
    filter.since = text(&form.since)
        .as_deref()
        .map(render::parse_time)
        .transpose()?;
    filter.until = text(&form.until)
        .as_deref()
        .map(render::parse_time)
        .transpose()?;
    filter.error_text = text(&form.error);
    filter.fingerprint = text(&form.group);
    Ok(filter)
}

fn frame<'a>(console: &Console, caller: &'a Caller) -> Frame<'a> {
    Frame {
        csrf: caller.csrf(),
        read_only: console.read_only,
    }
}

fn refusal(frame: Option<&Frame<'_>>, status: StatusCode, reason: &str) -> Response {
    (status, pages::refused(frame, reason)).into_response()
}

/// A request the console turns down: the status and why, shown on the refusal page (with the signed-in
/// header when `csrf` says who is signed in).
pub(super) struct Refused {
    status: StatusCode,
    reason: String,
    csrf: Option<String>,
    read_only: bool,
}

impl Refused {
    fn new(frame: Option<&Frame<'_>>, status: StatusCode, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
            csrf: frame.map(|f| f.csrf.to_string()),
            read_only: frame.is_some_and(|f| f.read_only),
        }
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let frame = self.csrf.as_deref().map(|csrf| Frame {
            csrf,
            read_only: self.read_only,
        });
        refusal(frame.as_ref(), self.status, &self.reason)
    }
}

fn page(title: &str, frame: &Frame<'_>, body: Markup) -> Response {
    pages::layout(title, Some(frame), false, body).into_response()
}

fn dlq_of<'c>(console: &'c Console, frame: &Frame<'_>, index: usize) -> Result<&'c Dlq, Refused> {
    console
        .dlqs
        .get(index)
        .ok_or_else(|| Refused::new(Some(frame), StatusCode::NOT_FOUND, "no such DLQ"))
}

/// Every entry of a DLQ, or why it could not be read.
async fn read_all(dlq: &Dlq, frame: &Frame<'_>) -> Result<Vec<DeadLetter>, Refused> {
    dlq.broker
        .dead_letters()
        .list(&dlq.topic, &DlqFilter::all())
        .await
        .map_err(|e| {
            Refused::new(
                Some(frame),
                StatusCode::BAD_GATEWAY,
                format!("reading the DLQ failed: {e}"),
            )
        })
}

pub(super) async fn overview(
    State(console): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let mut read = Vec::new();
    for d in &console.dlqs {
        let entries = d
            .broker
            .dead_letters()
            .list(&d.topic, &DlqFilter::all())
            .await
            .map_err(|e| e.to_string());
        read.push(entries);
    }
    let summaries: Vec<pages::Summary<'_>> = console
        .dlqs
        .iter()
        .zip(read)
        .enumerate()
        .map(|(index, (d, entries))| pages::Summary {
            index,
            name: &d.name,
            broker: d.broker.name(),
            url: &d.url,
            topic: &d.topic,
            groups: entries
                .as_deref()
                .map(event_retry_core::dlq::failure_groups)
                .unwrap_or_default(),
            entries: entries.map(|e| e.len()),
        })
        .collect();
    pages::overview(&frame(&console, &caller), &summaries).into_response()
}

pub(super) async fn list(
    State(console): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(index): Path<usize>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, Refused> {
    let frame = frame(&console, &caller);
    let dlq = dlq_of(&console, &frame, index)?;
    let form = FilterForm::from_fields(|k| query.get(k).cloned().unwrap_or_default());
    let all = read_all(dlq, &frame).await?;
    let (matching, filter_error): (Vec<&DeadLetter>, _) = match to_filter(&form) {
        Ok(filter) => (all.iter().filter(|e| filter.matches(e)).collect(), None),
        Err(e) => (all.iter().collect(), Some(e.to_string())),
    };
    let view = pages::ListView {
        index,
        name: &dlq.name,
        broker: dlq.broker.name(),
        filter: &form,
        all: &all,
        matching: &matching,
        filter_error,
    };
    Ok(page(&dlq.name, &frame, pages::list(&frame, &view)))
}

pub(super) async fn entry(
    State(console): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((index, id)): Path<(usize, String)>,
) -> Result<Response, Refused> {
    let frame = frame(&console, &caller);
    let dlq = dlq_of(&console, &frame, index)?;
    match dlq.broker.dead_letters().show(&dlq.topic, &id).await {
        Ok(Some(e)) => Ok(page(
            e.event.id().unwrap_or(&e.id),
            &frame,
            pages::entry(&frame, index, &dlq.name, dlq.broker.name(), &e),
        )),
        Ok(None) => Err(Refused::new(
            Some(&frame),
            StatusCode::NOT_FOUND,
            format!("no dead letter {id} in {}", dlq.name),
        )),
        Err(e) => Err(Refused::new(
            Some(&frame),
            StatusCode::BAD_GATEWAY,
            format!("reading the DLQ failed: {e}"),
        )),
    }
}

/// What a replay or purge applies to, from its form.
pub(super) struct Selected {
    pub(super) action: String,
    pub(super) ids: Vec<String>,
    pub(super) filter: Option<FilterForm>,
}

impl Selected {
    pub(super) fn of(form: &Form) -> Result<Self, String> {
        let action = form.get("action");
        if action != "replay" && action != "purge" {
            return Err(format!("{action:?} is not replay or purge"));
        }
        let (ids, filter) = match form.get("scope") {
            "filter" => (Vec::new(), Some(form.filter_form())),
            _ => (form.all("id"), None),
        };
        if filter.is_none() && ids.is_empty() {
            return Err("no entry was selected".into());
        }
        Ok(Self {
            action: action.to_string(),
            ids,
            filter,
        })
    }

    pub(super) fn filter(&self) -> Result<DlqFilter, CliError> {
        match &self.filter {
            Some(f) => to_filter(f),
            None => Ok(DlqFilter::all().ids(self.ids.iter().cloned())),
        }
    }
}

/// Checks a state change: not read-only, the session's CSRF token, its own origin; then the selection.
fn admit_change(
    console: &Console,
    caller: &Caller,
    headers: &HeaderMap,
    form: &Form,
) -> Result<(Selected, DlqFilter), Refused> {
    let frame = frame(console, caller);
    let refuse = |status, reason: &str| Refused::new(Some(&frame), status, reason);
    if console.read_only {
        return Err(refuse(StatusCode::FORBIDDEN, "this console is read-only"));
    }
    if let Err(refused) = console.auth.check_change(caller, form.get("csrf"), headers) {
        return Err(refuse(StatusCode::FORBIDDEN, refused.reason()));
    }
    let selected = Selected::of(form).map_err(|e| refuse(StatusCode::BAD_REQUEST, &e))?;
    let filter = selected
        .filter()
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, &e.to_string()))?;
    Ok((selected, filter))
}

/// The DLQ, the selection and its filter of a state-changing request, once the change is admitted.
fn change_request<'c>(
    console: &'c Console,
    caller: &Caller,
    headers: &HeaderMap,
    index: usize,
    body: &[u8],
) -> Result<(&'c Dlq, Selected, DlqFilter), Refused> {
    let dlq = dlq_of(console, &frame(console, caller), index)?;
    let (selected, filter) = admit_change(console, caller, headers, &Form::parse(body))?;
    Ok((dlq, selected, filter))
}

pub(super) async fn confirm(
    State(console): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(index): Path<usize>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Refused> {
    let frame = frame(&console, &caller);
    let (dlq, selected, filter) = change_request(&console, &caller, &headers, index, &body)?;
    let all = read_all(dlq, &frame).await?;
    // The confirmation names the entries it shows: a filter is resolved now, so the job acts on exactly
    // these (not on entries that arrive, or that a relative time takes in, after the page was shown).
    let chosen: Vec<&DeadLetter> = all.iter().filter(|e| filter.matches(e)).collect();
    let ids: Vec<String> = chosen.iter().map(|e| e.id.clone()).collect();
    let nonce = console.auth.issue_nonce();
    let view = pages::Confirm {
        index,
        dlq_name: &dlq.name,
        action: &selected.action,
        entries: &chosen,
        ids: &ids,
        nonce: &nonce,
    };
    Ok(page("Confirm", &frame, pages::confirm(&frame, &view)))
}

/// Starts the replay or purge as a job and shows its page.
pub(super) async fn run_job(
    State(console): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(index): Path<usize>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Refused> {
    let frame = frame(&console, &caller);
    let (dlq, selected, filter) = change_request(&console, &caller, &headers, index, &body)?;
    // A browser's confirmation is used once: a resubmitted form or a second click does nothing.
    if matches!(caller, Caller::Session { .. })
        && !console.auth.use_nonce(Form::parse(&body).get("nonce"))
    {
        return Err(Refused::new(
            Some(&frame),
            StatusCode::CONFLICT,
            "this confirmation was used already or has expired: confirm again from the DLQ",
        ));
    }
    let verb = pages::verb(&selected.action);
    let scope = match &selected.filter {
        Some(_) => "the entries the filter selects".to_string(),
        None => render::counted(selected.ids.len(), "entry", "entries"),
    };
    let Some((id, job)) = console
        .jobs
        .add(format!("{verb} {scope} of {}", dlq.name), index)
    else {
        return Err(Refused::new(
            Some(&frame),
            StatusCode::CONFLICT,
            "a replay or purge is running on this DLQ: wait for it to end",
        ));
    };
    let (dead_letters, topic) = (dlq.broker.dead_letters(), dlq.topic.clone());
    let watched = job.clone();
    let work = tokio::spawn(async move {
        let ended = if verb == "purge" {
            dead_letters
                .purge_with(&topic, &filter, job.as_ref())
                .await
                .map(|n| {
                    format!(
                        "purged {}",
                        render::counted(n, "dead letter", "dead letters")
                    )
                })
        } else {
            dead_letters
                .replay_with(&topic, &filter, job.as_ref())
                .await
                .map(|r| crate::dlq::replayed(&r))
        };
        job.end(match ended {
            Ok(what) => JobState::Done(what),
            Err(e) => JobState::Failed(e.to_string()),
        });
    });
    // A job that panics ends as failed, not running for ever.
    tokio::spawn(async move {
        if work.await.is_err() {
            watched.end(JobState::Failed("the job stopped unexpectedly".into()));
        }
    });
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

pub(super) async fn job_page(
    State(console): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<u64>,
) -> Response {
    let frame = frame(&console, &caller);
    let Some(job) = console.jobs.get(id) else {
        return refusal(Some(&frame), StatusCode::NOT_FOUND, "no such job");
    };
    let (total, done) = job.counts();
    let state = job.state();
    let body = pages::job(id, &job.title, job.dlq, total, done, &state);
    pages::layout(&job.title, Some(&frame), state == JobState::Running, body).into_response()
}

pub(super) async fn job_status(State(console): State<Shared>, Path(id): Path<u64>) -> Response {
    let Some(job) = console.jobs.get(id) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let (total, done) = job.counts();
    let (status, finished) = match job.state() {
        JobState::Running => (format!("running: {done} of {total}"), false),
        JobState::Done(what) => (format!("done: {what}"), true),
        JobState::Failed(why) => (format!("failed after {done} of {total}: {why}"), true),
    };
    axum::Json(serde_json::json!({
        "total": total, "done": done, "status": status, "finished": finished,
    }))
    .into_response()
}
