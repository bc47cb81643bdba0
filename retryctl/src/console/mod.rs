//! `retryctl serve`: a DLQ console in the browser, for one DLQ or many, on any broker whose adapter is
//! compiled in.
//!
//! Views: the DLQs with their counts; one DLQ's entries with filters (error kind, key, time range, error
//! text) and counts by kind and reason; one entry with its payload (text, JSON pretty-printed, or hex),
//! every header with its type, what the broker holds besides, the SDK's metadata in human times and its
//! history; and replay or purge of one entry, a selection or everything a filter selects, each after a
//! confirmation, with live progress. Pages are rendered on the server; the only script polls a running
//! job's progress, so `cargo install` alone gives a working console.
//!
//! Security: it listens on 127.0.0.1 unless told otherwise; every request needs the access token
//! (the `auth` module); every state change made from a browser needs the session's CSRF token and its own origin;
//! `--read-only` refuses every change; pages show broker URLs with their secrets as `***`.

mod auth;
mod jobs;
mod pages;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{AppendHeaders, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use clap::Args;
use event_retry::options::redact_url;
use event_retry::{Broker, DeadLetter, DlqFilter};
use maud::Markup;
use serde::Deserialize;

pub use self::auth::MIN_TOKEN_LEN;
use self::auth::{Auth, Caller};
use self::jobs::{Jobs, State as JobState};
use self::pages::{FilterForm, Frame};
use crate::{CliError, render};

/// `retryctl serve …`
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A TOML file naming the DLQs to show: `[[dlq]]` tables with `url`, `topic` and an optional `name`.
    #[arg(long, conflicts_with_all = ["url", "topic"], required_unless_present = "url")]
    pub config: Option<PathBuf>,
    /// One broker URL (with --topic), instead of a config file.
    #[arg(long, requires = "topic")]
    pub url: Option<String>,
    /// The source topic or queue whose DLQ to show (with --url).
    #[arg(long, requires = "url")]
    pub topic: Option<String>,
    /// Where to listen (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// A file holding the access token; without it, the RETRYCTL_TOKEN environment variable.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Show only: replay and purge are refused.
    #[arg(long)]
    pub read_only: bool,
}

/// One DLQ to show.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// What the console calls it (by default `<topic> on <broker>`).
    pub name: Option<String>,
    /// The broker URL.
    pub url: String,
    /// The source topic or queue whose DLQ it is.
    pub topic: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    dlq: Vec<Target>,
}

/// The DLQs a config file names.
pub fn read_config(text: &str) -> Result<Vec<Target>, CliError> {
    let file: ConfigFile = toml::from_str(text)
        .map_err(|e| CliError::Usage(format!("the console's config file: {e}")))?;
    if file.dlq.is_empty() {
        return Err(CliError::Usage(
            "the console's config file names no [[dlq]]".into(),
        ));
    }
    Ok(file.dlq)
}

/// One DLQ as the console holds it.
struct Dlq {
    name: String,
    /// The URL with its secrets hidden.
    url: String,
    topic: String,
    broker: Broker,
}

