#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| event_retry_fuzz::rabbitmq_targets::amqp_table(data));
