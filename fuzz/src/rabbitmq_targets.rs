//! The targets on the RabbitMQ adapter: a delivery's header table in AMQP's wire encoding, and the
//! adapter's options.

use event_retry_core::options::Options;
use event_retry_rabbitmq::RabbitConfig;
use event_retry_rabbitmq::fuzzing::decode_delivery;

/// `amqp_table`: the input is a field table as AMQP encodes it (every value type: booleans, signed and
/// unsigned integers of each width, floats, decimals, short and long strings, byte arrays, timestamps,
/// nested arrays and tables, void). Never a panic; the metadata then holds as in `metadata_headers`.
pub fn amqp_table(data: &[u8]) {
    let Some((raw, native)) = decode_delivery(b"payload", data) else {
        return;
    };
    assert_eq!(raw.payload.as_ref(), b"payload");
    let _ = native.describe();
    crate::core_targets::check_metadata(&raw.headers);
}

/// `options_url`, the RabbitMQ part.
pub fn rabbitmq_options(options: &Options) {
    let _ = RabbitConfig::from_options(options);
}
