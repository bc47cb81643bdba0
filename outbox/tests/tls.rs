//! The outbox and the inbox on a PostgreSQL that takes TLS (`RETRY_TEST_POSTGRES_TLS`, a
//! `sslmode=verify-full` URL that `scripts/brokers start --tls` writes), on the service's own pool, and
//! what a connection that cannot be trusted comes back as: [`Kind::Security`].
//!
//! The trials run one at a time: one of them turns the server's TLS off for a while.

use std::path::PathBuf;

use event_retry_core::error::Kind;
use event_retry_core::event::Event;
use event_retry_outbox::{Inbox, Outbox, OutboxError, Record};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};

fn main() {
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads = Some(1);
    let trials = test_support::broker::trials(
        "postgres-tls",
        "RETRY_TEST_POSTGRES_TLS",
        &test_support::named_tests![
            the_outbox_and_the_inbox_run_on_the_services_verify_full_pool,
            a_certificate_from_another_ca_fails_at_connect_as_security,
            a_server_without_tls_fails_at_connect_as_security,
        ],
    );
    libtest_mimic::run(&args, trials).exit();
}

/// A fresh database on the server of `url`, and its URL with the same TLS settings.
async fn fresh_database(url: &str) -> Result<String, String> {
    let name = format!("tls_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(url)
        .await
        .map_err(|e| format!("connect over TLS: {e}"))?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .map_err(|e| format!("create database {name}: {e}"))?;
    Ok(test_support::broker::postgres_database(url, &name, None))
}

fn the_outbox_and_the_inbox_run_on_the_services_verify_full_pool(
    url: String,
) -> Result<(), String> {
    test_support::broker::runtime()?.block_on(async {
        let url = fresh_database(&url).await?;
        let database = url
            .split_once('?')
            .and_then(|(a, _)| a.rsplit_once('/'))
            .map(|(_, db)| db.to_string())
            .ok_or("no database in the URL")?;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .map_err(|e| format!("the service's pool: {e}"))?;
        let outbox = Outbox::from_pool(pool.clone())
            .await
            .map_err(|e| format!("outbox on the pool: {e}"))?;
        let inbox = Inbox::from_pool(pool.clone())
            .consumer("tls")
            .connect()
            .await
            .map_err(|e| format!("inbox on the pool: {e}"))?;
        // The business transaction: the inbox's record and the outbox's row commit together.
        let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
        let first = inbox
            .record_id(&mut *tx, "payment-1")
            .await
            .map_err(|e| e.to_string())?;
        outbox
            .enqueue(
                &mut *tx,
                "receipts",
                Event::new("paid").with_id("receipt-1"),
            )
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
        let again = inbox
            .record_id(&mut *tx, "payment-1")
            .await
            .map_err(|e| e.to_string())?;
        tx.rollback().await.map_err(|e| e.to_string())?;
        if first != Record::First || again != Record::AlreadyDone {
            return Err(format!("records {first:?} then {again:?}"));
        }
        let counts = outbox.counts().await.map_err(|e| e.to_string())?;
        if counts.pending != 1 {
            return Err(format!("{counts:?}: want the one enqueued row pending"));
        }
        // Every connection to this database — the pool's, which the outbox and the inbox share — is
        // encrypted, as the server itself reports.
        let (sessions, encrypted): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a
             JOIN pg_stat_ssl s USING (pid) WHERE a.datname = $1",
        )
        .bind(&database)
        .fetch_one(&pool)
        .await
        .map_err(|e| e.to_string())?;
        if sessions == 0 || encrypted != sessions {
            return Err(format!(
                "{encrypted} of {sessions} sessions on {database} use TLS"
            ));
        }
        // The URL path reaches the same server over TLS too.
        let own = Outbox::connect(&url)
            .await
            .map_err(|e| format!("outbox from the URL: {e}"))?;
        let seen = own.counts().await.map_err(|e| e.to_string())?;
        if seen.pending != 1 {
            return Err(format!("the URL's outbox sees {seen:?}"));
        }
        pool.close().await;
        Ok(())
    })
}

/// `err` is a connect failure of kind [`Kind::Security`].
fn security(what: &str, result: Result<(), OutboxError>) -> Result<(), String> {
    match result {
        Ok(()) => Err(format!("{what}: connected, want a refusal")),
        Err(e) if e.kind() == Kind::Security => Ok(()),
        Err(e) => Err(format!("{what}: {e} is {:?}, want security", e.kind())),
    }
}

fn a_certificate_from_another_ca_fails_at_connect_as_security(url: String) -> Result<(), String> {
    let dir = PathBuf::from(
        test_support::broker::url("RETRY_TEST_TLS_DIR").ok_or("RETRY_TEST_TLS_DIR is not set")?,
    );
    let (address, query) = url.split_once('?').ok_or("no settings in the URL")?;
    let settings: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some(("sslrootcert", _)) => {
                format!("sslrootcert={}", dir.join("other-ca.pem").display())
            }
            _ => kv.to_string(),
        })
        .collect();
    let untrusted = format!("{address}?{}", settings.join("&"));
    test_support::broker::runtime()?.block_on(async {
        security("the outbox", Outbox::connect(&untrusted).await.map(drop))?;
        security(
            "the inbox",
            Inbox::builder(&untrusted).connect().await.map(drop),
        )
    })
}

fn a_server_without_tls_fails_at_connect_as_security(url: String) -> Result<(), String> {
    test_support::broker::runtime()?.block_on(async {
        // Turned off in the server's configuration and back on, whatever happens in between; the
        // session doing it was opened over TLS and stays.
        let mut admin = PgConnection::connect(&url)
            .await
            .map_err(|e| format!("connect over TLS: {e}"))?;
        let refused = match set_ssl(&mut admin, &url, "ALTER SYSTEM SET ssl = off", "off").await {
            Ok(()) => {
                async {
                    security("the outbox", Outbox::connect(&url).await.map(drop))?;
                    security("the inbox", Inbox::builder(&url).connect().await.map(drop))
                }
                .await
            }
            Err(e) => Err(e),
        };
        // Reset on every path: an `ssl = off` left in postgresql.auto.conf would outlive the test.
        let reset = set_ssl(&mut admin, &url, "ALTER SYSTEM RESET ssl", "on").await;
        refused.and(reset)
    })
}

/// Runs `statement` (an `ALTER SYSTEM` of `ssl`), reloads, and waits until a new session sees `ssl`
/// as `want` (a reload is signalled, not awaited).
async fn set_ssl(
    admin: &mut PgConnection,
    url: &str,
    statement: &'static str,
    want: &str,
) -> Result<(), String> {
    sqlx::query(statement)
        .execute(&mut *admin)
        .await
        .map_err(|e| format!("{statement}: {e}"))?;
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut *admin)
        .await
        .map_err(|e| format!("reload: {e}"))?;
    let plain = url.replace("sslmode=verify-full", "sslmode=disable");
    let mut seen = String::new();
    for _ in 0..100 {
        if let Ok(mut session) = PgConnection::connect(&plain).await {
            seen = sqlx::query_scalar("SHOW ssl")
                .fetch_one(&mut session)
                .await
                .map_err(|e| format!("SHOW ssl: {e}"))?;
            if seen == want {
                return Ok(());
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(format!(
        "ssl is {seen:?} 10 s after {statement}, want {want}"
    ))
}
