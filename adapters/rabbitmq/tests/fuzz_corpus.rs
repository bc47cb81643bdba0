//! The fuzz targets on the RabbitMQ adapter's decoders, replayed on their corpus (`fuzz/corpus/<target>/`):
//! each file through the very function the fuzz target runs (`fuzz/src/`), so a finding committed to
//! the corpus stays a test on stable.

#[allow(dead_code, unreachable_pub)]
#[path = "../../../fuzz/src/core_targets.rs"]
mod core_targets;
#[allow(dead_code, unreachable_pub)]
#[path = "../../../fuzz/src/lines.rs"]
mod lines;
#[allow(dead_code, unreachable_pub)]
#[path = "../../../fuzz/src/rabbitmq_targets.rs"]
mod rabbitmq_targets;
#[allow(dead_code, unreachable_pub)]
#[path = "../../../fuzz/src/replay.rs"]
mod replay;

fn replay(target: &str, run: impl Fn(&[u8])) {
    replay::replay(env!("CARGO_MANIFEST_DIR"), "../..", target, run);
}

#[test]
fn amqp_table() {
    replay("amqp_table", rabbitmq_targets::amqp_table);
}

/// The URL corpus: the core's split, then this adapter's option parser.
#[test]
fn options_url() {
    replay("options_url", |data| {
        if let Some(options) = core_targets::options_url(data) {
            rabbitmq_targets::rabbitmq_options(&options);
        }
    });
}
