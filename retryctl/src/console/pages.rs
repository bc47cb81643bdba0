//! The console's pages, rendered on the server (maud escapes every value it writes): the overview of the
//! DLQs with each one's failure groups (a chart per group of when its entries died), one DLQ's list with its filters and counts, one entry, the confirmation before a replay or a
//! purge, a running job, the login form and a refusal. Times are UTC with their age, as in the CLI.

use std::collections::BTreeMap;

use event_retry::DeadLetter;
use event_retry_core::classify::FailureKind;
use event_retry_core::dlq::FailureGroup;
use event_retry_core::time::Timestamp;
use maud::{DOCTYPE, Markup, html};

use crate::render;

/// What every page needs to know of the request.
pub(crate) struct Frame<'a> {
    /// The CSRF token forms carry (empty for a bearer caller).
    pub(crate) csrf: &'a str,
    /// Whether the console only shows.
    pub(crate) read_only: bool,
}

/// A page: the common header, then `body`.
pub(crate) fn layout(
    title: &str,
    frame: Option<&Frame<'_>>,
    refresh: bool,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if refresh {
                    noscript { meta http-equiv="refresh" content="1"; }
                }
                title { (title) " · event-retry DLQ console" }
                link rel="stylesheet" href="/static/console.css";
            }
            body {
                header {
                    a.brand href="/" { "event-retry · DLQ console" }
                    @if let Some(frame) = frame {
                        @if frame.read_only { span.badge { "read-only" } }
                        form.inline method="post" action="/logout" {
                            input type="hidden" name="csrf" value=(frame.csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The login form; `failed` after a wrong token.
pub(crate) fn login(failed: bool) -> Markup {
    layout(
        "Sign in",
        None,
        false,
        html! {
            h1 { "Sign in" }
            p { "This console needs its access token (" code { "RETRYCTL_TOKEN" } " or " code { "--token-file" } " of " code { "retryctl serve" } ")." }
            @if failed { p.error { "That is not the token." } }
            form method="post" action="/login" {
                label for="token" { "Access token" }
                input #token type="password" name="token" autocomplete="current-password" autofocus;
                button type="submit" { "Sign in" }
            }
        },
    )
}

/// A refused request, with why.
pub(crate) fn refused(frame: Option<&Frame<'_>>, reason: &str) -> Markup {
    layout(
        "Refused",
        frame,
        false,
        html! {
            h1 { "Refused" }
            p.error #refusal { (reason) }
            p { a href="/" { "Back to the overview" } }
        },
    )
}

/// One DLQ as the overview lists it.
pub(crate) struct Summary<'a> {
    pub(crate) index: usize,
    pub(crate) name: &'a str,
    pub(crate) broker: &'a str,
    pub(crate) url: &'a str,
    pub(crate) topic: &'a str,
    /// The number of entries, or why it could not be read.
    pub(crate) entries: Result<usize, String>,
    /// Its failure groups, the largest first.
    pub(crate) groups: Vec<FailureGroup>,
}

/// Hours the overview's chart of each failure group covers.
pub(crate) const CHART_HOURS: usize = 48;

/// A group's dead letters per hour over the last [`CHART_HOURS`], as a small bar chart (the latest
/// hour on the right), with a text alternative.
fn chart(group: &FailureGroup, now: Timestamp) -> Markup {
    let counts = group.per_hour(now, CHART_HOURS);
    let most = counts.iter().copied().max().unwrap_or(0);
    let max = most.max(1);
    let (bar, height) = (3, 24);
    let width = bar * CHART_HOURS;
    let label = format!(
        "{} in the last {CHART_HOURS} hours, at most {most} in one hour",
        render::counted(counts.iter().sum(), "dead letter", "dead letters"),
    );
    html! {
        svg.chart width=(width) height=(height) viewBox={ "0 0 " (width) " " (height) } role="img" aria-label=(label) {
            title { (label) }
            @for (i, n) in counts.iter().enumerate() {
                @if *n > 0 {
                    @let h = (n * height).div_ceil(max).max(1);
                    rect x=(i * bar) y=(height - h) width=(bar - 1) height=(h) {}
                }
            }
        }
    }
}

/// The overview: every DLQ the console shows, with its count.
pub(crate) fn overview(frame: &Frame<'_>, dlqs: &[Summary<'_>]) -> Markup {
    layout(
        "Dead letter queues",
        Some(frame),
        false,
        html! {
            h1 { "Dead letter queues" }
            @let now = Timestamp::now();
            table #dlqs {
                thead { tr { th { "DLQ" } th { "broker" } th { "URL" } th { "source topic" } th.num { "entries" } } }
                tbody {
                    @for d in dlqs {
                        tr {
                            td { a href={ "/dlq/" (d.index) } { (d.name) } }
                            td { (d.broker) }
                            td { code { (d.url) } }
                            td { (d.topic) }
                            @match &d.entries {
                                Ok(n) => td.num.count { (n) },
                                Err(e) => td.error { "unreadable: " (e) },
                            }
                        }
                    }
                }
            }
            @for d in dlqs {
                @if !d.groups.is_empty() {
                    h2 { "Failure groups of " (d.name) }
                    table.groups id={ "groups-" (d.index) } {
                        thead { tr {
                            th { "group" } th.num { "entries" } th { "error kind" } th { "cause" }
                            th { "last " (CHART_HOURS) " h" } th { "last dead at (UTC)" }
                        } }
                        tbody {
                            @for g in &d.groups {
                                tr.group {
                                    td { a href={ "/dlq/" (d.index) "?group=" (g.fingerprint) } { code { (g.fingerprint) } } }
                                    td.num { (g.count) }
                                    td { (kind_name(g.error_kind)) }
                                    td.error-text title=(g.sample_error) { (g.pattern.chars().take(120).collect::<String>()) }
                                    td { (chart(g, now)) }
                                    td { (g.last_dead_at().map_or("-".to_string(), render::time_ago)) }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// The filter form's values, as the user typed them.
#[derive(Clone, Debug, Default)]
pub(crate) struct FilterForm {
    pub(crate) kind: String,
    pub(crate) key: String,
    pub(crate) since: String,
    pub(crate) until: String,
    pub(crate) error: String,
    pub(crate) group: String,
}

impl FilterForm {
    /// The form from its named values (`get` answers `""` for a field not given).
    pub(crate) fn from_fields(get: impl Fn(&str) -> String) -> Self {
        FilterForm {
            kind: get("kind"),
            key: get("key"),
            since: get("since"),
            until: get("until"),
            error: get("error"),
            group: get("group"),
        }
    }

    /// The filter as hidden fields, so a confirmation carries it on.
    fn hidden(&self) -> Markup {
        html! {
            input type="hidden" name="kind" value=(self.kind);
            input type="hidden" name="key" value=(self.key);
            input type="hidden" name="since" value=(self.since);
            input type="hidden" name="until" value=(self.until);
            input type="hidden" name="error" value=(self.error);
            input type="hidden" name="group" value=(self.group);
        }
    }
}

/// What a DLQ's list shows.
pub(crate) struct ListView<'a> {
    pub(crate) index: usize,
    pub(crate) name: &'a str,
    pub(crate) broker: &'a str,
    pub(crate) filter: &'a FilterForm,
    /// Every entry in the DLQ.
    pub(crate) all: &'a [DeadLetter],
    /// The entries the filter selects.
    pub(crate) matching: &'a [&'a DeadLetter],
    /// Why the filter was not understood, if it was not.
    pub(crate) filter_error: Option<String>,
}

fn kind_name(kind: Option<FailureKind>) -> &'static str {
    kind.map_or("-", FailureKind::as_str)
}

fn reason_name(entry: &DeadLetter) -> String {
    entry
        .dead()
        .map_or("-".to_string(), |d| d.reason.to_string())
}

/// Counts by a label, in label order.
fn tally<'e>(
    entries: impl Iterator<Item = &'e DeadLetter>,
    label: impl Fn(&DeadLetter) -> String,
) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for e in entries {
        *counts.entry(label(e)).or_insert(0) += 1;
    }
    counts
}

/// A DLQ's entries with the filter form, the counts, and the actions.
pub(crate) fn list(frame: &Frame<'_>, view: &ListView<'_>) -> Markup {
    let by_kind = tally(view.all.iter(), |e| {
        kind_name(e.event.metadata().error_kind).to_string()
    });
    let by_reason = tally(view.all.iter(), reason_name);
    let f = view.filter;
    html! {
        h1 { (view.name) }
        p.counts {
            span #total { (render::counted(view.all.len(), "dead letter", "dead letters")) }
            " in this DLQ (" (view.broker) "); "
            span #matching { (view.matching.len()) } " match the filter."
        }
        p.counts {
            "By error kind: "
            @for (kind, n) in &by_kind { span.chip { (kind) " " (n) } }
            " · by reason: "
            @for (reason, n) in &by_reason { span.chip { (reason) " " (n) } }
        }
        form #filter method="get" action={ "/dlq/" (view.index) } {
            label { "error kind "
                select name="kind" {
                    option value="" selected[f.kind.is_empty()] { "any" }
                    @for k in FailureKind::ALL {
                        option value=(k.as_str()) selected[f.kind == k.as_str()] { (k.as_str()) }
                    }
                }
            }
            label { "key " input type="text" name="key" value=(f.key); }
            label { "since " input type="text" name="since" value=(f.since) placeholder="2h or 2026-11-24T10:00:00Z"; }
            label { "until " input type="text" name="until" value=(f.until) placeholder="30m"; }
            label { "error text " input type="text" name="error" value=(f.error); }
            label { "failure group " input type="text" name="group" value=(f.group) size="12"; }
            button type="submit" { "Filter" }
            " " a href={ "/dlq/" (view.index) } { "clear" }
        }
        @if let Some(e) = &view.filter_error { p.error { (e) } }
        form #entries method="post" action={ "/dlq/" (view.index) "/confirm" } {
            input type="hidden" name="csrf" value=(frame.csrf);
            input type="hidden" name="scope" value="selected";
            table {
                thead { tr {
                    @if !frame.read_only { th { "" } }
                    th { "dead at (UTC)" } th { "event id" } th { "reason" } th { "error kind" }
                    th.num { "attempts" } th { "key" } th { "last error" }
                } }
                tbody {
                    @for e in view.matching {
                        @let m = e.event.metadata();
                        tr.entry {
                            @if !frame.read_only {
                                td { input type="checkbox" name="id" value=(e.id) aria-label={ "select " (e.id) }; }
                            }
                            td { (e.dead().map_or("-".to_string(), |d| render::time_ago(d.at))) }
                            td { a.open href={ "/dlq/" (view.index) "/entry/" (urlencode(&e.id)) } { (m.event_id.as_deref().unwrap_or(&e.id)) } }
                            td { (reason_name(e)) }
                            td.kind { (kind_name(m.error_kind)) }
                            td.num { (m.attempts) }
                            td { (e.event.key.as_deref().map_or("-".to_string(), render::text_or_hex)) }
                            td.error-text { (m.last_error.as_deref().map_or("-".to_string(), |t| t.chars().take(120).collect())) }
                        }
                    }
                }
            }
            @if !frame.read_only && !view.matching.is_empty() {
                p.actions {
                    button #replay-selected type="submit" name="action" value="replay" { "Replay selected" }
                    " "
                    button #purge-selected.danger type="submit" name="action" value="purge" { "Purge selected" }
                }
            }
        }
        @if !frame.read_only && !view.matching.is_empty() && view.filter_error.is_none() {
            form #by-filter method="post" action={ "/dlq/" (view.index) "/confirm" } {
                input type="hidden" name="csrf" value=(frame.csrf);
                input type="hidden" name="scope" value="filter";
                (f.hidden())
                p.actions {
                    button #replay-matching type="submit" name="action" value="replay" { "Replay all " (view.matching.len()) " matching" }
                    " "
                    button #purge-matching.danger type="submit" name="action" value="purge" { "Purge all " (view.matching.len()) " matching" }
                }
            }
        }
    }
}

/// A path segment with everything but unreserved characters escaped (a space as `%20`: a path does not
/// read `+` as one).
pub(crate) fn urlencode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// The type shown beside a header: the broker's own, where it typed the header, else the broker's
/// plain form for what the SDK writes.
fn header_type(broker: &str, entry: &DeadLetter, name: &str, value: &[u8]) -> String {
    if let Some(kind) = entry.native.type_of(name) {
        return kind.to_string();
    }
    let text = std::str::from_utf8(value).is_ok();
    match (broker, text) {
        ("rabbitmq", _) => "long-string",
        ("sqs", true) => "String",
        ("sqs", false) => "Binary",
        ("pulsar", true) => "string",
        ("pulsar", false) => "binary (base64)",
        _ => "bytes",
    }
    .to_string()
}

/// One entry: its metadata in human times, its history, headers with their types, what the broker holds
/// besides, the payload, and the actions.
pub(crate) fn entry(
    frame: &Frame<'_>,
    index: usize,
    dlq_name: &str,
    broker: &str,
    e: &DeadLetter,
) -> Markup {
    let m = e.event.metadata();
    let (format, shown) = render::payload(&e.event.payload);
    let fields = render::entry_fields(e);
    html! {
        p { a href={ "/dlq/" (index) } { "← " (dlq_name) } }
        h1 { "Dead letter " (m.event_id.as_deref().unwrap_or(&e.id)) }
        table #metadata.fields {
            @for (name, value) in &fields { tr { th { (name) } td { (value) } } }
        }
        h2 { "History" }
        ol #history {
            @if let Some(t) = m.first_seen { li { "first seen " (render::time_ago(t)) @if let Some(o) = &m.origin { " on " (o.topic) } } }
            li {
                (render::counted(m.attempts as usize, "failed attempt", "failed attempts")) ", "
                (render::counted(m.retries as usize, "retry", "retries")) " through the broker"
                @if let Some(d) = m.last_delay { " (the last after " (render::duration(d)) ")" }
            }
            @if let Some(err) = &m.last_error { li { "last error (" (kind_name(m.error_kind)) "): " (err) } }
            @if m.replay_count > 0 {
                li { "replayed by an operator " (render::counted(m.replay_count as usize, "time", "times"))
                     @if let Some(t) = m.replayed_at { ", last " (render::time_ago(t)) } }
            }
            @if let Some(d) = e.dead() {
                li { "dead-lettered (" (d.reason) ") " (render::time_ago(d.at)) " by " (d.consumer) }
            }
        }
        h2 { "Headers" }
        table #headers {
            thead { tr { th { "name" } th { "type" } th { "value" } } }
            tbody {
                @for (name, value) in e.event.headers.iter() {
                    tr { td { (name) } td.type { (header_type(broker, e, name, value)) } td { code { (render::text_or_hex(value)) } } }
                }
            }
        }
        @if !e.native.properties.is_empty() {
            h2 { "Broker properties" }
            table #native.fields {
                @for (name, value) in &e.native.properties { tr { th { (name) } td { (value) } } }
            }
        }
        h2 { "Payload (" (render::counted(e.event.payload.len(), "byte", "bytes")) ", " (format) ")" }
        pre #payload { (shown) }
        @if !frame.read_only {
            form #entry-actions method="post" action={ "/dlq/" (index) "/confirm" } {
                input type="hidden" name="csrf" value=(frame.csrf);
                input type="hidden" name="scope" value="selected";
                input type="hidden" name="id" value=(e.id);
                button #replay-entry type="submit" name="action" value="replay" { "Replay" }
                " "
                button #purge-entry.danger type="submit" name="action" value="purge" { "Purge" }
            }
        }
    }
}

