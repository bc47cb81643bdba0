//! The outbox table and every statement that reads or moves its rows, for SQLite and PostgreSQL.
//!
//! One SQL text serves both databases: statements are written with `$1` parameters and turned into
//! SQLite's `?1` form, and the one real difference — PostgreSQL's `FOR UPDATE SKIP LOCKED`, which lets
//! relays claim side by side without waiting on each other — is a clause added for it. SQLite needs no
//! such clause: a claim is one `UPDATE … RETURNING` statement and SQLite runs one writer at a time, so two
//! relays on one file can never claim the same row.
//!
//! Every state change is a conditional `UPDATE` whose `WHERE state IN (…)` comes from
//! [`lifecycle::sources`], and a relay's writes also name its claim (`claimed_by`): a relay whose lease
//! expired and whose rows were claimed again cannot overwrite the new claim's outcome.
//!
//! Times are whole milliseconds since the Unix epoch in `BIGINT` columns, the same on both databases and
//! the same clock as the SDK's metadata.

use std::fmt::Write as _;

use bytes::Bytes;
use event_retry_core::time::Timestamp;

pub(crate) use crate::db::Bind;
use crate::db::{Db, DbRow};
use crate::dialect::Dialect;
use crate::error::OutboxError;
use crate::lifecycle::{self, Input, State};
use crate::row::{OutboxRow, decode_headers};

/// The table every outbox statement uses.
pub const TABLE: &str = "event_retry_outbox";

/// The PostgreSQL notification channel a commit of new or replayed rows signals.
pub const CHANNEL: &str = "event_retry_outbox";

/// The outbox table in this dialect: the statements that create it and its indexes, if missing.
impl Dialect {
    fn schema(self) -> Vec<String> {
        let (id, bytes) = match self {
            Dialect::Sqlite => ("INTEGER PRIMARY KEY AUTOINCREMENT", "BLOB"),
            Dialect::Postgres => ("BIGSERIAL PRIMARY KEY", "BYTEA"),
        };
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {TABLE} (
                    id {id},
                    event_id TEXT NOT NULL UNIQUE,
                    topic TEXT NOT NULL,
                    msg_key {bytes},
                    payload {bytes} NOT NULL,
                    headers TEXT NOT NULL,
                    state TEXT NOT NULL CHECK (state IN ('PENDING', 'CLAIMED', 'PUBLISHED', 'DEAD')),
                    attempts BIGINT NOT NULL DEFAULT 0,
                    replay_count BIGINT NOT NULL DEFAULT 0,
                    available_at BIGINT NOT NULL,
                    claimed_at BIGINT,
                    lease_until BIGINT,
                    claimed_by TEXT,
                    last_error TEXT,
                    created_at BIGINT NOT NULL,
                    published_at BIGINT,
                    dead_at BIGINT
                )"
            ),
            format!("CREATE INDEX IF NOT EXISTS {TABLE}_due ON {TABLE} (state, available_at)"),
            format!("CREATE INDEX IF NOT EXISTS {TABLE}_key ON {TABLE} (topic, msg_key, id)"),
        ]
    }
}

/// The row columns, in the order [`decode_row`] reads them.
const COLUMNS: &str = "id, event_id, topic, msg_key, payload, headers, state, attempts, replay_count, \
     available_at, claimed_at, lease_until, claimed_by, last_error, created_at, published_at, dead_at";

/// `state IN ('A', 'B')` for the states `input` may move.
pub(crate) fn from_states(input: Input) -> String {
    let names: Vec<String> = lifecycle::sources(input)
        .iter()
        .map(|s| format!("'{s}'"))
        .collect();
    format!("state IN ({})", names.join(", "))
}

/// `id IN (1, 2, 3)`: ids are integers, so they are written into the text (no injection possible).
fn id_list(ids: &[i64]) -> String {
    let mut out = String::from("id IN (");
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{id}");
    }
    out.push(')');
    out
}

/// A row that could not be read back: its id and why (a foreign writer's malformed headers).
#[derive(Clone, Debug)]
pub(crate) struct Unreadable {
    pub(crate) id: i64,
    pub(crate) reason: String,
}

/// The outbox table in one database.
#[derive(Clone, Debug)]
pub(crate) struct Store {
    db: Db,
    dialect: Dialect,
}

