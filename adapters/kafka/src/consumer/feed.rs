//! The source topic's partitions read through one queue of the consumer's own, in batches.
//!
//! Why: the rdkafka crate hands out one message per poll, each wrapped in an event of its own and a
//! reference count, with clock readings around it; librdkafka's batch read
//! (`rd_kafka_consume_batch_queue`) takes up to a batch under one lock, which costs the consumer
//! process less CPU per record (docs/PERFORMANCE.md). The crate wraps no batch read, so this module
//! calls librdkafka itself.
//!
//! The source's partitions are forwarded to the queue after each assignment (librdkafka may forward a
//! partition it starts to the consumer's queue again); records that reached the consumer's queue before
//! the forwarding are read before anything of this queue, so they keep their place (see `worker::run`). The consumer thread waits on this queue, and anything arriving on the
//! consumer's own queue (a rebalance, an error) or on a retry partition's wakes that wait
//! ([`SourceQueue::waker`]).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_void};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::codec::{Chunks, Copied};

/// A queue of the consumer's own that the source's partitions are forwarded to.
pub(crate) struct SourceQueue {
    queue: *mut rd::rd_kafka_queue_t,
    topic: CString,
    /// The topic's name, shared by every record read: the thread's offset bookkeeping finds a run of
    /// records of one topic by this pointer.
    name: Arc<str>,
}

// SAFETY: a librdkafka queue handle may be used from any thread (every queue operation takes the
// queue's lock); the handle is destroyed once, on drop.
unsafe impl Send for SourceQueue {}
// SAFETY: as above: every call made through `&SourceQueue` is thread-safe in librdkafka.
unsafe impl Sync for SourceQueue {}

/// Wakes a wait on a [`SourceQueue`] from any thread. It does not keep the queue: librdkafka's
/// callbacks hold wakers, and the queue must go before its client does.
///
/// Every clone shares one slot, which [`Waker::close`] empties before the queue is dropped: a wake
/// holds the slot's lock while it holds the queue, so once `close` returns no callback holds the queue
/// or can take it, and the queue's last reference is dropped by its owner — not inside a librdkafka
/// callback, on librdkafka's thread, with the lock of the queue that called back held.
#[derive(Clone)]
pub(crate) struct Waker(Arc<Mutex<Weak<SourceQueue>>>);

impl Waker {
    /// Ends the current (or next) wait of [`SourceQueue::read`] at once; nothing once closed.
    pub(crate) fn wake(&self) {
        let slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = slot.upgrade() {
            // SAFETY: the queue handle is alive while this `Arc` holds it.
            unsafe { rd::rd_kafka_queue_yield(queue.queue) }
        }
        // `queue` goes before `slot`: `close` cannot return while a wake holds the queue.
    }

    /// Lets go of the queue for every clone of this waker, after any wake under way has finished;
    /// later wakes do nothing.
    pub(crate) fn close(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Weak::new();
    }
}

/// One record read, or the error read in its place.
pub(crate) enum Item {
    /// A record: its topic's name, partition, offset and copy.
    Record(Arc<str>, i32, i64, Copied),
    /// An error librdkafka reported on the queue.
    Error(KafkaError),
}

impl SourceQueue {
    /// A new queue of `consumer`'s for `topic`'s partitions.
    pub(crate) fn new<C: rdkafka::consumer::ConsumerContext>(
        consumer: &BaseConsumer<C>,
        topic: &str,
    ) -> Option<Arc<Self>> {
        let name = Arc::from(topic);
        let topic = CString::new(topic).ok()?;
        // SAFETY: the client handle is alive for the call; the new queue is owned by the result.
        let queue = unsafe { rd::rd_kafka_queue_new(consumer.client().native_ptr()) };
        (!queue.is_null()).then(|| Arc::new(Self { queue, topic, name }))
    }

    /// A waker of this queue's waits (its clones share it: closing one closes all).
    pub(crate) fn waker(self: &Arc<Self>) -> Waker {
        Waker(Arc::new(Mutex::new(Arc::downgrade(self))))
    }

