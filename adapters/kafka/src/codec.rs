//! Events as Kafka records, and the adapter's routing headers.
//!
//! Kafka headers are ordered, may repeat and carry any bytes, so an event's headers (the SDK's metadata
//! included) travel exactly as they are. A header with a null value reaches the handler empty, and every
//! copy the adapter makes of the record writes it null again ([`Nulls`]). A copy is stamped anew (the
//! broker's retention counts from a record's timestamp); the original's timestamp and its type travel in
//! the SDK's metadata (`x-retry-origin-timestamp`, `x-retry-origin-timestamp-type`). A record on its
//! way through the delay ladder carries three more headers, which the adapter reads and strips before
//! the runtime sees the record: where it goes when due, when it is due, and when it may leave the level
//! it sits in. A dead letter carries the consumer group that dead-lettered it.

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};
use event_retry_core::event::RawMessage;
use event_retry_core::headers::Headers as EventHeaders;
use event_retry_core::metadata::{OriginTimestamp, TimestampKind, names};
use event_retry_core::time::Timestamp;
use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};

/// Where a delayed record is going, read from its routing headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    /// The topic it goes to once due.
    pub(crate) to: String,
    /// When it is due.
    pub(crate) due: Timestamp,
    /// When it may leave its current level.
    pub(crate) hop_due: Timestamp,
}

/// A record read from Kafka: the event as it travelled, and its routing headers if it had them.
#[derive(Clone, Debug)]
pub(crate) struct Decoded {
    pub(crate) raw: RawMessage,
    pub(crate) nulls: Nulls,
    pub(crate) route: Option<Route>,
    pub(crate) group: Option<String>,
    pub(crate) timestamp: Option<OriginTimestamp>,
}

/// A record to produce: the event as it travels, and which of its headers are null.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Outbound<'a> {
    pub(crate) raw: &'a RawMessage,
    pub(crate) nulls: &'a Nulls,
}

/// The headers of a record whose value was null (Kafka tells a null value from an empty one; an event's
/// headers hold bytes), by name and occurrence of the name, so a copy writes them null again. Empty for
/// almost every record, and then free.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Nulls(Vec<(String, usize)>);

impl Nulls {
    /// The names of the null headers, once each, in the order they came.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        let mut seen = std::collections::HashSet::new();
        self.0
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(move |n| seen.insert(*n))
    }

    /// Whether the `nth` header named `name` (counting from 0) was null.
    fn contains(&self, name: &str, nth: usize) -> bool {
        self.0.iter().any(|(n, i)| n == name && *i == nth)
    }
}

/// How many headers before `index` in `headers` are named `name`.
fn occurrence<'a>(mut names: impl Iterator<Item = &'a str>, index: usize, name: &str) -> usize {
    names.by_ref().take(index).filter(|n| *n == name).count()
}

/// The headers of `raw` (null where `nulls` says the original's were), plus `extra` after them.
pub(crate) fn headers(raw: &RawMessage, nulls: &Nulls, extra: &[(&str, &[u8])]) -> OwnedHeaders {
    let mut out = OwnedHeaders::new_with_capacity(raw.headers.len() + extra.len());
    for (index, (name, value)) in raw.headers.iter().enumerate() {
        let null = !nulls.0.is_empty()
            && value.is_empty()
            && nulls.contains(
                name,
                occurrence(raw.headers.iter().map(|(n, _)| n), index, name),
            );
        out = out.insert(Header {
            key: name,
            value: (!null).then_some(value.as_ref()),
        });
    }
    for (name, value) in extra {
        out = out.insert(Header {
            key: name,
            value: Some(*value),
        });
    }
    out
}

/// The routing headers of a record going to `to`, due at `due`, allowed out of its level at `hop_due`.
pub(crate) fn route_headers(route: &Route) -> [(&'static str, Vec<u8>); 3] {
    [
        (names::ROUTE_TO, route.to.clone().into_bytes()),
        (
            names::ROUTE_DUE,
            route.due.as_millis().to_string().into_bytes(),
        ),
        (
            names::HOP_DUE,
            route.hop_due.as_millis().to_string().into_bytes(),
        ),
    ]
}

fn millis(value: &[u8]) -> Option<Timestamp> {
    std::str::from_utf8(value)
        .ok()?
        .parse()
        .ok()
        .map(Timestamp::from_millis)
}

fn header_name(name: &str) -> Cow<'static, str> {
    match names::interned(name) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(name.to_string()),
    }
}