/// Counts for the gauges and for operators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Rows waiting (`PENDING` or `CLAIMED`).
    pub pending: u64,
    /// Of those, rows a relay holds (`CLAIMED`).
    pub claimed: u64,
    /// Rows `DEAD`.
    pub dead: u64,
    /// Rows `PUBLISHED` still kept.
    pub published: u64,
    /// When the oldest waiting row was enqueued.
    pub oldest_pending: Option<Timestamp>,
}

impl Store {
    /// Connects to `url` with at most `max_connections` and creates the table if it is missing.
    #[cfg(all(test, feature = "sqlite"))]
    pub(crate) async fn connect(url: &str, max_connections: u32) -> Result<Self, OutboxError> {
        Self::open(Db::connect(url, max_connections).await?).await
    }

    /// The outbox table in `db`, created if it is missing.
    pub(crate) async fn open(db: Db) -> Result<Self, OutboxError> {
        let store = Self {
            dialect: db.dialect(),
            db,
        };
        store.migrate().await?;
        Ok(store)
    }

    /// The dialect.
    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The database.
    #[cfg(feature = "postgres")]
    pub(crate) fn db(&self) -> &Db {
        &self.db
    }

    async fn migrate(&self) -> Result<(), OutboxError> {
        for statement in self.dialect.schema() {
            self.db
                .execute(&statement, Vec::new())
                .await
                .map_err(OutboxError::db("create the outbox table"))?;
        }
        Ok(())
    }

