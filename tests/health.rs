//! The health endpoints follow a consumer through each state, read over HTTP as a probe reads them:
//! running, held by a blocking error, unable to reach its broker while RabbitMQ restarts
//! (`RETRY_TEST_AMQP`, `scripts/brokers restart rabbitmq`), running again, and stopped after a shutdown;
//! and a consumer the broker refuses (its user's permissions revoked with `rabbitmqctl`) stopped by
//! failing, which fails `/livez` naming the failure.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use event_retry::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GETs `path` from the endpoint at `addr`: the status and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the health endpoint");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("send the request");
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .await
        .expect("read the answer");
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Polls `path` until it answers `status` with a body containing `text`; panics after `within`.
async fn wait_for(
    addr: std::net::SocketAddr,
    path: &str,
    status: u16,
    text: &str,
    within: Duration,
) -> String {
    let deadline = Instant::now() + within;
    loop {
        let (got, body) = get(addr, path).await;
        if got == status && body.contains(text) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{path} did not answer {status} with {text:?} within {within:?}; last: {got} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Publishes `id`, retrying while the broker comes back.
async fn publish(broker: &Broker, topic: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match broker
            .producer()
            .publish(topic, Event::new(id.to_string()).with_id(id))
            .await
        {
            Ok(_) => return,
            Err(e) if Instant::now() < deadline => {
                eprintln!("publish {id}: {e}; again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("publish {id}: {e}"),
        }
    }
}

/// `rabbitmqctl -n $RETRY_TEST_AMQP_NODE ARGS`; panics with its output when it fails.
async fn rabbitmqctl(args: &[&str]) {
    let node = std::env::var("RETRY_TEST_AMQP_NODE")
        .expect("RETRY_TEST_AMQP_NODE names the RabbitMQ node (scripts/brokers start rabbitmq)");
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(["-n", &node])
        .args(args)
        .output()
        .await
        .expect("run rabbitmqctl");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_fails_naming_the_failure_once_the_broker_refuses_a_consumer() {
    let url = std::env::var("RETRY_TEST_AMQP")
        .expect("RETRY_TEST_AMQP names the RabbitMQ broker (scripts/brokers start rabbitmq)");
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let (user, password) = (format!("health-refused-{millis}"), "refused-later");
    rabbitmqctl(&["add_user", &user, password]).await;
    rabbitmqctl(&["set_permissions", "-p", "/", &user, ".*", ".*", ".*"]).await;
    // The same broker and virtual host as the user the suite connects with, as this test's user.
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let as_user = format!("{scheme}://{user}:{password}@{host}");

    let admin = event_retry::connect(&url).await.expect("connect");
    let topic = format!("health-refused-{millis}");
    admin.admin().declare(&topic, None).await.expect("declare");
    let broker = event_retry::connect(&as_user)
        .await
        .expect("connect as the test's user");
    let app = App::new().consumer(
        broker
            .consumer(&topic)
            .give_up_receiving_after(3, Duration::from_secs(1)),
        handler_fn(|_event: Event, _ctx: Context| async { Ok(()) }),
    );
    let health = app.health();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(event_retry::health::serve(listener, health));
    let running = tokio::spawn(app.run_until(std::future::pending::<()>()));
    wait_for(
        addr,
        "/livez",
        200,
        "livez check passed",
        Duration::from_secs(30),
    )
    .await;
    wait_for(
        addr,
        "/readyz",
        200,
        "readyz check passed",
        Duration::from_secs(30),
    )
    .await;

    // The broker refuses the consumer from now on: no permission, and its connection closed.
    rabbitmqctl(&["clear_permissions", "-p", "/", &user]).await;
    rabbitmqctl(&[
        "close_all_user_connections",
        &user,
        "permissions revoked by the test",
    ])
    .await;
    let body = wait_for(
        addr,
        "/livez",
        503,
        "stopped by a failure",
        Duration::from_secs(60),
    )
    .await;
    assert!(body.contains("livez check failed"), "{body}");
    let lower = body.to_lowercase();
    assert!(
        lower.contains("access") || lower.contains("refused"),
        "/livez names the failure: {body}"
    );
    let (ready, body) = get(addr, "/readyz").await;
    assert_eq!(ready, 503, "a failed consumer is not ready: {body}");
    running.abort();
    rabbitmqctl(&["delete_user", &user]).await;
    let _ = admin.admin().delete(&topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_follow_a_hold_a_broker_restart_and_a_shutdown() {
    let url = std::env::var("RETRY_TEST_AMQP")
        .expect("RETRY_TEST_AMQP names the RabbitMQ broker (scripts/brokers start rabbitmq)");
    let broker = event_retry::connect(&url).await.expect("connect");
    let topic = format!(
        "health-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis()
    );
    broker.admin().declare(&topic, None).await.expect("declare");

    let database_down = Arc::new(AtomicBool::new(false));
    let down = database_down.clone();
    let app = App::new().consumer(
        broker.consumer(&topic),
        handler_fn(move |_event: Event, _ctx: Context| {
            let down = down.load(Ordering::SeqCst);
            async move {
                if down {
                    Err(HandlerError::blocking("database down"))
                } else {
                    Ok(())
                }
            }
        }),
    );
    let health = app.health();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(event_retry::health::serve(listener, health.clone()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(app.run_until(async {
        let _ = stopped.await;
    }));

    // Running.
    wait_for(
        addr,
        "/readyz",
        200,
        "readyz check passed",
        Duration::from_secs(30),
    )
    .await;

    // Held by a blocking error: live, not ready, and the reason is shown; ready again once it heals.
    database_down.store(true, Ordering::SeqCst);
    publish(&broker, &topic, "held-1").await;
    let body = wait_for(addr, "/readyz", 503, "held for", Duration::from_secs(30)).await;
    assert!(body.contains("database down"), "{body}");
    let (live, body) = get(addr, "/livez").await;
    assert_eq!(live, 200, "a held consumer is alive: {body}");
    database_down.store(false, Ordering::SeqCst);
    wait_for(addr, "/readyz", 200, "[+]", Duration::from_secs(40)).await;

    // The broker restarts: while it is down the consumer cannot receive, and says so.
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(u16, String)>::new()));
    let watching = Arc::new(AtomicBool::new(true));
    let poller = tokio::spawn({
        let (seen, watching) = (seen.clone(), watching.clone());
        async move {
            while watching.load(Ordering::SeqCst) {
                let answer = get(addr, "/readyz").await;
                seen.lock().unwrap_or_else(|p| p.into_inner()).push(answer);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/brokers");
    let out = tokio::process::Command::new("bash")
        .args([script, "restart", "rabbitmq"])
        .output()
        .await
        .expect("run scripts/brokers restart rabbitmq");
    assert!(
        out.status.success(),
        "restart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    publish(&broker, &topic, "after-restart").await;
    wait_for(addr, "/readyz", 200, "[+]", Duration::from_secs(60)).await;
    watching.store(false, Ordering::SeqCst);
    poller.await.expect("the poller");
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let unreachable = seen
        .iter()
        .find(|(status, body)| *status == 503 && body.contains("receiving has failed"));
    assert!(
        unreachable.is_some(),
        "no answer said the consumer could not receive during the restart; answers: {:?}",
        seen.iter().map(|(s, _)| s).collect::<Vec<_>>()
    );

    // Shut down: no longer ready, but not failed, so still live.
    let _ = stop.send(());
    running
        .await
        .expect("the app's task")
        .expect("the app stops cleanly");
    let body = wait_for(addr, "/readyz", 503, "stopped", Duration::from_secs(5)).await;
    assert!(body.contains("readyz check failed"), "{body}");
    let (live, body) = get(addr, "/livez").await;
    assert_eq!(
        live, 200,
        "a consumer shut down on purpose is alive: {body}"
    );
    let _ = broker.admin().delete(&topic).await;
}
