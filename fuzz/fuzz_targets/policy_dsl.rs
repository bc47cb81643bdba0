#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| event_retry_fuzz::core_targets::policy_dsl(data));