/// Reads a record on its own (the ladder, the DLQ's reader): [`Copied`] into an allocation of exactly its
/// size (such records are kept for long, and in numbers), decoded.
pub(crate) fn decode(message: &BorrowedMessage<'_>) -> Decoded {
    Copied::from_message(message, &mut Chunks::exact()).decode()
}

/// Where records read by one thread are copied: chunks of [`Chunks::SIZE`] bytes, each shared by the
/// records copied into it (a record larger than a chunk gets one of its own).
///
/// Why: a record is read on the consumer thread and freed on a runtime thread. With glibc's allocator
/// every allocation that crosses threads so takes the slow path on both sides, under the reading thread's
/// arena lock — on the Kafka bench, that lock was where the runtime's threads were put to sleep most.
/// One allocation per chunk instead of several per record. The
/// price: a payload the handler keeps beyond its event keeps its chunk alive.
pub(crate) struct Chunks {
    buffer: BytesMut,
    /// The size of a new chunk.
    size: usize,
}

impl Default for Chunks {
    fn default() -> Self {
        Self {
            buffer: BytesMut::new(),
            size: Self::SIZE,
        }
    }
}

impl Chunks {
    /// The size of a chunk: below glibc's threshold for mapping an allocation of its own.
    const SIZE: usize = 64 * 1024;

    /// Chunks of exactly the size of what is copied into them: one allocation per record, for records
    /// read one at a time and kept (a chunk per record would hold 64 KB each).
    fn exact() -> Self {
        Self {
            buffer: BytesMut::new(),
            size: 0,
        }
    }

    /// The current chunk, with room for `len` more bytes (a new chunk if it had not).
    fn room(&mut self, len: usize) -> &mut BytesMut {
        if self.buffer.capacity() - self.buffer.len() < len {
            self.buffer = BytesMut::with_capacity(self.size.max(len));
        }
        &mut self.buffer
    }

    /// What was written since the last call, as one slice of the chunk.
    fn take(&mut self) -> Bytes {
        self.buffer.split().freeze()
    }
}

/// A record copied out of librdkafka's buffers as it was read, not yet decoded: its payload, its key and
/// its headers in one slice of a shared chunk (see [`Chunks`]). Decoding — the header list, the names of
/// a producer's own headers — is left to the thread that takes the record, so what it allocates is freed
/// on the thread that allocated it. A clone shares the chunk (no copy): a receipt keeps one to decode
/// the record again in the rare case it needs the whole original.
#[derive(Clone)]
pub(crate) struct Copied {
    /// The payload, the key, then each header as the length of its name (4 bytes, little-endian), the
    /// name, the length of its value (4 bytes, [`NULL`] for a null value) and the value.
    bytes: Bytes,
    payload: usize,
    key: Option<usize>,
    /// How many headers it has (routing ones included): the header list's capacity.
    headers: usize,
    timestamp: rdkafka::Timestamp,
}

/// The length written for a null header value.
const NULL: u32 = u32::MAX;

/// Headers a record may have for [`Copied::from_parts`] (both read paths) to read them from
/// librdkafka once: the SDK's metadata of a retry and a few of the producer's own. A record with more is
/// read three times (the first walk stops at one more, then the copy walks twice).
const KEPT_HEADERS: usize = 24;

impl Copied {
    /// Copies `message` into `chunks`.
    pub(crate) fn from_message(message: &BorrowedMessage<'_>, chunks: &mut Chunks) -> Copied {
        let headers = message.headers();
        Copied::from_parts(
            message.payload().unwrap_or_default(),
            message.key(),
            || {
                headers
                    .iter()
                    .flat_map(|hs| hs.iter().map(|h| (h.key, h.value)))
            },
            message.timestamp(),
            chunks,
        )
    }

