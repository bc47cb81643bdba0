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
#[doc(hidden)]
pub mod fuzzing;
mod handlers;
mod jobs;
mod pages;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use clap::Args;
use event_retry::Broker;
use event_retry_core::options::redact_url;
use serde::Deserialize;

use self::auth::Auth;
pub use self::auth::MIN_TOKEN_LEN;
use self::handlers::{
    confirm, css, entry, job_page, job_status, js, list, login, login_page, logout, overview,
    protective_headers, require_caller, run_job,
};
use self::jobs::Jobs;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::handlers::{Form, Selected};
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
            Some(event_retry_core::classify::FailureKind::Deferred)
        );
    }
}
