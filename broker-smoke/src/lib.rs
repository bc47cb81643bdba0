//! Smoke tests of the real brokers started by `scripts/brokers`, each through the Rust client crate its
//! adapter uses (rdkafka, lapin, aws-sdk-sqs, pulsar). They prove the broker and the client work together
//! on this machine before any adapter runs: `cargo test -p broker-smoke` with the `RETRY_TEST_*` env vars
//! that `scripts/brokers start` writes to `target/brokers/env.sh`.
