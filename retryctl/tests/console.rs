//! `retryctl serve` in a real browser (Debian's chromium, driven through chromedriver) over a real
//! RabbitMQ, with the DLQ's state read with lapin, RabbitMQ's own client.
//!
//! Six events are dead-lettered (three non-retryable with a JSON payload, three whose policy ran out);
//! then: without the token every page refuses (401) and a wrong token is refused; the browser signs in
//! through the form, sees the counts, filters by error kind, opens an entry (pretty JSON, headers with
//! their AMQP types, times with their age), replays it and purges another through the confirmation and
//! the live job page — the DLQ queue and the group's work queue, read with lapin, change by one each
//! time; a state change with the session but without its CSRF token is refused, and so is one a page on
//! another origin makes the browser send; a request naming another host (DNS rebinding) is turned away;
//! a confirmation posted twice acts once; a read-only console shows no actions and refuses changes; the
//! broker URL's password never appears on a page.
//! A screenshot of each view is saved under `target/console/`.
//!
//! Needs `RETRY_TEST_AMQP` and chromedriver (`RETRY_TEST_CHROMEDRIVER`, else `chromedriver` on the
//! PATH); either missing is a loud skip, or a failure when `RETRY_TEST_REQUIRE` names `rabbitmq` or
//! `browser`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use event_retry::{Broker, Context, Event, HandlerError, RetryPolicy, handler_fn};
use fantoccini::{Client, ClientBuilder, Locator};
use libtest_mimic::{Arguments, Failed, Trial};
use retryctl::console::{Console, Target};
use test_support::broker::{Test, required_brokers, runtime};

/// The console's access token in this test.
const TOKEN: &str = "console-test-token-0123456789";

fn main() {
    let args = Arguments::from_args();
    let test: Test = console_in_the_browser;
    let trials = match chromedriver_path() {
        Some(_) => test_support::broker::trials(
            "rabbitmq",
            "RETRY_TEST_AMQP",
            &[("rabbitmq::console_in_the_browser", test)],
        ),
        None if required_brokers().iter().any(|b| b == "browser") => {
            vec![Trial::test("rabbitmq::console_in_the_browser", || {
                Err(Failed::from(
                    "RETRY_TEST_REQUIRE names browser but chromedriver is not installed \
                     (apt-get install chromium chromium-driver)",
                ))
            })]
        }
        None => {
            eprintln!("SKIP rabbitmq::console_in_the_browser: chromedriver is not installed");
            vec![Trial::test("rabbitmq::console_in_the_browser", || Ok(())).with_ignored_flag(true)]
        }
    };
    libtest_mimic::run(&args, trials).exit();
}

fn chromedriver_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("RETRY_TEST_CHROMEDRIVER") {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| PathBuf::from(dir).join("chromedriver"))
        .find(|p| p.is_file())
}

