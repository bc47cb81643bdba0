//! The scenarios. Each title says exactly what it asserts.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use event_retry::Broker;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::time::Timestamp;
use event_retry_outbox::{Outbox, OutboxError, Retention, RowFilter, State};

use crate::Scenario;
use crate::fixture::{
    self, BrokerKind, Business, Column, Db, all_rows, broker_contents, count, events, fresh_db,
    fresh_topic, lost_and_duplicates, stall, states, wait_states,
};

pub(crate) const ALL: &[Scenario] = &[
    Scenario {
        name: "commit_publishes_rollback_does_not",
        restarts_database: false,
        title: "a committed event is published once with its business row; a rolled-back one never",
        run: |c| block_on(commit_publishes_rollback_does_not(c)),
        skip: |_| None,
    },
    Scenario {
        name: "every_lifecycle_transition",
        restarts_database: false,
        title: "every transition: claim, failed attempt (available_at later), spent → DEAD, replay, release, purge; forbidden ones refused",
        run: |c| block_on(every_lifecycle_transition(c)),
        skip: |_| None,
    },
    Scenario {
        name: "relay_killed_mid_batch",
        restarts_database: false,
        title: "a relay SIGKILLed mid-batch: its claimed rows return after the lease (no attempt counted) and every row is published; duplicates counted",
        run: |c| block_on(relay_killed_mid_batch(c)),
        skip: |_| None,
    },
    Scenario {
        name: "two_relays_race",
        restarts_database: false,
        title: "two relays over 10,000 rows: each row published exactly once, both relays publishing",
        run: |c| block_on(two_relays_race(c)),
        skip: |_| None,
    },
    Scenario {
        name: "broker_down_30s",
        restarts_database: false,
        title: "broker stalled 30 s: the relay backs off (bounded attempts), loses nothing, claims no row before its available_at (each claim in the outage checked)",
        run: |c| block_on(broker_down_30s(c)),
        skip: |_| None,
    },
    Scenario {
        name: "poison_row",
        restarts_database: false,
        title: "a poison row (unreadable headers; on Kafka also a payload over the size limit) goes DEAD at once with the reason; others publish",
        run: |c| block_on(poison_row(c)),
        skip: |_| None,
    },
    Scenario {
        name: "database_restarted",
        restarts_database: true,
        title: "the database restarted mid-run: the relay carries on and every row is published; duplicates counted",
        run: |c| block_on(database_restarted(c)),
        skip: |c| {
            (c.db == Db::Sqlite).then_some(
                "SQLite is embedded: there is no server to restart (the nearest fault, a killed relay process, is relay_killed_mid_batch)",
            )
        },
    },
    Scenario {
        name: "key_order",
        restarts_database: false,
        title: "ordered by key with two relays: each key's rows reach the broker in enqueue order; a held head holds only its key",
        run: |c| block_on(key_order(c)),
        skip: |_| None,
    },
    Scenario {
        name: "graceful_shutdown",
        restarts_database: false,
        title: "shutdown mid-stream finishes the batch in hand: no row left CLAIMED, nothing published twice, the rest published by the next relay",
        run: |c| block_on(graceful_shutdown(c)),
        skip: |_| None,
    },
    Scenario {
        name: "notification_wakes",
        restarts_database: false,
        title: "a commit wakes an idle relay (poll interval 60 s): published within 2 s",
        run: |c| block_on(notification_wakes(c)),
        skip: |_| None,
    },
];

fn block_on(
    f: impl std::future::Future<Output = Result<String, String>>,
) -> Result<String, String> {
    test_support::broker::runtime()?.block_on(f)
}

/// A scenario's database, topic, outbox and broker.
struct Setup {
    db_url: String,
    topic: String,
    outbox: Outbox,
    broker: Broker,
}

async fn setup(column: &Column, prefix: &str) -> Result<Setup, String> {
    let broker = event_retry::connect(&column.broker_url)
        .await
        .map_err(|e| format!("connect {}: {e}", column.broker.name()))?;
    let topic = fresh_topic(&broker, prefix).await?;
    let db_url = fresh_db(column).await?;
    let outbox = Outbox::connect(&db_url).await.map_err(|e| e.to_string())?;
    Ok(Setup {
        db_url,
        topic,
        outbox,
        broker,
    })
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}

