//! Runs every conformance scenario against every configured adapter (see `conformance_tests::harness`).

fn main() {
    conformance_tests::harness::main();
}