    /// Copies a record's parts into `chunks`; `headers` gives its headers in order, each time it is
    /// called. It is called once where there are at most [`KEPT_HEADERS`]: the copy walks the headers
    /// twice (sizes, then bytes), and each step through librdkafka's list is a call into it, a `strlen`
    /// and a check of the name's UTF-8, so the first walk keeps them on the stack.
    pub(crate) fn from_parts<'h, I: Iterator<Item = (&'h str, Option<&'h [u8]>)>>(
        payload: &[u8],
        key: Option<&[u8]>,
        headers: impl Fn() -> I,
        timestamp: rdkafka::Timestamp,
        chunks: &mut Chunks,
    ) -> Copied {
        let mut kept = [("", None); KEPT_HEADERS];
        let mut count = 0;
        for header in headers() {
            if count == KEPT_HEADERS {
                return Copied::write_parts(payload, key, headers, timestamp, chunks);
            }
            kept[count] = header;
            count += 1;
        }
        let kept = &kept[..count];
        Copied::write_parts(payload, key, || kept.iter().copied(), timestamp, chunks)
    }

    /// [`Copied::from_parts`]'s copy, walking `headers` twice.
    fn write_parts<'h, I: Iterator<Item = (&'h str, Option<&'h [u8]>)>>(
        payload: &[u8],
        key: Option<&[u8]>,
        headers: impl Fn() -> I,
        timestamp: rdkafka::Timestamp,
        chunks: &mut Chunks,
    ) -> Copied {
        let (count, header_bytes) = headers().fold((0, 0), |(count, bytes), (name, value)| {
            (
                count + 1,
                bytes + 8 + name.len() + value.map_or(0, <[u8]>::len),
            )
        });
        let buffer = chunks.room(payload.len() + key.map_or(0, <[u8]>::len) + header_bytes);
        buffer.extend_from_slice(payload);
        buffer.extend_from_slice(key.unwrap_or_default());
        for (name, value) in headers() {
            buffer.put_u32_le(length(name.len()));
            buffer.extend_from_slice(name.as_bytes());
            match value {
                None => buffer.put_u32_le(NULL),
                Some(value) => {
                    buffer.put_u32_le(length(value.len()));
                    buffer.extend_from_slice(value);
                }
            }
        }
        Copied {
            bytes: chunks.take(),
            payload: payload.len(),
            key: key.map(<[u8]>::len),
            headers: count,
            timestamp,
        }
    }

    /// Its size in bytes: the payload, the key and the headers as kept.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// The record as the SDK reads it: the routing headers and the group are taken out of the event's
    /// headers; payload, key and header values are slices of the chunk.
    pub(crate) fn decode(self) -> Decoded {
        let (mut to, mut due, mut hop_due, mut group) = (None, None, None, None);
        let mut nulls = Nulls::default();
        let bytes = self.bytes;
        let payload = bytes.slice(..self.payload);
        let mut at = self.payload;
        let key = self.key.map(|len| {
            at += len;
            bytes.slice(at - len..at)
        });
        let mut headers = EventHeaders::with_capacity(self.headers);
        while at < bytes.len() {
            let name_len = read_length(&bytes, &mut at) as usize;
            let name = std::str::from_utf8(&bytes[at..at + name_len]).unwrap_or_default();
            at += name_len;
            let value_len = read_length(&bytes, &mut at);
            let value = (value_len != NULL).then(|| {
                at += value_len as usize;
                bytes.slice(at - value_len as usize..at)
            });
            if value.is_none() {
                // Counted among the event's headers before it (the routing ones are not the event's).
                let nth = headers.iter().filter(|(n, _)| *n == name).count();
                nulls.0.push((name.to_string(), nth));
            }
            let text = || std::str::from_utf8(value.as_deref().unwrap_or_default()).ok();
            match name {
                names::ROUTE_TO => to = text().map(str::to_string),
                names::ROUTE_DUE => due = millis(value.as_deref().unwrap_or_default()),
                names::HOP_DUE => hop_due = millis(value.as_deref().unwrap_or_default()),
                names::GROUP => group = text().map(str::to_string),
                _ => headers.push(header_name(name), value.unwrap_or_default()),
            }
        }
        let route = match (to, due) {
            (Some(to), Some(due)) => Some(Route {
                to,
                due,
                hop_due: hop_due.unwrap_or(due),
            }),
            _ => None,
        };
        let timestamp = match self.timestamp {
            rdkafka::Timestamp::CreateTime(ms) => Some((ms, TimestampKind::CreateTime)),
            rdkafka::Timestamp::LogAppendTime(ms) => Some((ms, TimestampKind::LogAppendTime)),
            rdkafka::Timestamp::NotAvailable => None,
        }
        .and_then(|(ms, kind)| {
            Some(OriginTimestamp {
                at: Timestamp::from_millis(u64::try_from(ms).ok()?),
                kind,
            })
        });
        Decoded {
            raw: RawMessage {
                payload,
                key,
                headers,
            },
            nulls,
            route,
            group,
            timestamp,
        }
    }
}