async fn commit_publishes_rollback_does_not(column: Column) -> Result<String, String> {
    let s = setup(&column, "commit").await?;
    let mut business = Business::connect(&s.db_url).await?;
    let committed = business
        .orders(&s.outbox, &s.topic, events(3, None), true)
        .await?;
    let rolled_back = business
        .orders(&s.outbox, &s.topic, events(2, None), false)
        .await?;
    let relay = s
        .outbox
        .relay(s.broker.producer())
        .start()
        .map_err(|e| e.to_string())?;
    wait_states(
        &s.outbox,
        Duration::from_secs(20),
        "3 rows published",
        |m| count(m, State::Published) == 3,
    )
    .await?;
    // Give a wrongly published rolled-back event time to show up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.shutdown().await.map_err(|e| e.to_string())?;
    let rows = all_rows(&s.outbox).await?;
    ensure(rows.len() == 3, || {
        format!("the outbox holds {} rows, want the 3 committed", rows.len())
    })?;
    for row in &rows {
        ensure(
            row.attempts == 0
                && row.claimed_at.is_some()
                && row.published_at.is_some_and(|p| p >= row.created_at)
                && row.lease_until.is_none(),
            || format!("row {row:?} is not a clean PUBLISHED row"),
        )?;
    }
    ensure(business.order_count().await? == 3, || {
        "orders: want 3".into()
    })?;
    let held = broker_contents(&column, &s.broker, &s.topic).await?;
    let (lost, duplicates) = lost_and_duplicates(&committed, &held);
    ensure(lost.is_empty(), || format!("lost {lost:?}"))?;
    ensure(duplicates == 0, || format!("{duplicates} duplicates"))?;
    let leaked: Vec<&String> = rolled_back.iter().filter(|id| held.contains(id)).collect();
    ensure(leaked.is_empty(), || {
        format!("rolled-back events on the broker: {leaked:?}")
    })?;
    ensure(held.len() == 3, || {
        format!("the broker holds {} messages, want 3", held.len())
    })?;
    Ok("3 committed → 3 on the broker; 2 rolled back → 0".into())
}