/// What a confirmation asks about.
pub(crate) struct Confirm<'a> {
    pub(crate) index: usize,
    pub(crate) dlq_name: &'a str,
    pub(crate) action: &'a str,
    /// The entries it selects (read just now).
    pub(crate) entries: &'a [&'a DeadLetter],
    /// The ids of those entries: the job acts on these.
    pub(crate) ids: &'a [String],
    /// The one-time token of this confirmation.
    pub(crate) nonce: &'a str,
}

/// "Replay 3 dead letters of orders?", with the entries and a button that does it.
pub(crate) fn confirm(frame: &Frame<'_>, c: &Confirm<'_>) -> Markup {
    let what = render::counted(c.entries.len(), "dead letter", "dead letters");
    let verb = if c.action == "purge" {
        "Purge"
    } else {
        "Replay"
    };
    html! {
        h1 { (verb) " " (what) " of " (c.dlq_name) "?" }
        @if c.action == "purge" {
            p.warning { "Purged entries are gone for good." }
        } @else {
            p { "Each goes back to its origin with its payload unedited and its attempts restarted, and leaves the DLQ once the broker confirmed the copy." }
        }
        ul #chosen {
            @for e in c.entries.iter().take(50) {
                li { (e.event.id().unwrap_or(&e.id)) " — " (reason_name(e)) ": " (e.event.metadata().last_error.as_deref().unwrap_or("-")) }
            }
            @if c.entries.len() > 50 { li { "… and " (c.entries.len() - 50) " more" } }
        }
        @if c.entries.is_empty() {
            p #nothing { "Nothing matches any more. " a href={ "/dlq/" (c.index) } { "Back to the DLQ" } }
        } @else {
            form #run method="post" action={ "/dlq/" (c.index) "/run" } {
                input type="hidden" name="csrf" value=(frame.csrf);
                input type="hidden" name="nonce" value=(c.nonce);
                input type="hidden" name="action" value=(c.action);
                input type="hidden" name="scope" value="selected";
                @for id in c.ids { input type="hidden" name="id" value=(id); }
                button #confirm type="submit" class=[(c.action == "purge").then_some("danger")] { "Confirm: " (verb.to_lowercase()) " " (what) }
                " "
                a href={ "/dlq/" (c.index) } { "Cancel" }
            }
        }
    }
}

