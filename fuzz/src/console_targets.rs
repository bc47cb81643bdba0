//! The targets on the console (`retryctl serve`): a replay or purge form's body, a DLQ list's query,
//! and the console's TOML config of targets.

/// `console_form`: a POSTed form body. Never a panic: a selection, or a reason to show.
pub fn console_form(data: &[u8]) {
    if let Err(reason) = retryctl::console::fuzzing::form(data) {
        assert!(!reason.is_empty());
    }
}

/// `console_query`: a list page's query string. Never a panic: a filter, or a reason to show.
pub fn console_query(data: &[u8]) {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(reason) = retryctl::console::fuzzing::query(query) {
        assert!(!reason.is_empty());
    }
}

/// `console_config`: the console's TOML file of DLQs. Never a panic.
pub fn console_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = retryctl::console::read_config(text);
}