async fn every_lifecycle_transition(column: Column) -> Result<String, String> {
    let s = setup(&column, "life").await?;
    let mut business = Business::connect(&s.db_url).await?;
    let ids = business
        .orders(&s.outbox, &s.topic, events(4, None), true)
        .await?;
    let rows = all_rows(&s.outbox).await?;
    ensure(
        rows.iter().all(|r| {
            r.state == State::Pending
                && r.attempts == 0
                && r.claimed_at.is_none()
                && r.last_error.is_none()
        }),
        || format!("enqueued rows are not fresh PENDING rows: {rows:?}"),
    )?;

    // The broker stops answering: claims, timeouts, retries later, then the policy is spent.
    let mut stall = stall(column.broker)?;
    let relay = s
        .outbox
        .relay(s.broker.producer())
        .policy(RetryPolicy::parse("1s x1").map_err(|e| e.render())?)
        .publish_timeout(Duration::from_millis(700))
        .lease(Duration::from_millis(2000))
        .in_flight(1)
        .broker_backoff(Duration::from_millis(100), Duration::from_millis(200))
        .start()
        .map_err(|e| e.to_string())?;
    let claimed = wait_states(&s.outbox, Duration::from_secs(5), "a row CLAIMED", |m| {
        count(m, State::Claimed) > 0
    })
    .await;
    let claimed_rows = s
        .outbox
        .list(&RowFilter::state(State::Claimed))
        .await
        .map_err(|e| e.to_string())?;
    claimed?;
    ensure(
        claimed_rows
            .iter()
            .all(|r| r.claimed_at.is_some() && r.lease_until.is_some() && r.claimed_by.is_some()),
        || format!("claimed rows without their lease: {claimed_rows:?}"),
    )?;
    // Wait for every row to be spent (2 attempts each) while the broker is still stalled.
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut seen_retry_wait = false;
    let mut seen_release = false;
    loop {
        let rows = all_rows(&s.outbox).await?;
        for r in &rows {
            if r.state == State::Pending && r.attempts == 1 {
                // The retry waits at least the policy's 1 s from the failure, which came after the claim.
                let earliest = r.claimed_at.map(|c| c.plus(Duration::from_secs(1)));
                seen_retry_wait |=
                    r.last_error.is_some() && earliest.is_some_and(|e| r.available_at >= e);
            }
        }
        seen_release |= relay.stats().released > 0;
        if rows.iter().all(|r| r.state == State::Dead) {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("rows not all DEAD within 40 s: {rows:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = relay.shutdown().await.map_err(|e| e.to_string())?;
    stall.resume()?;
    ensure(seen_retry_wait, || {
        "never saw a row PENDING with attempts 1, last_error and a later available_at".into()
    })?;
    let dead = all_rows(&s.outbox).await?;
    for r in &dead {
        ensure(
            r.attempts == 2
                && r.dead_at.is_some()
                && r.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("spent after 2 attempts")),
            || format!("a spent row is not DEAD after 2 attempts with the reason: {r:?}"),
        )?;
    }
    ensure(seen_release && stats.released > 0, || {
        format!("no row was released unstarted (stats {stats:?})")
    })?;

    // Forbidden transitions change nothing.
    let first = dead[0].id;
    let purge_pending = s.outbox.purge(&RowFilter::state(State::Pending)).await;
    ensure(
        matches!(purge_pending, Err(OutboxError::Forbidden { .. })),
        || format!("purging PENDING rows: {purge_pending:?}"),
    )?;
    // Replay: PENDING again, attempts 0, replay count 1, last_error kept; then published.
    let replayed = s
        .outbox
        .replay(&RowFilter::state(State::Dead))
        .await
        .map_err(|e| e.to_string())?;
    ensure(replayed == 4, || format!("replayed {replayed}, want 4"))?;
    let row = s.outbox.get(first).await.map_err(|e| e.to_string())?;
    ensure(
        row.state == State::Pending
            && row.attempts == 0
            && row.replay_count == 1
            && row.last_error.is_some(),
        || format!("a replayed row: {row:?}"),
    )?;
    let relay = s
        .outbox
        .relay(s.broker.producer())
        .start()
        .map_err(|e| e.to_string())?;
    wait_states(
        &s.outbox,
        Duration::from_secs(30),
        "replayed rows published",
        |m| count(m, State::Published) == 4,
    )
    .await?;
    relay.shutdown().await.map_err(|e| e.to_string())?;
    let again = s
        .outbox
        .replay(&RowFilter {
            ids: vec![first],
            ..RowFilter::default()
        })
        .await;
    ensure(matches!(again, Err(OutboxError::Forbidden { .. })), || {
        format!("replaying a PUBLISHED row: {again:?}")
    })?;
    let purged = s
        .outbox
        .purge(&RowFilter::state(State::Published))
        .await
        .map_err(|e| e.to_string())?;
    ensure(purged == 4 && all_rows(&s.outbox).await?.is_empty(), || {
        format!("purged {purged}")
    })?;
    let held = broker_contents(&column, &s.broker, &s.topic).await?;
    let (lost, duplicates) = lost_and_duplicates(&ids, &held);
    ensure(lost.is_empty(), || format!("lost {lost:?}"))?;
    Ok(format!(
        "4 rows: 2 attempts each → DEAD, {} released unstarted, replayed → published; {duplicates} duplicates (timed-out sends the client delivered later)",
        stats.released
    ))
}

/// The child process of `relay_killed_mid_batch`: runs a relay until it is killed.
pub(crate) fn child_relay() -> Option<ExitCode> {
    let db = std::env::var("OUTBOX_SUITE_CHILD_DB").ok()?;
    let broker_url = std::env::var("OUTBOX_SUITE_CHILD_BROKER").ok()?;
    let runtime = test_support::broker::runtime().ok()?;
    runtime.block_on(async move {
        let broker = event_retry::connect(&broker_url).await.ok()?;
        let outbox = Outbox::connect(&db).await.ok()?;
        // One publish at a time: a batch of 100 then takes a broker round trip per row, so the
        // parent sees the relay mid-batch however fast the broker is (with 100 in flight, SQLite to
        // Kafka published all 3,000 rows between two of its looks).
        let _relay = outbox
            .relay(broker.producer())
            .batch_size(100)
            .in_flight(1)
            .lease(Duration::from_secs(4))
            .publish_timeout(Duration::from_secs(2))
            .name("child")
            .start()
            .ok()?;
        tokio::time::sleep(Duration::from_secs(120)).await;
        Some(())
    });
    Some(ExitCode::from(3))
}

async fn relay_killed_mid_batch(column: Column) -> Result<String, String> {
    const ROWS: usize = 3000;
    let s = setup(&column, "kill").await?;
    let mut business = Business::connect(&s.db_url).await?;
    let ids = business
        .orders(&s.outbox, &s.topic, events(ROWS, None), true)
        .await?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = tokio::process::Command::new(exe)
        .env("OUTBOX_SUITE_CHILD_DB", &s.db_url)
        .env("OUTBOX_SUITE_CHILD_BROKER", &column.broker_url)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    let at_kill = wait_states(
        &s.outbox,
        Duration::from_secs(60),
        "the child relay mid-batch",
        |m| count(m, State::Published) >= ROWS / 10 && count(m, State::Claimed) > 0,
    )
    .await?;
    child.start_kill().map_err(|e| e.to_string())?; // SIGKILL
    let _ = child.wait().await;
    let after_kill = states(&s.outbox).await?;
    let claimed_at_kill = count(&after_kill, State::Claimed);
    // The killed relay's claims and their leases: no other relay may take those rows before then.
    let leases: HashMap<i64, Timestamp> = all_rows(&s.outbox)
        .await?
        .iter()
        // Claims are named `<relay>-<n>`.
        .filter(|r| {
            r.state == State::Claimed
                && r.claimed_by
                    .as_deref()
                    .is_some_and(|c| c.starts_with("child-"))
        })
        .filter_map(|r| Some((r.id, r.lease_until?)))
        .collect();
    ensure(!leases.is_empty(), || {
        "the child relay held no claim when it was killed".into()
    })?;
    let published_at_kill = count(&at_kill, State::Published);
    let killed_at = Instant::now();
    let relay = s
        .outbox
        .relay(s.broker.producer())
        .lease(Duration::from_secs(4))
        .publish_timeout(Duration::from_secs(2))
        .name("successor")
        .start()
        .map_err(|e| e.to_string())?;
    wait_states(
        &s.outbox,
        Duration::from_secs(90),
        "every row published after the kill",
        |m| count(m, State::Published) == ROWS,
    )
    .await?;
    let took = killed_at.elapsed();
    relay.shutdown().await.map_err(|e| e.to_string())?;
    let rows = all_rows(&s.outbox).await?;
    let counted: Vec<_> = rows.iter().filter(|r| r.attempts != 0).collect();
    ensure(counted.is_empty(), || {
        format!(
            "lease expiry counted as attempts on {} rows, e.g. {:?}",
            counted.len(),
            counted.first()
        )
    })?;
    // Each row the killed relay held was claimed again only once its lease had run out (the last
    // claim of a published row is the successor's).
    let early: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let lease = leases.get(&r.id)?;
            let claimed = r.claimed_at?;
            (claimed < *lease).then(|| {
                format!(
                    "row {} claimed again at {claimed}, its lease ran to {lease}",
                    r.id
                )
            })
        })
        .collect();
    ensure(early.is_empty(), || {
        format!(
            "{} of the killed relay's {} rows were taken before their lease ran out, e.g. {}",
            early.len(),
            leases.len(),
            early[0]
        )
    })?;
    let held = broker_contents(&column, &s.broker, &s.topic).await?;
    let (lost, duplicates) = lost_and_duplicates(&ids, &held);
    ensure(lost.is_empty(), || {
        format!("lost {} events, e.g. {:?}", lost.len(), lost.first())
    })?;
    Ok(format!(
        "{ROWS} rows; killed with {published_at_kill}+ published and {claimed_at_kill} CLAIMED ({} claims of the killed relay, each taken again only after its lease); all published {:.1} s later; lost 0, duplicates {duplicates}",
        leases.len(),
        took.as_secs_f64()
    ))
}

