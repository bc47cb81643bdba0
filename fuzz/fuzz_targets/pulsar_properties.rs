#![no_main]

libfuzzer_sys::fuzz_target!(
    |data: &[u8]| event_retry_fuzz::pulsar_targets::pulsar_properties(data)
);
