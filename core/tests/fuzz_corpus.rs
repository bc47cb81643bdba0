//! The fuzz targets on the core crate's decoders, replayed on their corpus (`fuzz/corpus/<target>/`):
//! each file through the very function the fuzz target runs (`fuzz/src/`), so a finding committed to
//! the corpus stays a test on stable.

#[allow(dead_code, unreachable_pub)]
#[path = "../../fuzz/src/core_targets.rs"]
mod core_targets;
#[allow(dead_code, unreachable_pub)]
#[path = "../../fuzz/src/lines.rs"]
mod lines;
#[allow(dead_code, unreachable_pub)]
#[path = "../../fuzz/src/replay.rs"]
mod replay;

fn replay(target: &str, run: impl Fn(&[u8])) {
    replay::replay(env!("CARGO_MANIFEST_DIR"), "..", target, run);
}

#[test]
fn policy_dsl() {
    replay("policy_dsl", core_targets::policy_dsl);
}

#[test]
fn metadata_headers() {
    replay("metadata_headers", core_targets::metadata_headers);
}

#[test]
fn options_url() {
    replay("options_url", |data| {
        core_targets::options_url(data);
    });
}

#[test]
fn config_toml() {
    replay("config_toml", core_targets::config_toml);
}