async fn two_relays_race(column: Column) -> Result<String, String> {
    const ROWS: usize = 10_000;
    let s = setup(&column, "race").await?;
    let mut business = Business::connect(&s.db_url).await?;
    let mut ids = Vec::with_capacity(ROWS);
    for chunk in events(ROWS, None).chunks(1000) {
        ids.extend(
            business
                .orders(&s.outbox, &s.topic, chunk.to_vec(), true)
                .await?,
        );
    }
    let second = Outbox::connect(&s.db_url)
        .await
        .map_err(|e| e.to_string())?;
    let a = s
        .outbox
        .relay(s.broker.producer())
        .name("a")
        .start()
        .map_err(|e| e.to_string())?;
    let b = second
        .relay(s.broker.producer())
        .name("b")
        .start()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    wait_states(
        &s.outbox,
        Duration::from_secs(120),
        "10,000 rows published",
        |m| count(m, State::Published) == ROWS,
    )
    .await?;
    let took = started.elapsed();
    let (a, b) = (
        a.shutdown().await.map_err(|e| e.to_string())?,
        b.shutdown().await.map_err(|e| e.to_string())?,
    );
    ensure(a.published > 0 && b.published > 0, || {
        format!(
            "one relay did all the work (a {}, b {}): no race",
            a.published, b.published
        )
    })?;
    ensure(a.lease_lost + b.lease_lost == 0, || {
        "a lease was lost while both lived".into()
    })?;
    let held = broker_contents(&column, &s.broker, &s.topic).await?;
    let (lost, duplicates) = lost_and_duplicates(&ids, &held);
    ensure(lost.is_empty(), || format!("lost {} events", lost.len()))?;
    ensure(duplicates == 0 && held.len() == ROWS, || {
        format!(
            "{duplicates} duplicates; the broker holds {} messages for {ROWS} rows",
            held.len()
        )
    })?;
    Ok(format!(
        "relay a {} + relay b {} = {ROWS}, each once on the broker ({:.0} rows/s)",
        a.published,
        b.published,
        ROWS as f64 / took.as_secs_f64()
    ))
}