/// A console: the DLQs it shows, who may use it, and its running jobs.
pub struct Console {
    dlqs: Vec<Dlq>,
    auth: Auth,
    jobs: Jobs,
    read_only: bool,
    /// The `Host` values requests may name (the listening address's, when it is a loopback one: a page
    /// of another site reaching it through a rebound DNS name is turned away); `None` for any.
    hosts: Option<Vec<String>>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field(
                "dlqs",
                &self.dlqs.iter().map(|d| &d.name).collect::<Vec<_>>(),
            )
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl Console {
    /// Connects to the brokers of `targets` (each URL once) and admits `token`.
    pub async fn connect(
        targets: Vec<Target>,
        token: String,
        read_only: bool,
    ) -> Result<Self, CliError> {
        if token.trim().len() < MIN_TOKEN_LEN {
            return Err(CliError::Usage(format!(
                "the access token must be at least {MIN_TOKEN_LEN} characters"
            )));
        }
        let mut brokers: HashMap<String, Broker> = HashMap::new();
        let mut dlqs = Vec::new();
        for target in targets {
            let broker = match brokers.get(&target.url) {
                Some(b) => b.clone(),
                None => {
                    let b = event_retry::connect(&target.url).await?;
                    brokers.insert(target.url.clone(), b.clone());
                    b
                }
            };
            dlqs.push(Dlq {
                name: target
                    .name
                    .unwrap_or_else(|| format!("{} on {}", target.topic, broker.name())),
                url: redact_url(&target.url),
                topic: target.topic,
                broker,
            });
        }
        Ok(Self {
            dlqs,
            auth: Auth::new(token.trim().to_string()),
            jobs: Jobs::default(),
            read_only,
            hosts: None,
        })
    }

    /// Accepts only requests naming `addr` as their host when it is a loopback address (`127.0.0.1:P`,
    /// `localhost:P`, `[::1]:P`); any host otherwise.
    pub fn serving_on(mut self, addr: SocketAddr) -> Self {
        self.hosts = addr.ip().is_loopback().then(|| {
            let port = addr.port();
            vec![
                format!("{addr}"),
                format!("127.0.0.1:{port}"),
                format!("localhost:{port}"),
                format!("[::1]:{port}"),
            ]
        });
        self
    }

    /// The console's routes.
    pub fn router(self) -> Router {
        let console = Arc::new(self);
        Router::new()
            .route("/", get(overview))
            .route("/dlq/{dlq}", get(list))
            .route("/dlq/{dlq}/entry/{id}", get(entry))
            .route("/dlq/{dlq}/confirm", post(confirm))
            .route("/dlq/{dlq}/run", post(run_job))
            .route("/jobs/{job}", get(job_page))
            .route("/jobs/{job}/status", get(job_status))
            .route("/logout", post(logout))
            .layer(axum::middleware::from_fn_with_state(
                console.clone(),
                require_caller,
            ))
            .route("/login", get(login_page).post(login))
            .route("/static/console.css", get(css))
            .route("/static/console.js", get(js))
            .layer(axum::middleware::from_fn_with_state(
                console.clone(),
                protective_headers,
            ))
            .with_state(console)
    }
}

/// Serves `console` on `listener` until `shutdown` completes.
pub async fn serve(
    console: Console,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let console = console.serving_on(listener.local_addr()?);
    axum::serve(listener, console.router())
        .with_graceful_shutdown(shutdown)
        .await
}

/// Runs `retryctl serve`: reads the token and the DLQs, listens, and serves until SIGTERM or ctrl-c.
pub async fn run(args: ServeArgs, out: &mut dyn std::io::Write) -> Result<(), CliError> {
    let token = match &args.token_file {
        Some(path) => std::fs::read_to_string(path).map_err(|e| {
            CliError::Usage(format!(
                "cannot read the token file {}: {e}",
                path.display()
            ))
        })?,
        None => std::env::var("RETRYCTL_TOKEN").map_err(|_| {
            CliError::Usage(
                "the console needs an access token: set RETRYCTL_TOKEN or give --token-file".into(),
            )
        })?,
    };
    let targets = match (&args.config, &args.url, &args.topic) {
        (Some(path), _, _) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
            read_config(&text)?
        }
        (None, Some(url), Some(topic)) => vec![Target {
            name: None,
            url: url.clone(),
            topic: topic.clone(),
        }],
        _ => {
            return Err(CliError::Usage(
                "give --config, or --url with --topic".into(),
            ));
        }
    };
    let console = Console::connect(targets, token, args.read_only).await?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        eprintln!("warning: the console listens on {addr}, beyond this machine");
    }
    writeln!(
        out,
        "DLQ console on http://{addr}/ ({}{})",
        render::counted(console.dlqs.len(), "DLQ", "DLQs"),
        if args.read_only { ", read-only" } else { "" }
    )?;
    out.flush()?;
    serve(console, listener, event_retry::shutdown_signal()).await?;
    Ok(())
}

type Shared = Arc<Console>;

/// Admits a request with the token or a session, or answers 401 with the login form (after the
/// failed-login delay when it carried a wrong token).
async fn require_caller(
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
async fn protective_headers(
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

async fn css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        pages::CSS,
    )
}

async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        pages::JS,
    )
}

async fn login_page(State(console): State<Shared>, headers: HeaderMap) -> Response {
    if console.auth.caller(&headers).is_some() {
        return Redirect::to("/").into_response();
    }
    pages::login(false).into_response()
}