    /// Claims up to `limit` due rows (pending and due, or claimed with an expired lease) for `claim`
    /// until `lease_until`, in id order. With `ordered`, only the head of each key is due: a row whose
    /// key has an earlier row still pending or claimed waits for it.
    pub(crate) async fn claim(
        &self,
        claim: &str,
        now: Timestamp,
        lease_until: Timestamp,
        limit: usize,
        ordered: bool,
    ) -> Result<(Vec<OutboxRow>, Vec<Unreadable>), OutboxError> {
        let head_only = if ordered {
            format!(
                "AND (o.msg_key IS NULL OR NOT EXISTS (SELECT 1 FROM {TABLE} p
                   WHERE p.topic = o.topic AND p.msg_key = o.msg_key AND p.id < o.id
                   AND p.state IN ('PENDING', 'CLAIMED')))"
            )
        } else {
            String::new()
        };
        let lock = match self.dialect {
            Dialect::Postgres => "FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        };
        // A claimed row whose lease expired is due again: lease expiry is the CLAIMED -> PENDING edge, and
        // the claim then takes it like any pending row.
        let expired = lifecycle::sources(Input::LeaseExpired);
        debug_assert_eq!(expired, [State::Claimed]);
        let sql = format!(
            "UPDATE {TABLE} SET state = 'CLAIMED', claimed_at = $1, lease_until = $2, claimed_by = $3
             WHERE id IN (SELECT o.id FROM {TABLE} o
               WHERE ((o.{pending} AND o.available_at <= $1) OR (o.state = 'CLAIMED' AND o.lease_until <= $1))
               {head_only}
               ORDER BY o.id LIMIT $4 {lock})
             RETURNING {COLUMNS}",
            pending = from_states(Input::Claim),
        );
        let binds = vec![
            Bind::Int(ms(now)),
            Bind::Int(ms(lease_until)),
            Bind::Text(claim.to_string()),
            Bind::Int(i64::try_from(limit).unwrap_or(i64::MAX)),
        ];
        let rows = self
            .db
            .fetch_all(&sql, binds)
            .await
            .map_err(OutboxError::db("claim due outbox rows"))?;
        let mut good = Vec::with_capacity(rows.len());
        let mut bad = Vec::new();
        for row in rows {
            match decode_row(&row) {
                Ok(r) => good.push(r),
                Err(reason) => bad.push(Unreadable {
                    id: row.get("id").unwrap_or_default(),
                    reason,
                }),
            }
        }
        good.sort_by_key(|r| r.id);
        Ok((good, bad))
    }

    /// Marks `ids` of `claim` published at `now` (or deletes them, when published rows are not kept).
    /// Returns how many were still this claim's.
    pub(crate) async fn confirm(
        &self,
        claim: &str,
        ids: &[i64],
        now: Timestamp,
        keep: bool,
    ) -> Result<u64, OutboxError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let guard = format!(
            "{} AND claimed_by = $1 AND {}",
            from_states(Input::Confirm),
            id_list(ids)
        );
        let sql = if keep {
            format!(
                "UPDATE {TABLE} SET state = 'PUBLISHED', published_at = $2, lease_until = NULL,
                 claimed_by = NULL WHERE {guard}"
            )
        } else {
            format!("DELETE FROM {TABLE} WHERE {guard}")
        };
        let mut binds = vec![Bind::Text(claim.to_string())];
        if keep {
            binds.push(Bind::Int(ms(now)));
        }
        self.db
            .execute(&sql, binds)
            .await
            .map_err(OutboxError::db("mark outbox rows published"))
    }

    /// Records a failed attempt of row `id` of `claim`: back to pending at `available_at`, or dead.
    /// Returns whether the row was still this claim's.
    pub(crate) async fn fail(
        &self,
        claim: &str,
        id: i64,
        outcome: Input,
        available_at: Timestamp,
        error: &str,
        now: Timestamp,
    ) -> Result<bool, OutboxError> {
        let to = match lifecycle::next(State::Claimed, outcome) {
            Ok(lifecycle::Next::State(to)) if lifecycle::counts_as_attempt(outcome) => to,
            _ => {
                return Err(OutboxError::InvalidInput(format!(
                    "{outcome:?} is not a failed attempt"
                )));
            }
        };
        let dead_at = (to == State::Dead).then(|| ms(now));
        let sql = format!(
            "UPDATE {TABLE} SET state = $1, attempts = attempts + 1, last_error = $2, available_at = $3,
             dead_at = $4, lease_until = NULL, claimed_by = NULL
             WHERE id = $5 AND claimed_by = $6 AND {}",
            from_states(outcome)
        );
        let binds = vec![
            Bind::Text(to.as_str().to_string()),
            Bind::Text(error.to_string()),
            Bind::Int(ms(available_at)),
            Bind::OptInt(dead_at),
            Bind::Int(id),
            Bind::Text(claim.to_string()),
        ];
        let done = self
            .db
            .execute(&sql, binds)
            .await
            .map_err(OutboxError::db("record a failed publish attempt"))?;
        Ok(done == 1)
    }

    /// Gives `ids` of `claim` back unpublished: pending again, no attempt counted.
    pub(crate) async fn release(&self, claim: &str, ids: &[i64]) -> Result<u64, OutboxError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let sql = format!(
            "UPDATE {TABLE} SET state = 'PENDING', lease_until = NULL, claimed_by = NULL
             WHERE claimed_by = $1 AND {} AND {}",
            from_states(Input::Release),
            id_list(ids)
        );
        self.db
            .execute(&sql, vec![Bind::Text(claim.to_string())])
            .await
            .map_err(OutboxError::db("release claimed outbox rows"))
    }

    /// When the next row becomes due: the earliest pending `available_at` or claimed `lease_until`.
    pub(crate) async fn next_due(&self) -> Result<Option<Timestamp>, OutboxError> {
        let sql = format!(
            "SELECT MIN(t) FROM (
               SELECT MIN(available_at) AS t FROM {TABLE} WHERE state = 'PENDING'
               UNION ALL SELECT MIN(lease_until) AS t FROM {TABLE} WHERE state = 'CLAIMED') due"
        );
        let row = self
            .db
            .fetch_optional(&sql, Vec::new())
            .await
            .map_err(OutboxError::db("find the next due outbox row"))?;
        let t: Option<i64> = match row {
            Some(row) => row
                .get(0)
                .map_err(OutboxError::db("read the next due time"))?,
            None => None,
        };
        Ok(t.map(ts))
    }

    /// Deletes up to `limit` published rows confirmed before `before`; returns how many.
    pub(crate) async fn sweep_published(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> Result<u64, OutboxError> {
        let sql = format!(
            "DELETE FROM {TABLE} WHERE id IN (SELECT id FROM {TABLE}
             WHERE state = 'PUBLISHED' AND published_at < $1 ORDER BY id LIMIT $2)"
        );
        let binds = vec![
            Bind::Int(ms(before)),
            Bind::Int(i64::try_from(limit).unwrap_or(i64::MAX)),
        ];
        self.db
            .execute(&sql, binds)
            .await
            .map_err(OutboxError::db("delete old published outbox rows"))
    }

    /// Counts by state and the oldest waiting row.
    pub(crate) async fn counts(&self) -> Result<Counts, OutboxError> {
        let sql = format!("SELECT state, COUNT(*), MIN(created_at) FROM {TABLE} GROUP BY state");
        let rows = self
            .db
            .fetch_all(&sql, Vec::new())
            .await
            .map_err(OutboxError::db("count outbox rows"))?;
        let mut counts = Counts::default();
        for row in rows {
            let state: String = row.get(0).map_err(OutboxError::db("read counts"))?;
            let n: i64 = row.get(1).map_err(OutboxError::db("read counts"))?;
            let oldest: Option<i64> = row.get(2).map_err(OutboxError::db("read counts"))?;
            let n = u64::try_from(n).unwrap_or(0);
            match state.parse::<State>() {
                Ok(state @ (State::Pending | State::Claimed)) => {
                    counts.pending += n;
                    if state == State::Claimed {
                        counts.claimed += n;
                    }
                    let oldest = oldest.map(ts);
                    counts.oldest_pending = match (counts.oldest_pending, oldest) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                Ok(State::Dead) => counts.dead += n,
                Ok(State::Published) => counts.published += n,
                Err(_) => {}
            }
        }
        Ok(counts)
    }

    /// Rows matching `where_sql` (already in `$N` form, starting at `$1`) with `binds`, in id order.
    pub(crate) async fn select(
        &self,
        where_sql: &str,
        binds: Vec<Bind>,
        limit: Option<usize>,
    ) -> Result<Vec<OutboxRow>, OutboxError> {
        let limit = limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
        let sql = format!("SELECT {COLUMNS} FROM {TABLE} WHERE {where_sql} ORDER BY id{limit}");
        let rows = self
            .db
            .fetch_all(&sql, binds)
            .await
            .map_err(OutboxError::db("list outbox rows"))?;
        rows.iter()
            .map(|row| {
                decode_row(row).map_err(|reason| {
                    OutboxError::InvalidInput(format!(
                        "row {}: {reason}",
                        row.get::<i64>("id").unwrap_or_default()
                    ))
                })
            })
            .collect()
    }

    /// Runs an `UPDATE`/`DELETE` whose text is in `$N` form with `binds`; returns the rows changed.
    pub(crate) async fn change(
        &self,
        sql: &str,
        binds: Vec<Bind>,
        operation: &'static str,
    ) -> Result<u64, OutboxError> {
        self.db
            .execute(sql, binds)
            .await
            .map_err(OutboxError::db(operation))
    }

    /// Wakes the relays listening on PostgreSQL (a no-op on SQLite, whose signal stays in-process).
    pub(crate) async fn notify(&self) -> Result<(), OutboxError> {
        if self.dialect == Dialect::Postgres {
            self.db
                .execute(&format!("SELECT pg_notify('{CHANNEL}', '')"), Vec::new())
                .await
                .map_err(OutboxError::db("notify the outbox relays"))?;
        }
        Ok(())
    }
}

