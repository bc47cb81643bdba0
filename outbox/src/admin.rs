//! Operator operations on the outbox: list, show, replay, purge — the library behind `retryctl outbox`.
//!
//! Replay and purge are lifecycle transitions like any other: a filter that names a state the transition
//! does not start from is refused before anything changes, a selected row in the wrong state is refused
//! with its id, and the statement itself repeats the lifecycle's state guard, so a row that changed state
//! meanwhile is left alone.

use bytes::Bytes;
use event_retry_core::time::Timestamp;

use crate::error::OutboxError;
use crate::lifecycle::{self, Input, State};
use crate::row::OutboxRow;
use crate::store::{Bind, Store, TABLE, from_states, ms};

/// Which rows an operation selects. Empty selects every row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowFilter {
    /// Only these row ids.
    pub ids: Vec<i64>,
    /// Only rows in this state.
    pub state: Option<State>,
    /// Only rows for this topic.
    pub topic: Option<String>,
    /// Only rows with this key.
    pub key: Option<Bytes>,
    /// Only rows enqueued at or after this time.
    pub since: Option<Timestamp>,
    /// Only rows enqueued before this time.
    pub until: Option<Timestamp>,
    /// At most this many rows (list only).
    pub limit: Option<usize>,
}

impl RowFilter {
    /// Every row.
    pub fn all() -> Self {
        Self::default()
    }

    /// Rows in `state`.
    pub fn state(state: State) -> Self {
        Self {
            state: Some(state),
            ..Self::default()
        }
    }

    /// Whether anything narrows the selection.
    pub fn is_narrowed(&self) -> bool {
        !self.ids.is_empty()
            || self.state.is_some()
            || self.topic.is_some()
            || self.key.is_some()
            || self.since.is_some()
            || self.until.is_some()
            || self.limit.is_some()
    }

    /// The `WHERE` text (parameters from `$first`) and its parameters.
    fn to_sql(&self, first: usize) -> (String, Vec<Bind>) {
        let mut clauses = vec!["1 = 1".to_string()];
        let mut binds = Vec::new();
        let mut add = |clause: &str, bind: Bind| {
            clauses.push(clause.replace('#', &format!("${}", first + binds.len())));
            binds.push(bind);
        };
        if let Some(state) = self.state {
            add("state = #", Bind::Text(state.as_str().to_string()));
        }
        if let Some(topic) = &self.topic {
            add("topic = #", Bind::Text(topic.clone()));
        }
        if let Some(key) = &self.key {
            add("msg_key = #", Bind::Bytes(key.to_vec()));
        }
        if let Some(since) = self.since {
            add("created_at >= #", Bind::Int(ms(since)));
        }
        if let Some(until) = self.until {
            add("created_at < #", Bind::Int(ms(until)));
        }
        if !self.ids.is_empty() {
            let ids: Vec<String> = self.ids.iter().map(i64::to_string).collect();
            clauses.push(format!("id IN ({})", ids.join(", ")));
        }
        (clauses.join(" AND "), binds)
    }
}

/// Lists the rows `filter` selects, in id order.
pub(crate) async fn list(store: &Store, filter: &RowFilter) -> Result<Vec<OutboxRow>, OutboxError> {
    let (where_sql, binds) = filter.to_sql(1);
    store.select(&where_sql, binds, filter.limit).await
}

/// One row by id.
pub(crate) async fn get(store: &Store, id: i64) -> Result<OutboxRow, OutboxError> {
    let filter = RowFilter {
        ids: vec![id],
        ..RowFilter::default()
    };
    list(store, &filter)
        .await?
        .pop()
        .ok_or_else(|| OutboxError::NotFound(id.to_string()))
}

/// Refuses `input` on the filter's state and on every selected row whose state forbids it.
async fn check(store: &Store, filter: &RowFilter, input: Input) -> Result<(), OutboxError> {
    if let Some(state) = filter.state {
        lifecycle::next(state, input).map_err(|forbidden| OutboxError::Forbidden {
            subject: format!("rows in state {state}"),
            forbidden,
        })?;
    }
    if !filter.ids.is_empty() {
        let rows = list(store, filter).await?;
        for id in &filter.ids {
            let row = rows
                .iter()
                .find(|r| r.id == *id)
                .ok_or_else(|| OutboxError::NotFound(id.to_string()))?;
            lifecycle::next(row.state, input).map_err(|forbidden| OutboxError::Forbidden {
                subject: format!("row {id}"),
                forbidden,
            })?;
        }
    }
    Ok(())
}

/// Moves the `DEAD` rows `filter` selects back to `PENDING`, due now, attempts restarted, replay count
/// raised, `last_error` kept; returns how many.
pub(crate) async fn replay(
    store: &Store,
    filter: &RowFilter,
    now: Timestamp,
) -> Result<u64, OutboxError> {
    check(store, filter, Input::Replay).await?;
    let (where_sql, mut binds) = filter.to_sql(2);
    binds.insert(0, Bind::Int(ms(now)));
    let guard = from_states(Input::Replay);
    let sql = format!(
        "UPDATE {TABLE} SET state = 'PENDING', attempts = 0, replay_count = replay_count + 1,
         available_at = $1, dead_at = NULL WHERE {guard} AND {where_sql}"
    );
    let n = store.change(&sql, binds, "replay dead outbox rows").await?;
    if n > 0 {
        store.notify().await?;
    }
    Ok(n)
}

/// Deletes the `DEAD` or `PUBLISHED` rows `filter` selects; the filter must name one of the two states.
pub(crate) async fn purge(store: &Store, filter: &RowFilter) -> Result<u64, OutboxError> {
    if filter.state.is_none() && filter.ids.is_empty() {
        return Err(OutboxError::InvalidInput(
            "say which rows to purge: state DEAD or PUBLISHED, or row ids".into(),
        ));
    }
    check(store, filter, Input::Purge).await?;
    let (where_sql, binds) = filter.to_sql(1);
    let guard = from_states(Input::Purge);
    let sql = format!("DELETE FROM {TABLE} WHERE {guard} AND {where_sql}");
    store.change(&sql, binds, "purge outbox rows").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_number_their_parameters_from_the_first() {
        let filter = RowFilter {
            ids: vec![7, 9],
            state: Some(State::Dead),
            topic: Some("orders".into()),
            since: Some(Timestamp::from_millis(10)),
            ..RowFilter::default()
        };
        let (sql, binds) = filter.to_sql(2);
        assert_eq!(
            sql,
            "1 = 1 AND state = $2 AND topic = $3 AND created_at >= $4 AND id IN (7, 9)"
        );
        assert_eq!(binds.len(), 3);
        assert!(filter.is_narrowed());
        assert!(!RowFilter::all().is_narrowed());
        assert_eq!(RowFilter::all().to_sql(1).0, "1 = 1");
    }
}