/// Checks the token from the login form and opens a session.
async fn login(State(console): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
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

async fn logout(
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
struct Form(Vec<(String, String)>);

impl Form {
    fn parse(body: &[u8]) -> Self {
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
        FilterForm {
            kind: self.get("kind").to_string(),
            key: self.get("key").to_string(),
            since: self.get("since").to_string(),
            until: self.get("until").to_string(),
            error: self.get("error").to_string(),
        }
    }
}

/// The library's filter for the form's values.
fn to_filter(form: &FilterForm) -> Result<DlqFilter, CliError> {
    let text = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_string());
    let kind = match text(&form.kind) {
        Some(k) => Some(
            k.parse()
                .map_err(|_| CliError::Usage(format!("{k:?} is not an error kind")))?,
        ),
        None => None,
    };
    Ok(DlqFilter {
        error_kind: kind,
        key: text(&form.key).map(Into::into),
        since: text(&form.since)
            .as_deref()
            .map(render::parse_time)
            .transpose()?,
        until: text(&form.until)
            .as_deref()
            .map(render::parse_time)
            .transpose()?,
        error_text: text(&form.error),
        ..DlqFilter::all()
    })
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
struct Refused {
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

async fn overview(State(console): State<Shared>, Extension(caller): Extension<Caller>) -> Response {
    let mut counts = Vec::new();
    for d in &console.dlqs {
        let n = d
            .broker
            .dead_letters()
            .list(&d.topic, &DlqFilter::all())
            .await
            .map(|e| e.len())
            .map_err(|e| e.to_string());
        counts.push(n);
    }
    let summaries: Vec<pages::Summary<'_>> = console
        .dlqs
        .iter()
        .zip(counts)
        .enumerate()
        .map(|(index, (d, entries))| pages::Summary {
            index,
            name: &d.name,
            broker: d.broker.name(),
            url: &d.url,
            topic: &d.topic,
            entries,
        })
        .collect();
    pages::overview(&frame(&console, &caller), &summaries).into_response()
}

async fn list(
    State(console): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(index): Path<usize>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, Refused> {
    let frame = frame(&console, &caller);
    let dlq = dlq_of(&console, &frame, index)?;
    let get = |k: &str| query.get(k).cloned().unwrap_or_default();
    let form = FilterForm {
        kind: get("kind"),
        key: get("key"),
        since: get("since"),
        until: get("until"),
        error: get("error"),
    };
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

async fn entry(
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
struct Selected {
    action: String,
    ids: Vec<String>,
    filter: Option<FilterForm>,
}

impl Selected {
    fn of(form: &Form) -> Result<Self, String> {
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

    fn filter(&self) -> Result<DlqFilter, CliError> {
        match &self.filter {
            Some(f) => to_filter(f),
            None => Ok(DlqFilter {
                ids: Some(self.ids.clone()),
                ..DlqFilter::all()
            }),
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

async fn confirm(
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
async fn run_job(
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

async fn job_page(
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

async fn job_status(State(console): State<Shared>, Path(id): Path<u64>) -> Response {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_config_file_names_its_dlqs_and_refuses_what_it_does_not_know() {
        let targets = read_config(
            "[[dlq]]\nurl = \"kafka://127.0.0.1:9092\"\ntopic = \"orders\"\n\
             [[dlq]]\nname = \"payments\"\nurl = \"memory://x\"\ntopic = \"payments\"\n",
        )
        .unwrap();
        assert_eq!(targets.len(), 2);
        assert_eq!(targets[1].name.as_deref(), Some("payments"));
        assert!(read_config("[[dlq]]\nurl = \"x\"\ntopic = \"t\"\nport = 1\n").is_err());
        assert!(read_config("dlq = []\n").is_err());
    }

    #[tokio::test]
    async fn a_short_token_is_refused() {
        let err = Console::connect(Vec::new(), "short".into(), false)
            .await
            .unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn a_selection_names_its_action_and_entries() {
        let form = Form::parse(b"action=purge&scope=selected&id=a&id=b&csrf=x");
        let s = Selected::of(&form).unwrap();
        assert_eq!((s.action.as_str(), s.ids.len()), ("purge", 2));
        assert!(Selected::of(&Form::parse(b"action=drop&id=a")).is_err());
        assert!(Selected::of(&Form::parse(b"action=replay&scope=selected")).is_err());
        let by_filter =
            Selected::of(&Form::parse(b"action=replay&scope=filter&kind=deferred")).unwrap();
        assert_eq!(
            by_filter.filter().unwrap().error_kind,
            Some(event_retry::classify::FailureKind::Deferred)
        );
    }
}
