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

/// The PostgreSQL URL `url` with its database replaced by `database`, its settings (`?sslmode=…`,
/// `sslrootcert=…`, whose value may hold slashes) kept, and `extra` (`key=value`) added to them.
pub fn postgres_database(url: &str, database: &str, extra: Option<&str>) -> String {
    let (address, query) = url.split_once('?').unwrap_or((url, ""));
    let base = address
        .rsplit_once('/')
        .filter(|(base, _)| base.ends_with(|c: char| c != '/'))
        .map_or(address, |(base, _)| base);
    let settings: Vec<&str> = [query, extra.unwrap_or_default()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    if settings.is_empty() {
        format!("{base}/{database}")
    } else {
        format!("{base}/{database}?{}", settings.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_is_swapped_and_the_settings_kept() {
        assert_eq!(
            postgres_database("postgres://pg@127.0.0.1:5432/postgres", "t1", None),
            "postgres://pg@127.0.0.1:5432/t1"
        );
        assert_eq!(
            postgres_database(
                "postgres://pg@127.0.0.1:5432/postgres?sslmode=verify-full&sslrootcert=/a/b/ca.pem",
                "t1",
                Some("host=/tmp/x")
            ),
            "postgres://pg@127.0.0.1:5432/t1?sslmode=verify-full&sslrootcert=/a/b/ca.pem&host=/tmp/x"
        );
        assert_eq!(
            postgres_database("postgres://pg@127.0.0.1:5432", "t1", None),
            "postgres://pg@127.0.0.1:5432/t1"
        );
    }
}
