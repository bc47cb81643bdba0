#![doc = include_str!("../README.md")]

#[cfg(feature = "testcontainers")]
pub mod containers;
pub mod env;
pub mod fixture;
pub mod hooks;
pub mod probe;
pub mod report;
pub mod scenarios;
pub mod suite;

pub use fixture::{Abilities, Faults, Fixture, HeldParts, Inspect, NativeMessage, RawClient, hex};
pub use suite::{Adapter, BoxFuture, Connect, Container, run, run_current_thread, run_only};
