//! Finding the broker a run is against: its URL variable, and whether `RETRY_TEST_REQUIRE` names it
//! (then a missing broker fails instead of being skipped loudly). The adapters' own broker tests use
//! the same two functions, so a suite and a broker test never disagree about what is required.

/// The broker URL in the variable `env`, if set and not empty.
pub fn url(env: &str) -> Option<String> {
    std::env::var(env).ok().filter(|u| !u.is_empty())
}

/// The brokers `RETRY_TEST_REQUIRE` names (comma-separated; blanks ignored).
pub fn required_brokers() -> Vec<String> {
    std::env::var("RETRY_TEST_REQUIRE")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}
