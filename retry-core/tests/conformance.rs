//! The conformance suite against the in-memory transport — called exactly as every broker adapter calls
//! it: a fixture over the broker, then `conformance_tests::run`.

mod memory_fixture;

fn main() {
    conformance_tests::run(conformance_tests::Adapter {
        name: "memory",
        url_env: None,
        connect: |_url| Box::pin(async { Ok(memory_fixture::fixture("memory")) }),
    })
}
