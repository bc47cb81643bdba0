//! The fuzz targets on the console's parsers, replayed on their corpus (`fuzz/corpus/<target>/`): each
//! file through the very function the fuzz target runs (`fuzz/src/`), so a finding committed to the
//! corpus stays a test on stable.

#[allow(dead_code, unreachable_pub)]
#[path = "../../fuzz/src/console_targets.rs"]
mod console_targets;
#[allow(dead_code, unreachable_pub)]
#[path = "../../fuzz/src/replay.rs"]
mod replay;

fn replay(target: &str, run: impl Fn(&[u8])) {
    replay::replay(env!("CARGO_MANIFEST_DIR"), "..", target, run);
}

#[test]
fn console_form() {
    replay("console_form", console_targets::console_form);
}

#[test]
fn console_query() {
    replay("console_query", console_targets::console_query);
}

#[test]
fn console_config() {
    replay("console_config", console_targets::console_config);
}
