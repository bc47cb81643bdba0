//! The SDK's metadata and its wire codec: the same names on every broker.
//!
//! An event moved between brokers keeps its history only if every adapter writes the same fields under the
//! same names. The codec writes one header per field (`x-retry-attempts: 2`, ...) — Kafka headers, AMQP
//! headers and Pulsar properties take them as they are — or packs them all into a single `x-retry` header
//! holding a JSON object, for SQS, where a message may carry only ten attributes and the producer needs its
//! own. Decoding accepts both. Values are UTF-8 text so an operator can read them in any broker console.
//!
//! Headers outside the namespace are the producer's and pass through untouched. Metadata that does not parse
//! (an attempt count of `"abc"`, a megabyte-long header) is never reset to a default: decoding fails with a
//! [`MetadataError`] naming the header and the problem, and the runtime dead-letters the event as poison.
//!
//! The header names ([`names`]), the data they carry (`types`) and the codec between the two (`codec`)
//! are files of their own; this module holds the limits they share and re-exports the rest.

/// The prefix of every metadata header name.
pub const PREFIX: &str = "x-retry-";
/// The name of the single header that holds all metadata in packed form.
pub const PACKED: &str = "x-retry";
/// The longest value accepted for one metadata header, in bytes.
pub const MAX_VALUE_BYTES: usize = 4096;
/// The longest packed metadata header accepted, in bytes.
pub const MAX_PACKED_BYTES: usize = 16 * 1024;
/// The longest last-error text kept; longer messages are cut at a character boundary.
pub const MAX_ERROR_BYTES: usize = 1024;

pub mod names;

mod codec;
mod types;

pub(crate) use codec::decode_into;
pub use codec::{
    HeaderSink, Packing, decode, decode_lenient, encode, encode_for_map, encode_into,
    encode_packed, encode_with, is_sdk_field,
};
pub use types::{
    DeadInfo, DeadReason, MetadataError, Origin, OriginTimestamp, RetryMetadata, TimestampKind,
    truncate_utf8,
};
