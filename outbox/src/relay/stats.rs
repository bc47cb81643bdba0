//! What a relay has done since it started: the counters its handle reports.
//!
//! Separate from the run loop that bumps them because they are the relay's public report: read from the
//! handle while it runs and returned when it stops.

/// What a relay has done since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Rows the broker confirmed and the relay recorded as published.
    pub published: u64,
    /// Failed publish attempts that left the row pending for a later retry.
    pub retried: u64,
    /// Rows moved to `DEAD` (permanent failure, spent policy, or a row that does not read back).
    pub dead: u64,
    /// Rows given back unpublished (shutdown, or a lease too short to start a publish).
    pub released: u64,
    /// Rows published whose claim had already passed to another relay (a duplicate publish).
    pub lease_lost: u64,
    /// Times the relay backed off as a whole because the broker was down.
    pub broker_backoffs: u64,
    /// Claims that returned rows.
    pub batches: u64,
}

impl std::fmt::Display for RelayStats {
    /// `3 published, 3 failed attempts retried, 1 dead, 0 released, 0 lease lost, 0 broker backoffs, 4
    /// batches`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} published, {} failed attempts retried, {} dead, {} released, {} lease lost, {} broker backoffs, {} batches",
            self.published,
            self.retried,
            self.dead,
            self.released,
            self.lease_lost,
            self.broker_backoffs,
            self.batches
        )
    }
}
