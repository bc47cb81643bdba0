#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| event_retry_fuzz::console_targets::console_config(data));