/// `len` as the 4 bytes a copied header writes (a Kafka record is far below 4 GiB).
fn length(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(NULL - 1)
}

/// The 4-byte length at `at` in `bytes`, moving `at` past it.
fn read_length(bytes: &[u8], at: &mut usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[*at..*at + 4]);
    *at += 4;
    u32::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of `payload`, `key` and `headers` copied into `chunks`, then decoded.
    fn copied(
        payload: &[u8],
        key: Option<&[u8]>,
        headers: &[(&str, Option<&[u8]>)],
        chunks: &mut Chunks,
    ) -> Decoded {
        Copied::from_parts(
            payload,
            key,
            || headers.iter().copied(),
            rdkafka::Timestamp::CreateTime(1_000),
            chunks,
        )
        .decode()
    }

    /// `decoded`'s event headers, owned, in order.
    fn headers_of(decoded: &Decoded) -> Vec<(String, Vec<u8>)> {
        decoded
            .raw
            .headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_vec()))
            .collect()
    }

    #[test]
    fn a_record_with_more_headers_than_are_kept_on_the_stack_keeps_them_all_in_order() {
        for count in [KEPT_HEADERS, KEPT_HEADERS + 1, 2 * KEPT_HEADERS + 3] {
            let names: Vec<String> = (0..count).map(|i| format!("h{i}")).collect();
            let values: Vec<Vec<u8>> = (0..count)
                .map(|i| vec![u8::try_from(i % 256).unwrap_or(0); i])
                .collect();
            let headers: Vec<(&str, Option<&[u8]>)> = names
                .iter()
                .zip(&values)
                .map(|(n, v)| (n.as_str(), Some(v.as_slice())))
                .collect();
            let d = copied(b"p", None, &headers, &mut Chunks::default());
            let want: Vec<(String, Vec<u8>)> = names.into_iter().zip(values).collect();
            assert_eq!(headers_of(&d), want, "{count} headers");
            assert_eq!(&d.raw.payload[..], b"p");
        }
    }

    #[test]
    fn a_copied_record_decodes_to_its_parts_in_order() {
        let mut chunks = Chunks::default();
        let d = copied(
            b"payload",
            Some(&[0x00, 0xfe, b'k']),
            &[
                ("zulu", Some(b"first")),
                (names::ROUTE_TO, Some(b"orders.retry")),
                ("alpha", Some(&[0xff, 0x00])),
                ("zulu", Some(b"second")),
                ("nothing", None),
                ("zulu", None),
                ("empty", Some(b"")),
                (names::ROUTE_DUE, Some(b"2000")),
                (names::GROUP, Some(b"billing")),
            ],
            &mut chunks,
        );
        assert_eq!(&d.raw.payload[..], b"payload");
        assert_eq!(d.raw.key.as_deref(), Some(&[0x00, 0xfe, b'k'][..]));
        let want = [
            ("zulu", &b"first"[..]),
            ("alpha", &[0xff, 0x00][..]),
            ("zulu", b"second"),
            ("nothing", b""),
            ("zulu", b""),
            ("empty", b""),
        ];
        assert_eq!(
            headers_of(&d),
            want.map(|(n, v)| (n.to_string(), v.to_vec())).to_vec()
        );
        // Null values by name and occurrence among the event's headers.
        assert_eq!(
            d.nulls,
            Nulls(vec![("nothing".into(), 0), ("zulu".into(), 2)])
        );
        let route = d.route.expect("a route");
        assert_eq!(route.to, "orders.retry");
        assert_eq!(route.due, Timestamp::from_millis(2_000));
        assert_eq!(d.group.as_deref(), Some("billing"));
        assert_eq!(
            d.timestamp.map(|t| (t.at, t.kind)),
            Some((Timestamp::from_millis(1_000), TimestampKind::CreateTime))
        );
    }

    #[test]
    fn records_share_a_chunk_and_a_large_one_gets_its_own() {
        let mut chunks = Chunks::default();
        let a = copied(b"aaaa", None, &[], &mut chunks);
        let b = copied(b"bbbb", None, &[("h", Some(b"v"))], &mut chunks);
        let large = vec![7u8; Chunks::SIZE + 1];
        let c = copied(&large, None, &[], &mut chunks);
        let d = copied(b"dddd", None, &[], &mut chunks);
        assert_eq!(
            (&a.raw.payload[..], &b.raw.payload[..]),
            (&b"aaaa"[..], &b"bbbb"[..])
        );
        assert_eq!(a.raw.key, None);
        // One after the other in the same allocation.
        assert_eq!(
            a.raw.payload.as_ptr().wrapping_add(4),
            b.raw.payload.as_ptr()
        );
        assert_eq!(c.raw.payload.len(), Chunks::SIZE + 1);
        assert!(c.raw.payload.iter().all(|b| *b == 7));
        assert_eq!(&d.raw.payload[..], b"dddd");
        assert_eq!(
            &b.raw
                .headers
                .iter()
                .next()
                .map(|(n, v)| (n.to_string(), v.to_vec())),
            &Some(("h".to_string(), b"v".to_vec()))
        );
    }

    #[test]
    fn a_record_read_alone_holds_only_its_own_bytes() {
        let mut exact = Chunks::exact();
        let one = copied(b"0123456789", Some(b"k"), &[("h", Some(b"v"))], &mut exact);
        assert_eq!(&one.raw.payload[..], b"0123456789");
        // Payload, key and the header as written (4 + 1 + 4 + 1 bytes) filled its allocation.
        assert_eq!(exact.buffer.capacity(), 0);
        let two = copied(b"abc", None, &[], &mut exact);
        assert_eq!(&two.raw.payload[..], b"abc");
        assert_eq!(exact.buffer.capacity(), 0);
    }

    #[test]
    fn null_headers_are_named_once_each() {
        let nulls = Nulls(vec![("a".into(), 0), ("b".into(), 0), ("a".into(), 2)]);
        assert_eq!(nulls.names().collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn headers_keep_order_repeats_and_bytes() {
        let raw = RawMessage {
            payload: Bytes::from_static(b"p"),
            key: None,
            headers: EventHeaders::new()
                .with("a", Bytes::from_static(&[0xff, 0]))
                .with("a", "again")
                .with("b", ""),
        };
        let out = headers(&raw, &Nulls::default(), &[(names::GROUP, b"billing")]);
        let read: Vec<(String, Vec<u8>)> = out
            .iter()
            .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
            .collect();
        assert_eq!(
            read,
            vec![
                ("a".to_string(), vec![0xff, 0]),
                ("a".to_string(), b"again".to_vec()),
                ("b".to_string(), Vec::new()),
                (names::GROUP.to_string(), b"billing".to_vec()),
            ]
        );
    }

    #[test]
    fn null_values_are_written_null_again() {
        let raw = RawMessage {
            payload: Bytes::new(),
            key: None,
            headers: EventHeaders::new()
                .with("a", "")
                .with("a", "")
                .with("b", ""),
        };
        let nulls = Nulls(vec![("a".into(), 1), ("b".into(), 0)]);
        let out = headers(&raw, &nulls, &[]);
        let read: Vec<Option<&[u8]>> = out.iter().map(|h| h.value).collect();
        assert_eq!(read, [Some(&b""[..]), None, None]);
    }

    #[test]
    fn route_headers_read_back() {
        let route = Route {
            to: "orders.retry.g".into(),
            due: Timestamp::from_millis(2_000),
            hop_due: Timestamp::from_millis(1_500),
        };
        let hs = route_headers(&route);
        assert_eq!(hs[0].1, b"orders.retry.g");
        assert_eq!(millis(&hs[1].1), Some(route.due));
        assert_eq!(millis(&hs[2].1), Some(route.hop_due));
        assert_eq!(millis(b"x"), None);
    }
}
