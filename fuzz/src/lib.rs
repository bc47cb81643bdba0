//! The fuzz targets' logic, one `fn(&[u8])` per target: `fuzz_targets/<name>.rs` calls it, and the
//! corpus replay tests (ordinary tests on stable, in the crates that own the decoders) include these
//! files and call the same functions on every file of `corpus/<name>/`.

pub mod console_targets;
pub mod core_targets;
pub mod kafka_targets;
pub mod lines;
pub mod pulsar_targets;
pub mod rabbitmq_targets;
pub mod sqs_targets;

/// `options_url`: a broker URL as `connect` reads it — split into base and options, redacted — and the
/// options read by every adapter's parser.
pub fn options_url(data: &[u8]) {
    let Some(options) = core_targets::options_url(data) else {
        return;
    };
    kafka_targets::kafka_options(&options);
    rabbitmq_targets::rabbitmq_options(&options);
    sqs_targets::sqs_options(&options);
    pulsar_targets::pulsar_options(&options);
}
