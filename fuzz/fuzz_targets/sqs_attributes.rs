#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| event_retry_fuzz::sqs_targets::sqs_attributes(data));