/// The claims of rows seen by sampling the outbox: each new claim against the available_at its row had
/// while pending before it.
#[derive(Default)]
struct ClaimWatch {
    /// Per row: its last claim seen, and its available_at when last seen pending since then.
    rows: HashMap<i64, (Option<Timestamp>, Option<Timestamp>)>,
    /// New claims checked.
    checked: usize,
    /// New claims with no pending sample of their row since its previous claim (not checked).
    unobserved: usize,
    /// Claims before their row's available_at.
    early: Vec<String>,
}

impl ClaimWatch {
    fn sample(&mut self, rows: &[event_retry_outbox::OutboxRow]) {
        for r in rows {
            let (last_claim, due) = self.rows.entry(r.id).or_insert((r.claimed_at, None));
            if r.state == State::Pending {
                *due = Some(r.available_at);
            }
            if r.claimed_at.is_some() && r.claimed_at != *last_claim {
                match (r.claimed_at, *due) {
                    (Some(claimed), Some(available)) if claimed < available => {
                        self.early.push(format!(
                            "row {} claimed at {claimed}, available at {available}",
                            r.id
                        ))
                    }
                    (Some(_), Some(_)) => self.checked += 1,
                    _ => self.unobserved += 1,
                }
                *last_claim = r.claimed_at;
                *due = None;
            }
        }
    }
}

