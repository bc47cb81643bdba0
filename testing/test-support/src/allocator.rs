//! Which allocator the binaries built with this crate use: glibc's (the system's, by default),
//! mimalloc (feature `mimalloc`) or jemalloc (feature `jemalloc`).
//!
//! glibc's allocator keeps the memory a burst freed in its arenas instead of returning it to the system,
//! so a consumer's resident set stays above its idle size after a burst of retries although the heap in
//! use went back (the backlog part measures both). mimalloc gives freed pages back on its own. The
//! feature exists so the backlog part can measure a service that chose it: a service does the same with
//! the two lines below in its own binary — the SDK itself does not choose an allocator.

/// With the feature `mimalloc`, mimalloc is the global allocator of every binary this crate is built
/// into (the adapters' tests and benches, and the consumer processes the benches start).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// With the feature `jemalloc`, jemalloc is the global allocator and — built unprefixed — the process's
/// `malloc` too, so C code linked in (librdkafka) allocates from it as well; `MALLOC_CONF` tunes it.
#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The allocator's name, as the benches print it.
pub fn name() -> &'static str {
    if cfg!(feature = "mimalloc") {
        "mimalloc"
    } else if cfg!(feature = "jemalloc") {
        "jemalloc"
    } else {
        "glibc malloc"
    }
}
