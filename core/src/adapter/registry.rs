//! How an adapter makes its URL schemes known to `event_retry::connect`.
//!
//! The facade keeps a table of [`Scheme`]s, one per adapter compiled in; `connect(url)` picks the entry
//! whose scheme the URL names. An adapter exports one `Scheme` value and writes nothing else for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::transport::Transport;
use crate::error::Error;
use crate::options::Options;

/// The future a [`Scheme`]'s connect function returns.
pub type ConnectFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn Transport>, Error>> + Send>>;

/// One adapter's entry in the table of URL schemes (built with [`Scheme::new`]).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Scheme {
    /// The URL schemes it serves, lowercase, without `://` (`["amqp", "amqps"]`).
    pub schemes: &'static [&'static str],
    /// The broker's name, for messages ("RabbitMQ").
    pub broker: &'static str,
    /// Connects to the URL (its query already moved into the options) with the options.
    pub connect: fn(url: String, options: Options) -> ConnectFuture,
}

impl Scheme {
    /// The entry of the adapter for `broker` that serves `schemes` (lowercase, without `://`) and
    /// connects with `connect`.
    pub const fn new(
        schemes: &'static [&'static str],
        broker: &'static str,
        connect: fn(url: String, options: Options) -> ConnectFuture,
    ) -> Self {
        Self {
            schemes,
            broker,
            connect,
        }
    }

    /// Whether this entry serves `scheme` (compared without regard to case).
    pub fn serves(&self, scheme: &str) -> bool {
        self.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme))
    }
}