    /// Forwards `partition` of the topic to this queue; `false` if librdkafka knows no such partition.
    pub(crate) fn attach<C: rdkafka::consumer::ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        partition: i32,
    ) -> bool {
        // SAFETY: the client and this queue are alive for the call; the partition's handle is
        // released at once (the forwarding holds its own reference to this queue).
        unsafe {
            let partition_queue = rd::rd_kafka_queue_get_partition(
                consumer.client().native_ptr(),
                self.topic.as_ptr(),
                partition,
            );
            if partition_queue.is_null() {
                return false;
            }
            rd::rd_kafka_queue_forward(partition_queue, self.queue);
            rd::rd_kafka_queue_destroy(partition_queue);
        }
        true
    }

    /// Reads up to `max` records, waiting up to `wait` for the first (not longer once one came), each
    /// copied into `chunks`.
    ///
    /// librdkafka's batch read waits for its batch to fill until its timeout: so the wait is for one
    /// record alone (`rd_kafka_consume_queue`, which returns with the first), and the batch read takes
    /// what is there without waiting.
    pub(crate) fn read(&self, wait: Duration, max: usize, chunks: &mut Chunks) -> Vec<Item> {
        let mut items = Vec::new();
        let mut messages: Vec<*mut rd::rd_kafka_message_t> = Vec::new();
        if !wait.is_zero() && max > 0 {
            let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: the queue is alive; the message returned (if any) is ours to destroy.
            let first = unsafe { rd::rd_kafka_consume_queue(self.queue, wait_ms) };
            if first.is_null() {
                return items;
            }
            messages.push(first);
        }
        let room = max - messages.len();
        if room > 0 {
            let start = messages.len();
            messages.resize(max, std::ptr::null_mut());
            // SAFETY: `messages[start..]` has room for `room` pointers; librdkafka fills the first
            // `n` of them and does not wait (timeout 0).
            let n = unsafe {
                rd::rd_kafka_consume_batch_queue(
                    self.queue,
                    0,
                    messages[start..].as_mut_ptr(),
                    room,
                )
            };
            messages.truncate(start + usize::try_from(n).unwrap_or(0));
        }
        items.reserve(messages.len());
        for message in messages {
            // SAFETY: each pointer is a message librdkafka handed over, read then destroyed once.
            unsafe {
                items.push(item(self, message, chunks));
                rd::rd_kafka_message_destroy(message);
            }
        }
        items
    }
}

/// A handle on the consumer's own queue, to ask how much it holds: the rdkafka crate's poll answers
/// `None` both when the queue is empty and when it served an event (a rebalance, a commit's result),
/// so it cannot say when the queue was read to its end.
pub(crate) struct ConsumerQueue(*mut rd::rd_kafka_queue_t);

// SAFETY: as for `SourceQueue`: the handle's calls are thread-safe, and it is destroyed once.
unsafe impl Send for ConsumerQueue {}

