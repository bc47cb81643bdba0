//! What the inbox costs a consumer: events/s of a handler that writes its effect in a transaction, with
//! the inbox's record in that transaction and without, on SQLite and on PostgreSQL when
//! `RETRY_TEST_POSTGRES` is set; and with the inbox as the consumer's idempotency store instead.
//!
//! ```text
//! scripts/brokers start postgres && source target/brokers/env.sh
//! cargo bench -p event-retry-outbox --bench inbox
//! ```
//!
//! Each round: 3,000 events already on the in-process broker (so the broker costs next to nothing and
//! the database is what is measured), one consumer with 8 handlers at a time; a handler opens a
//! transaction, inserts one effect row and commits. `plain` does only that; `inbox` also records the
//! event id first (`Inbox::record`, one upsert); `store` leaves the handler as `plain` and gives the
//! consumer the inbox as its idempotency store (a claim before the handler, a mark after it: two more
//! statements, each its own transaction). Rounds alternate and the best of three of each is kept.

use std::time::{Duration, Instant};

use event_retry::Broker;
use event_retry_core::event::Event;
use event_retry_core::runtime::{Context, handler_fn};
use event_retry_outbox::{Inbox, database_error};
use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

type Error = Box<dyn std::error::Error + Send + Sync>;

const EVENTS: usize = 3_000;
const ROUNDS: usize = 3;

/// How a round guards its handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    Inbox,
    Store,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Inbox => "inbox",
            Mode::Store => "store",
        }
    }
}

fn main() -> Result<(), Error> {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    sqlx::any::install_default_drivers();
    runtime.block_on(async {
        let dir = std::env::temp_dir();
        let file = dir.join(format!("event-retry-inbox-bench-{}.db", std::process::id()));
        let mut dbs = vec![("sqlite", format!("sqlite:{}?mode=rwc", file.display()))];
        match test_support::broker::url("RETRY_TEST_POSTGRES") {
            Some(pg) => dbs.push(("postgres", pg)),
            None => eprintln!("SKIP postgres: RETRY_TEST_POSTGRES is not set"),
        }
        for (name, url) in dbs {
            let pool = AnyPoolOptions::new()
                .max_connections(8)
                .connect(&url)
                .await?;
            sqlx::query("DROP TABLE IF EXISTS bench_effects")
                .execute(&pool)
                .await?;
            sqlx::query("CREATE TABLE bench_effects (event_id TEXT NOT NULL, body TEXT NOT NULL)")
                .execute(&pool)
                .await?;
            let mut best = [0.0_f64; 3];
            for round in 0..ROUNDS {
                for (i, mode) in [Mode::Plain, Mode::Inbox, Mode::Store]
                    .into_iter()
                    .enumerate()
                {
                    let rate = run(&url, &pool, mode, &format!("r{round}")).await?;
                    println!(
                        "{name} {:<5} round {round}: {rate:>8.0} events/s",
                        mode.name()
                    );
                    best[i] = best[i].max(rate);
                }
            }
            println!(
                "{name}: plain {:.0}/s, inbox {:.0}/s, store {:.0}/s (best of {ROUNDS})",
                best[0], best[1], best[2]
            );
            println!("ratio inbox/plain {name}: {:.2}", best[1] / best[0]);
            println!("ratio store/plain {name}: {:.2}", best[2] / best[0]);
            pool.close().await;
        }
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
        Ok(())
    })
}

/// One round: events/s from the first handler call to the last acknowledgement.
async fn run(url: &str, pool: &AnyPool, mode: Mode, round: &str) -> Result<f64, Error> {
    let topic = format!("bench-{}-{round}", mode.name());
    let inbox = Inbox::builder(url)
        .consumer(format!("bench-{}-{round}", mode.name()))
        .connect()
        .await?;
    let broker = Broker::memory();
    broker.admin().declare(&topic, None).await?;
    let producer = broker.producer();
    for i in 0..EVENTS {
        producer
            .publish(
                &topic,
                Event::new(format!("{{\"n\":{i}}}")).with_id(format!("{topic}-{i}")),
            )
            .await?;
    }
    let (h_pool, h_inbox) = (pool.clone(), inbox.clone());
    let handler = handler_fn(move |event: Event, ctx: Context| {
        let (pool, inbox) = (h_pool.clone(), h_inbox.clone());
        async move {
            let mut tx = pool.begin().await.map_err(database_error)?;
            if mode == Mode::Inbox && !inbox.record(&mut *tx, &ctx).await?.is_first() {
                return Ok(());
            }
            sqlx::query("INSERT INTO bench_effects (event_id, body) VALUES ($1, $2)")
                .bind(ctx.event_id.to_string())
                .bind(String::from_utf8_lossy(&event.payload).into_owned())
                .execute(&mut *tx)
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(())
        }
    });
    let mut consumer = broker.consumer(&topic).concurrency(8);
    if mode == Mode::Store {
        consumer = consumer.idempotency(inbox.clone());
    }
    let started = Instant::now();
    let handle = consumer.start(handler).await?;
    let stats = tokio::time::timeout(
        Duration::from_secs(300),
        handle.wait_until(|s| s.succeeded + s.dead_lettered >= EVENTS as u64),
    )
    .await?;
    let elapsed = started.elapsed();
    handle.shutdown().await?;
    if stats.succeeded != EVENTS as u64 {
        return Err(format!("{} round: {stats:?}", mode.name()).into());
    }
    Ok(EVENTS as f64 / elapsed.as_secs_f64())
}