pub(crate) fn ms(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn ts(ms: i64) -> Timestamp {
    Timestamp::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn decode_row(row: &DbRow) -> Result<OutboxRow, String> {
    let get_err = |e: sqlx::Error| format!("a column does not read back: {e}");
    let count = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
    let state: String = row.get("state").map_err(get_err)?;
    let headers: String = row.get("headers").map_err(get_err)?;
    let (headers, headers_error) = match decode_headers(&headers) {
        Ok(h) => (h, None),
        Err(e) => (event_retry_core::headers::Headers::new(), Some(e)),
    };
    Ok(OutboxRow {
        id: row.get("id").map_err(get_err)?,
        event_id: row.get("event_id").map_err(get_err)?,
        topic: row.get("topic").map_err(get_err)?,
        key: row
            .get::<Option<Vec<u8>>>("msg_key")
            .map_err(get_err)?
            .map(Bytes::from),
        payload: Bytes::from(row.get::<Vec<u8>>("payload").map_err(get_err)?),
        headers,
        headers_error,
        state: state.parse()?,
        attempts: count(row.get("attempts").map_err(get_err)?),
        replay_count: count(row.get("replay_count").map_err(get_err)?),
        available_at: ts(row.get("available_at").map_err(get_err)?),
        claimed_at: row
            .get::<Option<i64>>("claimed_at")
            .map_err(get_err)?
            .map(ts),
        lease_until: row
            .get::<Option<i64>>("lease_until")
            .map_err(get_err)?
            .map(ts),
        claimed_by: row.get("claimed_by").map_err(get_err)?,
        last_error: row.get("last_error").map_err(get_err)?,
        created_at: ts(row.get("created_at").map_err(get_err)?),
        published_at: row
            .get::<Option<i64>>("published_at")
            .map_err(get_err)?
            .map(ts),
        dead_at: row.get::<Option<i64>>("dead_at").map_err(get_err)?.map(ts),
    })
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Two pending rows in a fresh in-memory database.
    async fn store_with_two_rows() -> Store {
        let store = Store::connect("sqlite::memory:", 1).await.expect("store");
        for id in ["e1", "e2"] {
            let insert = format!(
                "INSERT INTO {TABLE} (event_id, topic, payload, headers, state, attempts, replay_count,
                 available_at, created_at) VALUES ('{id}', 'orders', X'00', '[]', 'PENDING', 0, 0, 0, 0)"
            );
            store.db.execute(&insert, Vec::new()).await.expect("insert");
        }
        store
    }

    #[tokio::test]
    async fn a_relay_whose_lease_expired_cannot_overwrite_the_new_owners_outcome() {
        let store = store_with_two_rows().await;
        let t = Timestamp::from_millis(1_000_000);
        let (a_rows, _) = store
            .claim("relay-a", t, t.plus(Duration::from_millis(5)), 10, false)
            .await
            .expect("a claims");
        assert_eq!(a_rows.len(), 2);
        // A's lease runs out; B claims both rows.
        let later = t.plus(Duration::from_millis(10));
        let (b_rows, _) = store
            .claim(
                "relay-b",
                later,
                later.plus(Duration::from_secs(30)),
                10,
                false,
            )
            .await
            .expect("b claims");
        let ids: Vec<i64> = b_rows.iter().map(|r| r.id).collect();
        assert_eq!(ids.len(), 2, "the expired lease made the rows claimable");
        // A finishes late: none of its writes lands.
        assert_eq!(
            store
                .confirm("relay-a", &ids, later, true)
                .await
                .expect("confirm"),
            0
        );
        let retry_at = later.plus(Duration::from_secs(60));
        assert!(
            !store
                .fail(
                    "relay-a",
                    ids[0],
                    Input::Retry,
                    retry_at,
                    "a's late error",
                    later
                )
                .await
                .expect("fail")
        );
        assert_eq!(store.release("relay-a", &ids).await.expect("release"), 0);
        // B's outcomes stand.
        assert_eq!(
            store
                .confirm("relay-b", &ids[1..], later, true)
                .await
                .expect("confirm"),
            1
        );
        let rows = store
            .select("1 = 1", Vec::new(), None)
            .await
            .expect("select");
        let state = |id: i64| {
            rows.iter()
                .find(|r| r.id == id)
                .map(|r| (r.state, r.attempts))
        };
        assert_eq!(
            state(ids[0]),
            Some((State::Claimed, 0)),
            "still b's claim, untouched by a"
        );
        assert_eq!(state(ids[1]), Some((State::Published, 0)));
    }

    #[test]
    fn parameters_take_each_dialects_form() {
        assert_eq!(
            Dialect::Sqlite.sql("a = $1 AND b = $12").0,
            "a = ?1 AND b = ?12"
        );
        assert_eq!(Dialect::Postgres.sql("a = $1").0, "a = $1");
    }

    #[test]
    fn urls_pick_the_dialect() {
        assert_eq!(
            Dialect::of_url("sqlite:outbox.db").ok(),
            Some(Dialect::Sqlite)
        );
        assert_eq!(
            Dialect::of_url("postgres://u@h/db").ok(),
            Some(Dialect::Postgres)
        );
        assert_eq!(
            Dialect::of_url("postgresql://h/db").ok(),
            Some(Dialect::Postgres)
        );
        assert!(Dialect::of_url("mysql://h/db").is_err());
    }

    #[test]
    fn state_guards_come_from_the_lifecycle() {
        assert_eq!(from_states(Input::Replay), "state IN ('DEAD')");
        assert_eq!(from_states(Input::Purge), "state IN ('DEAD', 'PUBLISHED')");
        assert_eq!(id_list(&[3, 4]), "id IN (3, 4)");
    }
}