impl ConsumerQueue {
    /// A handle on `consumer`'s queue.
    pub(crate) fn new<C: rdkafka::consumer::ConsumerContext>(
        consumer: &BaseConsumer<C>,
    ) -> Option<Self> {
        // SAFETY: the client is alive for the call; the handle returned is ours to destroy.
        let queue = unsafe { rd::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        (!queue.is_null()).then_some(Self(queue))
    }

    /// Whether the queue holds nothing now.
    pub(crate) fn is_empty(&self) -> bool {
        // SAFETY: the handle is alive while `self` is.
        unsafe { rd::rd_kafka_queue_length(self.0) == 0 }
    }
}

impl Drop for ConsumerQueue {
    fn drop(&mut self) {
        // SAFETY: the handle is this struct's own, destroyed once.
        unsafe { rd::rd_kafka_queue_destroy(self.0) }
    }
}

impl Drop for SourceQueue {
    fn drop(&mut self) {
        // SAFETY: the handle is this struct's own, destroyed once.
        unsafe { rd::rd_kafka_queue_destroy(self.queue) }
    }
}

/// The record (or error) `message` holds, copied.
///
/// # Safety
/// `message` must be a live message handed over by librdkafka.
unsafe fn item(
    queue: &SourceQueue,
    message: *mut rd::rd_kafka_message_t,
    chunks: &mut Chunks,
) -> Item {
    // SAFETY (every block below): the caller's promise — `message` and every pointer read from it
    // (topic, payload, key, header list) are librdkafka's own, alive until the message is destroyed,
    // which happens after this function returns.
    let m = unsafe { &*message };
    if m.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Item::Error(KafkaError::MessageConsumption(RDKafkaErrorCode::from(
            m.err,
        )));
    }
    // Only the source's partitions are forwarded here: its shared name, without an allocation.
    let topic = unsafe { CStr::from_ptr(rd::rd_kafka_topic_name(m.rkt)) };
    let topic = if topic == queue.topic.as_c_str() {
        queue.name.clone()
    } else {
        Arc::from(topic.to_string_lossy())
    };
    let payload = unsafe { bytes_at(m.payload, m.len) }.unwrap_or_default();
    let key = unsafe { bytes_at(m.key, m.key_len) };
    let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    let millis = unsafe { rd::rd_kafka_message_timestamp(message, &mut kind) };
    let timestamp = match kind {
        rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_CREATE_TIME => {
            rdkafka::Timestamp::CreateTime(millis)
        }
        rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME => {
            rdkafka::Timestamp::LogAppendTime(millis)
        }
        _ => rdkafka::Timestamp::NotAvailable,
    };
    let mut list = std::ptr::null_mut();
    let found = unsafe { rd::rd_kafka_message_headers(message, &mut list) };
    let count = if found == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && !list.is_null() {
        unsafe { rd::rd_kafka_header_cnt(list) }
    } else {
        0
    };
    // Each step an index into librdkafka's list, without a list of our own; walked once where the
    // record has few headers (see `Copied::from_parts`).
    let headers = || {
        (0..count).filter_map(move |i| {
            let (mut name, mut value, mut len) = (std::ptr::null(), std::ptr::null(), 0usize);
            // `i` is within the list.
            let found =
                unsafe { rd::rd_kafka_header_get_all(list, i, &mut name, &mut value, &mut len) };
            (found == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| {
                // The name is NUL-terminated, the value `len` bytes or null. A name that is not
                // UTF-8 (an event's header names are text) is read as empty.
                let name = unsafe { CStr::from_ptr(name) }.to_str().unwrap_or_default();
                (name, unsafe { bytes_at(value.cast_mut(), len) })
            })
        })
    };
    let copied = Copied::from_parts(payload, key, headers, timestamp, chunks);
    Item::Record(topic, m.partition, m.offset, copied)
}

