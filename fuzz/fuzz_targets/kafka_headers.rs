#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| event_retry_fuzz::kafka_targets::kafka_headers(data));