async fn broker_down_30s(column: Column) -> Result<String, String> {
    const ROWS: usize = 200;
    let s = setup(&column, "down").await?;
    let mut business = Business::connect(&s.db_url).await?;
    let ids = business
        .orders(&s.outbox, &s.topic, events(ROWS, None), true)
        .await?;
    let mut stall = stall(column.broker)?;
    let stalled_at = Instant::now();
    let relay = s
        .outbox
        .relay(s.broker.producer())
        .policy(RetryPolicy::parse("exp(1s, 8s, 2)").map_err(|e| e.render())?)
        .publish_timeout(Duration::from_secs(2))
        .lease(Duration::from_secs(5))
        .broker_backoff(Duration::from_millis(500), Duration::from_secs(8))
        .start()
        .map_err(|e| e.to_string())?;
    // Every claim during the outage, not only each row's last: the rows are read every 100 ms (a claim
    // lasts the 2 s publish timeout, a failed row waits at least 1 s), and each new claim — the probes
    // after the first batch failed — is checked against the available_at its row had while pending.
    let mut claims = ClaimWatch::default();
    while stalled_at.elapsed() < Duration::from_secs(30) {
        claims.sample(&all_rows(&s.outbox).await?);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure(claims.early.is_empty(), || {
        format!(
            "{} claims during the outage came before the row's available_at, e.g. {}",
            claims.early.len(),
            claims.early[0]
        )
    })?;
    // The probes: at least one per backoff (three or more are required below).
    ensure(claims.checked >= 3, || {
        format!(
            "only {} claims during the outage were seen with the row's due time before them",
            claims.checked
        )
    })?;
    let rows = all_rows(&s.outbox).await?;
    let attempts: u32 = rows.iter().map(|r| r.attempts).sum();
    let during = relay.stats();
    stall.resume()?;
    // The batch in flight when the broker stopped fails once per row (100, the default batch); after that
    // the relay probes one row at a time with a growing pause. Without the backoff every due row would be
    // tried again each time its own delay passed: 200 rows × 5 or more tries in 30 s.
    let probes = attempts.saturating_sub(100);
    ensure(attempts <= 100 + 15, || {
        format!(
            "{attempts} failed attempts in 30 s of outage ({probes} after the first batch): the relay hammers the broker"
        )
    })?;
    ensure(during.broker_backoffs >= 3, || {
        format!(
            "the relay backed off {} times in 30 s of outage",
            during.broker_backoffs
        )
    })?;
    ensure(count(&states(&s.outbox).await?, State::Dead) == 0, || {
        "a row died of the outage".into()
    })?;
    let resumed = Instant::now();
    wait_states(
        &s.outbox,
        Duration::from_secs(90),
        "every row published after the outage",
        |m| count(m, State::Published) == ROWS,
    )
    .await
    .map_err(|e| format!("{e}; the relay: {:?}", relay.stats()))?;
    let recovery = resumed.elapsed();
    relay.shutdown().await.map_err(|e| e.to_string())?;
    let rows = all_rows(&s.outbox).await?;
    let early: Vec<_> = rows
        .iter()
        .filter(|r| r.claimed_at.is_none_or(|c| c < r.available_at))
        .collect();
    ensure(early.is_empty(), || {
        format!(
            "{} rows claimed before available_at, e.g. {:?}",
            early.len(),
            early.first()
        )
    })?;
    let held = broker_contents(&column, &s.broker, &s.topic).await?;
    let (lost, duplicates) = lost_and_duplicates(&ids, &held);
    ensure(lost.is_empty(), || format!("lost {} events", lost.len()))?;
    Ok(format!(
        "{ROWS} rows; {attempts} failed attempts in 30 s (the batch in flight, then {probes} single-row probes; {} backoffs); {} claims during the outage checked against the due time before them ({} seen without one); all published {:.1} s after the broker came back; lost 0, duplicates {duplicates}",
        during.broker_backoffs,
        claims.checked,
        claims.unobserved,
        recovery.as_secs_f64()
    ))
}

async fn poison_row(column: Column) -> Result<String, String> {
    let s = setup(&column, "poison").await?;
    let mut business = Business::connect(&s.db_url).await?;
    let good = business
        .orders(&s.outbox, &s.topic, events(5, None), true)
        .await?;
    business
        .execute(&format!(
            "INSERT INTO event_retry_outbox (event_id, topic, payload, headers, state, attempts, replay_count, available_at, created_at)
             VALUES ('poison-headers', '{}', {}, '{{not json', 'PENDING', 0, 0, 0, 0)",
            s.topic,
            match column.db {
                Db::Sqlite => "X'00'",
                Db::Postgres => "'\\x00'::bytea",
            }
        ))
        .await?;
    let oversize = if column.broker == BrokerKind::Kafka {
        let big = event_retry_core::event::Event::new(vec![b'x'; 2 * 1024 * 1024])
            .with_id("poison-oversize");
        business
            .orders(&s.outbox, &s.topic, vec![big], true)
            .await?;
        true
    } else {
        false
    };
    let relay = s
        .outbox
        .relay(s.broker.producer())
        .start()
        .map_err(|e| e.to_string())?;
    let dead_want = 1 + usize::from(oversize);
    wait_states(
        &s.outbox,
        Duration::from_secs(30),
        "poison DEAD, others published",
        |m| count(m, State::Dead) == dead_want && count(m, State::Published) == 5,
    )
    .await?;
    relay.shutdown().await.map_err(|e| e.to_string())?;
    let dead = s.outbox.list(&RowFilter::state(State::Dead)).await;
    // The unreadable row cannot be listed as a row (its headers do not decode): list reports it.
    let listed = match dead {
        Err(e) => e.to_string(),
        Ok(rows) => format!("{rows:?}"),
    };
    ensure(listed.contains("headers column is not JSON"), || {
        format!("the unreadable row's reason is not shown: {listed}")
    })?;
    let mut reasons = vec!["unreadable headers".to_string()];
    if oversize {
        let big = s
            .outbox
            .list(&RowFilter {
                topic: Some(s.topic.clone()),
                state: Some(State::Dead),
                ..RowFilter::default()
            })
            .await;
        let text = format!("{big:?}");
        ensure(
            text.contains("permanent") && text.contains("attempts: 1"),
            || {
                format!(
                    "the oversized row is not DEAD after one permanent failure: {}",
                    &text[..text.len().min(600)]
                )
            },
        )?;
        reasons.push("oversized payload refused by Kafka".into());
    }
    let held = broker_contents(&column, &s.broker, &s.topic).await?;
    let (lost, _) = lost_and_duplicates(&good, &held);
    ensure(lost.is_empty(), || format!("good rows lost: {lost:?}"))?;
    ensure(!held.iter().any(|id| id.starts_with("poison")), || {
        "a poison row reached the broker".into()
    })?;
    Ok(format!(
        "DEAD at once: {}; 5 good rows published",
        reasons.join(", ")
    ))
}

async fn database_restarted(column: Column) -> Result<String, String> {
    const ROWS: usize = 3000;
    let s = setup(&column, "dbrestart").await?;
    let mut business = Business::connect(&s.db_url).await?;
    let ids = business
        .orders(&s.outbox, &s.topic, events(ROWS, None), true)
        .await?;
    drop(business);
    let relay = s
        .outbox
        .relay(s.broker.producer())
        .batch_size(50)
        .lease(Duration::from_secs(10))
        .publish_timeout(Duration::from_secs(2))
        .start()
        .map_err(|e| e.to_string())?;
    wait_states(
        &s.outbox,
        Duration::from_secs(60),
        "publishing under way",
        |m| count(m, State::Published) >= ROWS / 10,
    )
    .await?;
    let restart_took = fixture::restart_postgres(&column).await?;
    wait_states(
        &s.outbox,
        Duration::from_secs(90),
        "every row published after the restart",
        |m| count(m, State::Published) == ROWS,
    )
    .await?;
    let stats = relay.shutdown().await.map_err(|e| e.to_string())?;
    let held = broker_contents(&column, &s.broker, &s.topic).await?;
    let (lost, duplicates) = lost_and_duplicates(&ids, &held);
    ensure(lost.is_empty(), || format!("lost {} events", lost.len()))?;
    Ok(format!(
        "{ROWS} rows; PostgreSQL down and back in {:.1} s mid-run; relay kept running ({} published by it); lost 0, duplicates {duplicates}",
        restart_took.as_secs_f64(),
        stats.published
    ))
}

async fn key_order(column: Column) -> Result<String, String> {
    const KEYS: usize = 4;
    const PER_KEY: usize = 25;
    let s = setup(&column, "order").await?;
    let mut business = Business::connect(&s.db_url).await?;
    let ids = business
        .orders(
            &s.outbox,
            &s.topic,
            events(KEYS * PER_KEY, Some(KEYS)),
            true,
        )
        .await?;
    let rows = all_rows(&s.outbox).await?;
    let key_of: HashMap<String, Vec<u8>> = rows
        .iter()
        .map(|r| {
            (
                r.event_id.clone(),
                r.key.clone().unwrap_or_default().to_vec(),
            )
        })
        .collect();
    // Hold key-0's head as a failed head would be held: due in the future.
    let head = rows
        .iter()
        .find(|r| r.key.as_deref() == Some(b"key-0".as_slice()))
        .map(|r| r.id)
        .ok_or("no key-0 row")?;
    let later = Timestamp::now().plus(Duration::from_secs(4)).as_millis();
    business
        .execute(&format!(
            "UPDATE event_retry_outbox SET available_at = {later} WHERE id = {head}"
        ))
        .await?;
    let second = Outbox::connect(&s.db_url)
        .await
        .map_err(|e| e.to_string())?;
    let start = |o: &Outbox, name: &str| {
        o.relay(s.broker.producer())
            .ordered_by_key(true)
            .batch_size(10)
            .name(name)
            .start()
            .map_err(|e| e.to_string())
    };
    let (a, b) = (start(&s.outbox, "a")?, start(&second, "b")?);
    wait_states(
        &s.outbox,
        Duration::from_secs(30),
        "the other keys published",
        |m| count(m, State::Published) >= (KEYS - 1) * PER_KEY,
    )
    .await?;
    let held_key: Vec<_> = all_rows(&s.outbox)
        .await?
        .into_iter()
        .filter(|r| r.key.as_deref() == Some(b"key-0".as_slice()) && r.state == State::Published)
        .collect();
    ensure(held_key.is_empty(), || {
        format!(
            "{} key-0 rows published past their held head",
            held_key.len()
        )
    })?;
    wait_states(&s.outbox, Duration::from_secs(30), "all published", |m| {
        count(m, State::Published) == KEYS * PER_KEY
    })
    .await?;
    let (a, b) = (
        a.shutdown().await.map_err(|e| e.to_string())?,
        b.shutdown().await.map_err(|e| e.to_string())?,
    );
    let held = broker_contents(&column, &s.broker, &s.topic).await?;
    let (lost, duplicates) = lost_and_duplicates(&ids, &held);
    ensure(lost.is_empty() && duplicates == 0, || {
        format!("lost {lost:?}, duplicates {duplicates}")
    })?;
    for k in 0..KEYS {
        let key = format!("key-{k}").into_bytes();
        let want: Vec<&String> = ids
            .iter()
            .filter(|id| key_of.get(*id) == Some(&key))
            .collect();
        let got: Vec<&String> = held
            .iter()
            .filter(|id| key_of.get(*id) == Some(&key))
            .collect();
        ensure(want == got, || {
            format!("key-{k} reached the broker out of order")
        })?;
    }
    Ok(format!(
        "{KEYS} keys × {PER_KEY} rows in order (relay a {}, b {}); key-0 held 4 s by its head while the others went on",
        a.published, b.published
    ))
}

async fn notification_wakes(column: Column) -> Result<String, String> {
    let s = setup(&column, "wake").await?;
    let relay = s
        .outbox
        .relay(s.broker.producer())
        .poll_interval(Duration::from_secs(60))
        .retention(Retention::Keep(Duration::from_secs(3600)))
        .start()
        .map_err(|e| e.to_string())?;
    // Let it go idle on an empty table.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut business = Business::connect(&s.db_url).await?;
    let committed = Instant::now();
    business
        .orders(&s.outbox, &s.topic, events(1, None), true)
        .await?;
    let waited = wait_states(
        &s.outbox,
        Duration::from_secs(2),
        "published within 2 s of the commit",
        |m| count(m, State::Published) == 1,
    )
    .await;
    let took = committed.elapsed();
    relay.shutdown().await.map_err(|e| e.to_string())?;
    waited?;
    Ok(format!(
        "published {} ms after the commit",
        took.as_millis()
    ))
}

async fn graceful_shutdown(column: Column) -> Result<String, String> {
    const ROWS: usize = 3000;
    let s = setup(&column, "shutdown").await?;
    let mut business = Business::connect(&s.db_url).await?;
    let ids = business
        .orders(&s.outbox, &s.topic, events(ROWS, None), true)
        .await?;
    // Small batches, so the run lasts long enough to be caught mid-way: with the default batch a
    // fast machine publishes all 3,000 rows between two looks at the table.
    let relay = s
        .outbox
        .relay(s.broker.producer())
        .batch_size(10)
        .start()
        .map_err(|e| e.to_string())?;
    wait_states(
        &s.outbox,
        Duration::from_secs(60),
        "publishing under way",
        |m| count(m, State::Published) >= ROWS / 10 && count(m, State::Claimed) > 0,
    )
    .await?;
    let first = relay.shutdown().await.map_err(|e| e.to_string())?;
    let after = states(&s.outbox).await?;
    ensure(count(&after, State::Claimed) == 0, || {
        format!("rows left CLAIMED after shutdown: {after:?}")
    })?;
    let published_by_first = count(&after, State::Published);
    ensure(
        published_by_first as u64 == first.published && published_by_first < ROWS,
        || {
            format!(
                "the relay says {} published, the table {published_by_first}",
                first.published
            )
        },
    )?;
    let next = s
        .outbox
        .relay(s.broker.producer())
        .start()
        .map_err(|e| e.to_string())?;
    wait_states(
        &s.outbox,
        Duration::from_secs(60),
        "the rest published by the next relay",
        |m| count(m, State::Published) == ROWS,
    )
    .await?;
    next.shutdown().await.map_err(|e| e.to_string())?;
    let held = broker_contents(&column, &s.broker, &s.topic).await?;
    let (lost, duplicates) = lost_and_duplicates(&ids, &held);
    ensure(lost.is_empty() && duplicates == 0, || {
        format!("lost {}, duplicates {duplicates}", lost.len())
    })?;
    Ok(format!(
        "stopped after {published_by_first} of {ROWS}, none left CLAIMED; the next relay published the rest; lost 0, duplicates 0"
    ))
}
