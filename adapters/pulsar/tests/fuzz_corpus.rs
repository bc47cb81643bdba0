//! The fuzz targets on the Pulsar adapter's decoders, replayed on their corpus (`fuzz/corpus/<target>/`):
//! each file through the very function the fuzz target runs (`fuzz/src/`), so a finding committed to
//! the corpus stays a test on stable.

#[allow(dead_code, unreachable_pub)]
#[path = "../../../fuzz/src/core_targets.rs"]
mod core_targets;
#[allow(dead_code, unreachable_pub)]
#[path = "../../../fuzz/src/lines.rs"]
mod lines;
#[allow(dead_code, unreachable_pub)]
#[path = "../../../fuzz/src/pulsar_targets.rs"]
mod pulsar_targets;
#[allow(dead_code, unreachable_pub)]
#[path = "../../../fuzz/src/replay.rs"]
mod replay;

fn replay(target: &str, run: impl Fn(&[u8])) {
    replay::replay(env!("CARGO_MANIFEST_DIR"), "../..", target, run);
}

#[test]
fn pulsar_properties() {
    replay("pulsar_properties", pulsar_targets::pulsar_properties);
}

/// The URL corpus: the core's split, then this adapter's option parser.
#[test]
fn options_url() {
    replay("options_url", |data| {
        if let Some(options) = core_targets::options_url(data) {
            pulsar_targets::pulsar_options(&options);
        }
    });
}
