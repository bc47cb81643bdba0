//! `retryctl outbox` against a real SQLite outbox (and PostgreSQL when `RETRY_TEST_POSTGRES` is set):
//! list, show, replay and purge, and the refusals the lifecycle makes.

#![allow(clippy::unwrap_used)]

use clap::Parser;
use event_retry::Event;
use event_retry_outbox::Outbox;
use retryctl::{Cli, CliError};
use sqlx::Connection;

async fn run(args: &[&str]) -> Result<String, CliError> {
    let cli = Cli::try_parse_from(std::iter::once("retryctl").chain(args.iter().copied()))
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let mut out = Vec::new();
    retryctl::run(cli, &mut out).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

async fn exercise(url: &str) {
    // Three rows: one left PENDING, one made PUBLISHED and one DEAD (as a relay would leave them).
    let outbox = Outbox::connect(url).await.expect("connect");
    let ids = enqueue(url, &outbox).await;
    let set = |state: &str, id: i64| {
        format!(
            "UPDATE event_retry_outbox SET state = '{state}', attempts = 3, last_error = 'broker said no', \
             dead_at = 1 WHERE id = {id}"
        )
    };
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(url).await.expect("connect");
    for (state, id) in [("PUBLISHED", ids[1]), ("DEAD", ids[2])] {
        sqlx::query(sqlx::AssertSqlSafe(set(state, id)))
            .execute(&mut conn)
            .await
            .expect("update");
    }

    let list = run(&["outbox", "--db", url, "list"]).await.expect("list");
    assert!(
        list.starts_with("3 rows (1 PENDING, 1 PUBLISHED, 1 DEAD)"),
        "{list}"
    );
    assert!(list.contains("last_error=broker said no"), "{list}");
    let dead = run(&[
        "outbox", "--db", url, "list", "--state", "dead", "--topic", "orders",
    ])
    .await
    .expect("list");
    assert!(dead.starts_with("1 row (1 DEAD)"), "{dead}");
    let recent = run(&["outbox", "--db", url, "list", "--since", "1h"])
        .await
        .expect("list");
    assert!(recent.starts_with("3 rows"), "{recent}");
    let future = run(&[
        "outbox",
        "--db",
        url,
        "list",
        "--since",
        "2999-01-01T00:00:00Z",
    ])
    .await
    .expect("list");
    assert!(future.starts_with("0 rows"), "{future}");

    let shown = run(&["outbox", "--db", url, "show", &ids[2].to_string()])
        .await
        .expect("show");
    for field in [
        "event_id",
        "state         DEAD",
        "attempts      3",
        "available_at",
        "claimed_at",
        "last_error    broker said no",
        "replay_count",
        "header        content-type: application/json",
        "payload",
    ] {
        assert!(shown.contains(field), "{field} missing from\n{shown}");
    }
    assert!(!shown.contains("Some("), "debug text in\n{shown}");

    let e = run(&["outbox", "--db", url, "replay"]).await.unwrap_err();
    assert!(e.to_string().contains("needs --all or a filter"), "{e}");
    let e = run(&["outbox", "--db", url, "replay", "--state", "pending"])
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("cannot take a replay: only DEAD rows can"),
        "{e}"
    );
    assert_eq!(e.exit_code(), 2);
    let e = run(&["outbox", "--db", url, "replay", "--id", &ids[1].to_string()])
        .await
        .unwrap_err();
    assert!(e.to_string().contains(&format!("row {}", ids[1])), "{e}");

    let replayed = run(&["outbox", "--db", url, "replay", "--state", "dead"])
        .await
        .expect("replay");
    assert_eq!(replayed.trim(), "replayed 1 row: PENDING again, due now");
    let row = outbox.get(ids[2]).await.expect("get");
    assert_eq!(
        (row.state.as_str(), row.attempts, row.replay_count),
        ("PENDING", 0, 1)
    );
    assert_eq!(
        row.last_error.as_deref(),
        Some("broker said no"),
        "last_error is kept"
    );

    let e = run(&["outbox", "--db", url, "purge", "--state", "published"])
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("purge would remove 1 row; add --yes"),
        "{e}"
    );
    let e = run(&[
        "outbox", "--db", url, "purge", "--state", "pending", "--yes",
    ])
    .await
    .unwrap_err();
    assert!(e.to_string().contains("cannot take a purge"), "{e}");
    let purged = run(&[
        "outbox",
        "--db",
        url,
        "purge",
        "--state",
        "published",
        "--yes",
    ])
    .await
    .expect("purge");
    assert_eq!(purged.trim(), "purged 1 row");
    let list = run(&["outbox", "--db", url, "list"]).await.expect("list");
    assert!(list.starts_with("2 rows (2 PENDING)"), "{list}");
}

async fn enqueue(url: &str, outbox: &Outbox) -> Vec<i64> {
    let mut ids = Vec::new();
    for n in 0..3 {
        let event = Event::json(&serde_json::json!({ "n": n }))
            .expect("json")
            .with_key(format!("k{n}"));
        if url.starts_with("sqlite") {
            let mut conn = sqlx::SqliteConnection::connect(url).await.expect("connect");
            let mut tx = conn.begin().await.expect("begin");
            outbox
                .enqueue(&mut *tx, "orders", event)
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
        } else {
            let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
            let mut tx = conn.begin().await.expect("begin");
            outbox
                .enqueue(&mut *tx, "orders", event)
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
        }
    }
    for row in outbox
        .list(&event_retry_outbox::RowFilter::all())
        .await
        .expect("list")
    {
        ids.push(row.id);
    }
    ids
}

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    // Without RETRY_TEST_POSTGRES the PostgreSQL trial is listed as ignored with the reason (a loud,
    // counted skip), or fails when RETRY_TEST_REQUIRE names postgres.
    let mut trials = test_support::broker::trials(
        "postgres",
        "RETRY_TEST_POSTGRES",
        &test_support::named_tests![outbox_commands_on_postgres],
    );
    trials.push(libtest_mimic::Trial::test(
        "outbox_commands_on_sqlite",
        || outbox_commands_on_sqlite().map_err(Into::into),
    ));
    libtest_mimic::run(&args, trials).exit();
}

fn outbox_commands_on_sqlite() -> Result<(), String> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let file = dir.join(format!("retryctl-outbox-{}.db", uuid::Uuid::new_v4()));
    test_support::broker::runtime()?.block_on(exercise(&format!("sqlite:{}", file.display())));
    Ok(())
}

fn outbox_commands_on_postgres(admin: String) -> Result<(), String> {
    test_support::broker::runtime()?.block_on(async {
        let name = format!("retryctl_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .map_err(|e| format!("create database: {e}"))?;
        exercise(&test_support::broker::postgres_database(
            &admin, &name, None,
        ))
        .await;
        Ok(())
    })
}