/// A job's page: live progress (a small script polls its status; without scripts the page reloads).
pub(crate) fn job(
    id: u64,
    title: &str,
    dlq: usize,
    total: usize,
    done: usize,
    state: &super::jobs::State,
) -> Markup {
    use super::jobs::State;
    let (status, finished) = match state {
        State::Running => (format!("running: {done} of {total}"), false),
        State::Done(what) => (format!("done: {what}"), true),
        State::Failed(why) => (format!("failed after {done} of {total}: {why}"), true),
    };
    html! {
        h1 { (title) }
        div #job data-status={ "/jobs/" (id) "/status" } {
            progress #bar max=(total.max(1)) value=(if finished && total == 0 { 1 } else { done }) {}
            p #status.status { (status) }
        }
        p { a #back href={ "/dlq/" (dlq) } { "Back to the DLQ" } }
        script src="/static/console.js" {}
    }
}

/// The stylesheet.
pub(crate) const CSS: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#1d2430}\
header{display:flex;gap:1em;align-items:center;padding:.6em 1.2em;background:#1d2430;color:#fff}\
header a{color:#fff;text-decoration:none;font-weight:600}header form{margin-left:auto}\
main{padding:1em 1.5em}table{border-collapse:collapse;margin:.6em 0}\
th,td{border-bottom:1px solid #dde;padding:.3em .6em;text-align:left;vertical-align:top}\
td.num,th.num{text-align:right}.fields th{width:12em;color:#556}.chip{background:#eef;border-radius:1em;\
padding:.1em .6em;margin-right:.3em}.error{color:#a01010}.warning{color:#8a5a00}.badge{background:#8a5a00;\
padding:.1em .5em;border-radius:.3em}button{padding:.3em .9em}button.danger{background:#a01010;color:#fff;\
border:none}pre{background:#f4f5f8;padding:.8em;overflow:auto}form#filter label{margin-right:.8em}\
progress{width:30em;height:1.2em}.inline{display:inline}svg.chart rect{fill:#a01010}\
svg.chart{background:#f4f5f8;vertical-align:middle}";

/// The script of a job's page: polls the status until the job ends.
pub(crate) const JS: &str = r#"(function () {
  var job = document.getElementById("job");
  if (!job) { return; }
  var url = job.getAttribute("data-status");
  function tick() {
    fetch(url, { credentials: "same-origin" }).then(function (r) { return r.json(); }).then(function (s) {
      var bar = document.getElementById("bar");
      bar.max = Math.max(s.total, 1);
      bar.value = s.finished && s.total === 0 ? 1 : s.done;
      document.getElementById("status").textContent = s.status;
      if (!s.finished) { setTimeout(tick, 300); }
    }).catch(function () { setTimeout(tick, 1000); });
  }
  tick();
})();"#;

/// What the console does to `entry` in words, for reports: "replay", "purge".
pub(crate) fn verb(action: &str) -> &'static str {
    if action == "purge" { "purge" } else { "replay" }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_overview_shows_each_failure_group_with_its_chart_and_link() {
        let broker = event_retry::Broker::memory();
        crate::dlq::tests::dead_letters(&broker, "orders", 3).await;
        let entries = broker
            .dead_letters()
            .list("orders", &event_retry::DlqFilter::all())
            .await
            .unwrap();
        let groups = event_retry_core::dlq::failure_groups(&entries);
        let fingerprint = groups[0].fingerprint.to_string();
        let summary = Summary {
            index: 0,
            name: "orders",
            broker: "memory",
            url: "memory://",
            topic: "orders",
            entries: Ok(entries.len()),
            groups,
        };
        let frame = Frame {
            csrf: "t",
            read_only: false,
        };
        let page = overview(&frame, &[summary]).into_string();
        assert!(page.contains("Failure groups of orders"), "{page}");
        assert!(
            page.contains(&format!("href=\"/dlq/0?group={fingerprint}\"")),
            "{page}"
        );
        assert!(
            page.contains("<td>boom</td>") || page.contains(">boom</td>"),
            "{page}"
        );
        // Three entries in the latest hour: one bar, at the right end, of full height.
        assert_eq!(page.matches("<rect ").count(), 1, "{page}");
        assert!(
            page.contains(&format!("x=\"{}\"", 3 * (CHART_HOURS - 1))),
            "{page}"
        );
        assert!(
            page.contains("3 dead letters in the last 48 hours"),
            "{page}"
        );
    }
}