/// The `len` bytes at `at`, or `None` for a null pointer.
///
/// # Safety
/// `at` must be null or point at `len` readable bytes that outlive the result.
unsafe fn bytes_at<'a>(at: *mut c_void, len: usize) -> Option<&'a [u8]> {
    // SAFETY: the caller's promise.
    (!at.is_null()).then(|| unsafe { std::slice::from_raw_parts(at.cast::<u8>(), len) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::config::ClientConfig;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::{Offset, TopicPartitionList};

    /// Records with every shape a header list and a key can take.
    fn publish(bootstrap: &str) {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .expect("producer");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "x-retry-id",
                value: Some("order-7"),
            })
            .insert(Header {
                key: "trace",
                value: None::<&[u8]>,
            })
            .insert(Header {
                key: "empty",
                value: Some(""),
            })
            .insert(Header {
                key: "binary",
                value: Some(&[0xff_u8, 0x00, 0xfe][..]),
            })
            .insert(Header {
                key: "trace",
                value: Some("again"),
            });
        let keyed = BaseRecord::to("orders")
            .partition(0)
            .key("customer-1")
            .payload("first")
            .headers(headers)
            .timestamp(1_700_000_000_123);
        producer.send(keyed).map_err(|(e, _)| e).expect("send");
        let bare = BaseRecord::<(), [u8]>::to("orders")
            .partition(0)
            .payload(&[][..]);
        producer.send(bare).map_err(|(e, _)| e).expect("send");
        producer.flush(Duration::from_secs(10)).expect("flush");
    }

    fn consumer(bootstrap: &str, group: &str) -> BaseConsumer {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .create()
            .expect("consumer");
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset("orders", 0, Offset::Beginning)
            .expect("partition");
        consumer.assign(&assignment).expect("assign");
        consumer
    }

    /// A mock cluster with `orders` of one partition.
    fn cluster() -> rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>
    {
        let cluster = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("orders", 1, 1).expect("topic");
        cluster
    }

    /// A consumer of `orders` in `group` and its source queue, the partition forwarded to it.
    fn source_queue(bootstrap: &str, group: &str) -> (BaseConsumer, Arc<SourceQueue>) {
        let consumer = consumer(bootstrap, group);
        let queue = SourceQueue::new(&consumer, "orders").expect("queue");
        assert!(queue.attach(&consumer, 0));
        (consumer, queue)
    }

    /// How long a read of `queue`, waiting up to `wait`, took; it must read nothing.
    fn empty_read_took(queue: &SourceQueue, wait: Duration) -> Duration {
        let started = std::time::Instant::now();
        assert!(queue.read(wait, 16, &mut Chunks::default()).is_empty());
        started.elapsed()
    }

    #[test]
    fn a_record_read_in_a_batch_is_copied_as_one_polled_alone() {
        let cluster = cluster();
        publish(&cluster.bootstrap_servers());

        let polled = consumer(&cluster.bootstrap_servers(), "polled");
        let mut expected = Vec::new();
        while expected.len() < 2 {
            if let Some(message) = polled.poll(Duration::from_millis(100)) {
                let message = message.expect("record");
                expected.push(Copied::from_message(&message, &mut Chunks::default()).decode());
            }
        }

        let (batched, queue) = source_queue(&cluster.bootstrap_servers(), "batched");
        let mut read = Vec::new();
        let mut chunks = Chunks::default();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while read.len() < 2 && std::time::Instant::now() < deadline {
            batched.poll(Duration::ZERO);
            read.extend(queue.read(Duration::from_millis(100), 16, &mut chunks));
        }
        assert_eq!(read.len(), 2, "both records, through the queue");
        for (item, expected) in read.into_iter().zip(&expected) {
            let Item::Record(topic, partition, _, copied) = item else {
                panic!("an error where a record was");
            };
            assert_eq!((&*topic, partition), ("orders", 0));
            let decoded = copied.decode();
            assert_eq!(decoded.raw, expected.raw);
            assert_eq!(decoded.nulls, expected.nulls);
            assert_eq!(decoded.timestamp, expected.timestamp);
        }
        assert_eq!(expected[0].nulls.names().collect::<Vec<_>>(), ["trace"]);
        assert_eq!(expected[0].raw.key.as_deref(), Some(&b"customer-1"[..]));
        assert_eq!(expected[1].raw.key, None);
        drop(queue);
    }

    #[test]
    fn a_wait_ends_with_the_first_record_and_does_not_wait_to_fill_the_batch() {
        let cluster = cluster();
        let (consumer, queue) = source_queue(&cluster.bootstrap_servers(), "one");
        publish(&cluster.bootstrap_servers());
        let started = std::time::Instant::now();
        let mut read = Vec::new();
        while read.len() < 2 && started.elapsed() < Duration::from_secs(30) {
            consumer.poll(Duration::ZERO);
            read.extend(queue.read(Duration::from_secs(30), 256, &mut Chunks::default()));
        }
        assert_eq!(read.len(), 2);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the records came without waiting for 256 of them ({:?})",
            started.elapsed()
        );
    }

    #[test]
    fn a_closed_waker_neither_holds_nor_wakes_the_queue() {
        let cluster = cluster();
        let (_consumer, queue) = source_queue(&cluster.bootstrap_servers(), "closing");
        let waker = queue.waker();
        // Another thread wakes without pause, as librdkafka's callbacks may while the queue closes.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waking = std::thread::spawn({
            let (waker, stop) = (waker.clone(), stop.clone());
            move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    waker.wake();
                }
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        waker.close();
        // Sampled many times, as a wake under way would hold it at any moment.
        for _ in 0..10_000 {
            assert_eq!(Arc::strong_count(&queue), 1, "a wake held the closed queue");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        waking.join().expect("waking thread");
        // A wake before the close may have left the queue's yield flag set: a short wait takes it.
        queue.read(Duration::from_millis(1), 16, &mut Chunks::default());
        waker.wake();
        let waited = empty_read_took(&queue, Duration::from_millis(300));
        assert!(
            waited >= Duration::from_millis(250),
            "a wake after close ended the wait ({waited:?})"
        );
    }

    #[test]
    fn a_wait_on_the_queue_ends_when_woken() {
        let cluster = cluster();
        let (_consumer, queue) = source_queue(&cluster.bootstrap_servers(), "idle");
        let waker = queue.waker();
        let woken = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            waker.wake();
        });
        let waited = empty_read_took(&queue, Duration::from_secs(30));
        assert!(
            waited < Duration::from_secs(10),
            "the wait ended at the wake, not its 30 s ({waited:?})"
        );
        woken.join().expect("waker thread");
    }
}