/// chromedriver on a free loopback port, stopped when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Result<Self, String> {
        let path = chromedriver_path().ok_or("no chromedriver")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let child = Command::new(path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start chromedriver: {e}"))?;
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("chromedriver did not listen within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(driver)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless chromium session.
async fn browser(driver: &Driver) -> Result<Client, String> {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000"],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .map_err(|e| format!("a chromium session: {e}"))
}

/// Where the screenshots go.
fn shots() -> Result<PathBuf, String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/console");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(dir)
}

async fn screenshot(client: &Client, name: &str) -> Result<(), String> {
    let png = client.screenshot().await.map_err(|e| e.to_string())?;
    std::fs::write(shots()?.join(format!("{name}.png")), png).map_err(|e| e.to_string())
}

async fn text(client: &Client, css: &str) -> Result<String, String> {
    client
        .find(Locator::Css(css))
        .await
        .map_err(|e| format!("{css}: {e}"))?
        .text()
        .await
        .map_err(|e| e.to_string())
}

async fn click(client: &Client, css: &str) -> Result<(), String> {
    client
        .find(Locator::Css(css))
        .await
        .map_err(|e| format!("{css}: {e}"))?
        .click()
        .await
        .map_err(|e| format!("click {css}: {e}"))
}

/// Waits (bounded) until the element `css` holds text starting with `prefix`; returns the text.
async fn wait_text(client: &Client, css: &str, prefix: &str) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(t) = text(client, css).await
            && t.starts_with(prefix)
        {
            return Ok(t);
        }
        if Instant::now() > deadline {
            return Err(format!("{css} never started with {prefix:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many messages RabbitMQ holds in `queue`, read with lapin.
async fn depth(amqp: &str, queue: &str) -> Result<u32, String> {
    raw_brokers::RawRabbit::new(amqp)
        .depth(queue)
        .await
        .map_err(|e| format!("queue {queue}: {e}"))
}

/// Waits (bounded) until `queue` holds `want` messages.
async fn expect_depth(amqp: &str, queue: &str, want: u32) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = depth(amqp, queue).await?;
        if n == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{queue} holds {n} messages, want {want}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One HTTP request outside the browser: status, the whole `Set-Cookie` header and body.
fn http(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, Option<String>, String), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into();
    let mut response = if method == "POST" {
        let mut req = agent.post(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.content_type("application/x-www-form-urlencoded")
            .send(body)
    } else {
        let mut req = agent.get(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.call()
    }
    .map_err(|e| format!("{method} {url}: {e}"))?;
    let cookie = response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    Ok((status, cookie, body))
}

/// The value that follows `marker` in `page`, up to the next quote.
fn attribute_after(page: &str, marker: &str) -> Result<String, String> {
    let start = page
        .find(marker)
        .ok_or(format!("no {marker} in the page"))?
        + marker.len();
    let end = page[start..].find('"').ok_or("an unterminated attribute")?;
    Ok(page[start..start + end].to_string())
}

/// The status of a `GET /` to `addr` naming `host` in its `Host` header (written by hand: HTTP clients
/// set the header from the URL).
fn raw_status(addr: SocketAddr, host: &str) -> Result<u16, String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(format!("not an HTTP answer: {answer}"))
}

/// Runs `http` off the runtime's threads.
async fn http_async(
    method: &'static str,
    url: String,
    headers: Vec<(&'static str, String)>,
    body: &'static str,
) -> Result<(u16, Option<String>, String), String> {
    tokio::task::spawn_blocking(move || {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        http(method, &url, &h, body)
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Serves `console` on a free loopback port; returns its address and what stops it.
async fn start(console: Console) -> Result<(SocketAddr, tokio::sync::oneshot::Sender<()>), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(retryctl::console::serve(console, listener, async move {
        let _ = stopped.await;
    }));
    Ok((addr, stop))
}

/// A page on another origin that makes the browser post a purge of everything to the console.
async fn forger(
    console: SocketAddr,
) -> Result<(SocketAddr, tokio::sync::oneshot::Sender<()>), String> {
    let page = format!(
        "<!DOCTYPE html><html><body><form id=\"f\" method=\"post\" action=\"http://{console}/dlq/0/run\">\
         <input name=\"action\" value=\"purge\"><input name=\"scope\" value=\"filter\"></form>\
         <script>document.getElementById('f').submit();</script></body></html>"
    );
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let page = page.clone();
            async move { axum::response::Html(page) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await;
    });
    Ok((addr, stop))
}

/// Dead-letters three non-retryable events (JSON payload, key customer-1, a header) and three whose
/// policy ran out (key customer-2).
async fn seed(broker: &Broker, topic: &str) -> Result<(), String> {
    let consumer = broker
        .consumer(topic)
        .name("console-seed")
        .policy(RetryPolicy::parse("10ms x1").map_err(|e| e.to_string())?)
        .start(handler_fn(|event: Event, _c: Context| async move {
            if event.id().is_some_and(|id| id.starts_with("bad")) {
                Err(HandlerError::non_retryable("order has quantity -1"))
            } else {
                Err(HandlerError::deferred("stock service unavailable"))
            }
        }))
        .await
        .map_err(|e| e.to_string())?;
    let producer = broker.producer();
    for i in 0..3 {
        let bad = Event::json(&serde_json::json!({ "id": i, "quantity": -1 }))
            .map_err(|e| e.to_string())?
            .with_id(format!("bad-{i}"))
            .with_key("customer-1")
            .with_header("trace", format!("trace-{i}"));
        producer
            .publish(topic, bad)
            .await
            .map_err(|e| e.to_string())?;
        let late = Event::new(format!("order {i}"))
            .with_id(format!("late-{i}"))
            .with_key("customer-2");
        producer
            .publish(topic, late)
            .await
            .map_err(|e| e.to_string())?;
    }
    tokio::time::timeout(
        Duration::from_secs(30),
        consumer.wait_until(|s| s.dead_lettered >= 6),
    )
    .await
    .map_err(|_| "the six events were not dead-lettered within 30 s")?;
    consumer.shutdown().await.map_err(|e| e.to_string())
}

fn console_in_the_browser(amqp: String) -> Result<(), String> {
    let driver = Driver::start()?;
    runtime()?.block_on(async move {
        let broker = event_retry::connect(&amqp)
            .await
            .map_err(|e| e.to_string())?;
        let topic = format!("console-{}", uuid::Uuid::new_v4().simple());
        broker
            .admin()
            .declare(&topic, None)
            .await
            .map_err(|e| e.to_string())?;
        seed(&broker, &topic).await?;
        let names = broker
            .admin()
            .names(&topic, None)
            .await
            .map_err(|e| e.to_string())?;
        let group_queue = format!("{topic}:{}", event_retry_core::adapter::default_group(&topic));
        expect_depth(&amqp, &names.dlq, 6).await?;

        let target = || Target {
            name: Some("orders".into()),
            url: amqp.clone(),
            topic: topic.clone(),
        };
        let console = Console::connect(vec![target()], TOKEN.into(), false)
            .await
            .map_err(|e| e.to_string())?;
        let (addr, stop) = start(console).await?;
        let base = format!("http://{addr}");

        // Without the token: refused, and nothing of the DLQ shown.
        for path in ["/", "/dlq/0", "/jobs/1/status"] {
            let (status, _, body) = http_async("GET", format!("{base}{path}"), vec![], "").await?;
            if status != 401 || body.contains("bad-0") {
                return Err(format!("GET {path} without the token: {status}"));
            }
        }
        // A wrong bearer token is answered after a second, one caller at a time: two guesses at once
        // take two seconds.
        let wrong = || vec![("Authorization", "Bearer not-the-token-at-all".to_string())];
        let guessed = Instant::now();
        let (first, second) = tokio::join!(
            http_async("GET", format!("{base}/dlq/0"), wrong(), ""),
            http_async("GET", format!("{base}/"), wrong(), ""),
        );
        let guesses_took = guessed.elapsed();
        for (status, _, body) in [first?, second?] {
            if status != 401 || body.contains("bad-0") {
                return Err(format!("a wrong bearer token: {status}, want 401"));
            }
        }
        if guesses_took < Duration::from_secs(2) {
            return Err(format!(
                "two wrong bearer tokens at once were answered in {guesses_took:?}, want one a second"
            ));
        }
        let bearer = vec![("Authorization", format!("Bearer {TOKEN}"))];
        let (status, _, body) =
            http_async("GET", format!("{base}/dlq/0"), bearer.clone(), "").await?;
        if status != 200 || !body.contains("6 dead letters") {
            return Err(format!("with the bearer token: {status}"));
        }
        // A session without its CSRF token cannot change anything.
        let (status, cookie, _) = http_async("POST", format!("{base}/login"), vec![], "").await?;
        if status != 401 || cookie.is_some() {
            return Err(format!("a login without the token: {status} {cookie:?}"));
        }
        let login_body: &'static str = Box::leak(format!("token={TOKEN}").into_boxed_str());
        let (status, cookie, _) =
            http_async("POST", format!("{base}/login"), vec![], login_body).await?;
        let set_cookie = cookie
            .filter(|_| status == 303)
            .ok_or(format!("login: {status}"))?;
        let attributes: Vec<&str> = set_cookie.split(';').map(str::trim).collect();
        for wanted in ["HttpOnly", "SameSite=Strict"] {
            if !attributes.contains(&wanted) {
                return Err(format!("the session cookie lacks {wanted}: {set_cookie}"));
            }
        }
        let cookie = attributes[0].to_string();
        let (status, _, body) = http_async(
            "POST",
            format!("{base}/dlq/0/run"),
            vec![("Cookie", cookie.clone())],
            "action=purge&scope=filter",
        )
        .await?;
        if status != 403 || !body.contains("CSRF") {
            return Err(format!("a change without the CSRF token: {status}"));
        }
        expect_depth(&amqp, &names.dlq, 6).await?;

        // A page of another site reaching the console through a name that resolves to 127.0.0.1 (DNS
        // rebinding) names another host: turned away.
        let status = tokio::task::spawn_blocking(move || raw_status(addr, "rebound.example.com"))
            .await
            .map_err(|e| e.to_string())??;
        if status != 421 {
            return Err(format!(
                "a request for another host name: {status}, want 421"
            ));
        }

        let client = browser(&driver).await?;
        let result = browse(&client, &base, &amqp, &names.dlq, &group_queue).await;
        let _ = client.close().await;
        result?;

        // A confirmation is used once: the same form posted twice purges one entry, not two.
        let session = vec![("Cookie", cookie.clone())];
        let (_, _, list) = http_async("GET", format!("{base}/dlq/0"), session.clone(), "").await?;
        let csrf = attribute_after(&list, "name=\"csrf\" value=\"")?;
        let id = attribute_after(&list, "name=\"id\" value=\"")?;
        let form: &'static str =
            Box::leak(format!("csrf={csrf}&action=purge&scope=selected&id={id}").into_boxed_str());
        let (_, _, confirm) = http_async(
            "POST",
            format!("{base}/dlq/0/confirm"),
            session.clone(),
            form,
        )
        .await?;
        let nonce = attribute_after(&confirm, "name=\"nonce\" value=\"")?;
        let run: &'static str = Box::leak(format!("{form}&nonce={nonce}").into_boxed_str());
        let (first, _, _) =
            http_async("POST", format!("{base}/dlq/0/run"), session.clone(), run).await?;
        expect_depth(&amqp, &names.dlq, 3).await?;
        let (again, _, body) =
            http_async("POST", format!("{base}/dlq/0/run"), session, run).await?;
        if first != 303 || again != 409 || !body.contains("used already") {
            return Err(format!("a confirmation posted twice: {first} then {again}"));
        }
        expect_depth(&amqp, &names.dlq, 3).await?;
        let _ = stop.send(());

        // Read-only: no actions on the pages, and a change is refused even with the token.
        let console = Console::connect(vec![target()], TOKEN.into(), true)
            .await
            .map_err(|e| e.to_string())?;
        let (addr, stop) = start(console).await?;
        let ro = format!("http://{addr}");
        let (status, _, body) =
            http_async("GET", format!("{ro}/dlq/0"), bearer.clone(), "").await?;
        if status != 200 || body.contains("Purge selected") || !body.contains("read-only") {
            return Err(format!("the read-only list: {status}"));
        }
        let (status, _, body) = http_async(
            "POST",
            format!("{ro}/dlq/0/run"),
            bearer,
            "action=purge&scope=filter",
        )
        .await?;
        if status != 403 || !body.contains("read-only") {
            return Err(format!("a change on a read-only console: {status}"));
        }
        expect_depth(&amqp, &names.dlq, 3).await?;
        let _ = stop.send(());
        broker
            .admin()
            .delete(&topic)
            .await
            .map_err(|e| e.to_string())
    })
}

/// The browser part: sign in, filter, open, replay one, purge one, and the cross-origin refusal.
async fn browse(
    client: &Client,
    base: &str,
    amqp: &str,
    dlq: &str,
    group_queue: &str,
) -> Result<(), String> {
    let err = |e: fantoccini::error::CmdError| e.to_string();
    client.goto(&format!("{base}/")).await.map_err(err)?;
    let title = text(client, "h1").await?;
    if title != "Sign in" {
        return Err(format!("without a session the console shows {title:?}"));
    }
    screenshot(client, "login").await?;
    client
        .find(Locator::Css("#token"))
        .await
        .map_err(err)?
        .send_keys(TOKEN)
        .await
        .map_err(err)?;
    click(client, "form button[type=submit]").await?;
    let count = wait_text(client, "#dlqs td.count", "6").await?;
    if count != "6" {
        return Err(format!("the overview counts {count}"));
    }
    // The broker URL carries a password (guest's): the page shows it as ***.
    let overview = client.source().await.map_err(err)?;
    if overview.contains(":guest@") || !overview.contains(":***@") {
        return Err("the overview shows the broker URL's password".into());
    }
    screenshot(client, "overview").await?;

    click(client, "#dlqs a").await?;
    wait_text(client, "#total", "6 dead letters").await?;
    screenshot(client, "list").await?;
    client
        .find(Locator::Css("select[name=kind]"))
        .await
        .map_err(err)?
        .select_by_value("non_retryable")
        .await
        .map_err(err)?;
    click(client, "#filter button[type=submit]").await?;
    wait_text(client, "#matching", "3").await?;
    let rows = client
        .find_all(Locator::Css("tr.entry"))
        .await
        .map_err(err)?;
    for row in &rows {
        let kind = row
            .find(Locator::Css("td.kind"))
            .await
            .map_err(err)?
            .text()
            .await
            .map_err(err)?;
        if kind != "non_retryable" {
            return Err(format!("the filter let through a {kind} entry"));
        }
    }
    if rows.len() != 3 {
        return Err(format!("{} rows match non_retryable, want 3", rows.len()));
    }
    screenshot(client, "filtered").await?;

    click(client, "tr.entry a.open").await?;
    let payload = wait_text(client, "#payload", "{").await?;
    let headers = text(client, "#headers").await?;
    let metadata = text(client, "#metadata").await?;
    if !payload.contains("\n  \"quantity\": -1")
        || !headers.contains("trace long-string trace-")
        || !metadata.contains("non_retryable")
        || !metadata.contains(" ago)")
        || !text(client, "#history")
            .await?
            .contains("dead-lettered (non_retryable)")
    {
        return Err(format!("the entry view:\n{payload}\n{headers}\n{metadata}"));
    }
    screenshot(client, "entry").await?;

    // Replay this entry: the DLQ loses it, the group's work queue gets it.
    let before = depth(amqp, group_queue).await?;
    click(client, "#replay-entry").await?;
    wait_text(client, "#confirm", "Confirm: replay 1 dead letter").await?;
    screenshot(client, "confirm").await?;
    click(client, "#confirm").await?;
    let done = wait_text(client, "#status", "done").await?;
    if done != "done: replayed 1 dead letter to their origin" {
        return Err(format!("the replay job says {done:?}"));
    }
    screenshot(client, "job").await?;
    expect_depth(amqp, dlq, 5).await?;
    expect_depth(amqp, group_queue, before + 1).await?;

    // Purge one selected in the list.
    click(client, "#back").await?;
    wait_text(client, "#total", "5 dead letters").await?;
    click(client, "tr.entry input[type=checkbox]").await?;
    click(client, "#purge-selected").await?;
    wait_text(client, "#confirm", "Confirm: purge 1 dead letter").await?;
    click(client, "#confirm").await?;
    wait_text(client, "#status", "done: purged 1 dead letter").await?;
    expect_depth(amqp, dlq, 4).await?;

    // A page on another origin posts a purge of everything with the browser's session: refused.
    let console: SocketAddr = base
        .trim_start_matches("http://")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let (forger, stop) = forger(console).await?;
    client
        .goto(&format!("http://{forger}/"))
        .await
        .map_err(err)?;
    let refusal = wait_text(client, "#refusal", "the request came from").await?;
    screenshot(client, "cross-site-refused").await?;
    let _ = stop.send(());
    if !refusal.contains("another origin") {
        return Err(format!("the cross-site purge was answered {refusal:?}"));
    }
    expect_depth(amqp, dlq, 4).await
}
