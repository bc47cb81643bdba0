//! One smoke test per broker, through the Rust client its adapter uses. Each broker is found through its
//! `RETRY_TEST_*` env var (written by `scripts/brokers start` to `target/brokers/env.sh`); a broker that is
//! not configured is skipped loudly, unless `RETRY_TEST_REQUIRE` names it, which makes it a failure.

use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};

type Check = fn(String) -> Result<(), String>;

fn main() {
    let args = Arguments::from_args();
    let required = std::env::var("RETRY_TEST_REQUIRE").unwrap_or_default();
    let brokers: [(&str, &str, Check); 9] = [
        ("kafka", "RETRY_TEST_KAFKA", kafka::smoke),
        ("rabbitmq", "RETRY_TEST_AMQP", rabbitmq::smoke),
        ("rabbitmq4", "RETRY_TEST_AMQP4", rabbitmq::smoke),
        ("sqs", "RETRY_TEST_SQS", sqs::smoke),
        ("pulsar", "RETRY_TEST_PULSAR", pulsar_smoke::smoke),
        // The secured listeners of `scripts/brokers start --tls`, through the same raw clients.
        ("kafka-tls", "RETRY_TEST_KAFKA_TLS", kafka::smoke),
        ("rabbitmq-tls", "RETRY_TEST_AMQP_TLS", rabbitmq::smoke),
        ("rabbitmq4-tls", "RETRY_TEST_AMQP4_TLS", rabbitmq::smoke),
        ("pulsar-tls", "RETRY_TEST_PULSAR_TLS", pulsar_smoke::smoke),
    ];
    let mut trials = Vec::new();
    for (name, var, check) in brokers {
        let test_name = format!("smoke::{name}");
        match std::env::var(var).ok().filter(|v| !v.is_empty()) {
            Some(url) => trials.push(Trial::test(test_name, move || {
                check(url).map_err(Failed::from)
            })),
            None if required.split(',').any(|r| r.trim() == name) => {
                let message =
                    format!("{name} is required by RETRY_TEST_REQUIRE but {var} is not set");
                trials.push(Trial::test(test_name, move || Err(Failed::from(message))));
            }
            None => {
                eprintln!(
                    "SKIP smoke::{name}: {var} is not set (start it with scripts/brokers start {name})"
                );
                trials.push(Trial::test(test_name, || Ok(())).with_ignored_flag(true));
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// A URL's base and its query's settings, where a `<key>_file` setting becomes `<key>` with the
/// file's content (a password file), as the adapters read them.
fn settings_of(url: &str) -> Result<(String, Vec<(String, String)>), String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), Vec::new()));
    };
    let mut out = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key.strip_suffix("_file") {
            Some(key) => {
                let text = std::fs::read_to_string(value).map_err(|e| format!("{value}: {e}"))?;
                out.push((
                    key.to_string(),
                    text.trim_end_matches(['\r', '\n']).to_string(),
                ));
            }
            None => out.push((key.to_string(), value.to_string())),
        }
    }
    Ok((base.to_string(), out))
}

fn ensure(condition: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if condition { Ok(()) } else { Err(message()) }
}

/// Kafka: produce one record with headers (acks=all, idempotent), consume it back from the beginning.
mod kafka {
    use super::*;
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    /// A client configuration for the URL: its servers and its security settings.
    fn client(url: &str) -> Result<ClientConfig, String> {
        let (base, settings) = settings_of(url)?;
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", base.trim_start_matches("kafka://"));
        for (k, v) in settings {
            c.set(k, v);
        }
        Ok(c)
    }

    pub(super) fn smoke(url: String) -> Result<(), String> {
        runtime()?.block_on(async move {
            let topic = unique("smoke");
            let producer: FutureProducer = client(&url)?
                .set("acks", "all")
                .set("enable.idempotence", "true")
                .create()
                .map_err(|e| format!("producer: {e}"))?;
            let headers = OwnedHeaders::new().insert(Header {
                key: "x-check",
                value: Some(&[0u8, 0xff, 7][..]),
            });
            producer
                .send(
                    FutureRecord::to(&topic)
                        .key("k1")
                        .payload("hello")
                        .headers(headers),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| format!("produce: {e}"))?;
            let consumer: StreamConsumer = client(&url)?
                .set("group.id", unique("smoke-group"))
                .set("auto.offset.reset", "earliest")
                .set("enable.auto.commit", "false")
                .create()
                .map_err(|e| format!("consumer: {e}"))?;
            consumer
                .subscribe(&[&topic])
                .map_err(|e| format!("subscribe: {e}"))?;
            let message = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
                .await
                .map_err(|_| "no record within 60 s".to_string())?
                .map_err(|e| format!("consume: {e}"))?;
            ensure(
                message.payload() == Some(&b"hello"[..]) && message.key() == Some(&b"k1"[..]),
                || "payload or key changed".into(),
            )?;
            let header = message
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "x-check"));
            ensure(
                header.and_then(|h| h.value) == Some(&[0u8, 0xff, 7][..]),
                || "header changed".into(),
            )
        })
    }
}

/// RabbitMQ: a message rejected into a queue with a fixed TTL dead-letters back to the work queue after
/// the TTL (the delay-level mechanism), with publisher confirms and headers intact.
mod rabbitmq {
    use super::*;
    use futures::StreamExt;
    use lapin::options::{
        BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::tcp::OwnedTLSConfig;
    use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
    use lapin::uri::AMQPUri;
    use lapin::{BasicProperties, ConnectionProperties, DefaultConnectionBuilder};

    pub(super) fn smoke(url: String) -> Result<(), String> {
        runtime()?.block_on(async move {
            // `password` (from `password_file`) and `tls_ca`, as the adapter reads them.
            let (base, settings) = settings_of(&url)?;
            let mut uri: AMQPUri = base.parse().map_err(|e| format!("URI: {e}"))?;
            let mut tls = OwnedTLSConfig::default();
            for (k, v) in settings {
                match k.as_str() {
                    "password" => uri.authority.userinfo.password = v,
                    "tls_ca" => {
                        tls.cert_chain =
                            Some(std::fs::read_to_string(&v).map_err(|e| format!("{v}: {e}"))?)
                    }
                    _ => return Err(format!("the smoke test does not know the setting {k}")),
                }
            }
            let conn = DefaultConnectionBuilder::new()
                .map_err(|e| format!("lapin: {e}"))?
                .with_uri(uri)
                .with_properties(ConnectionProperties::default())
                .with_tls_config(tls)
                .connect()
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let ch = conn
                .create_channel()
                .await
                .map_err(|e| format!("channel: {e}"))?;
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| format!("confirm_select: {e}"))?;
            let work = unique("smoke-work");
            let delay = unique("smoke-delay-1s");
            let durable = QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            };
            ch.queue_declare(work.as_str().into(), durable, FieldTable::default())
                .await
                .map_err(|e| format!("declare {work}: {e}"))?;
            let mut args = FieldTable::default();
            args.insert(
                ShortString::from("x-message-ttl"),
                AMQPValue::LongUInt(1_000),
            );
            args.insert(
                ShortString::from("x-dead-letter-exchange"),
                AMQPValue::LongString(LongString::from("")),
            );
            args.insert(
                ShortString::from("x-dead-letter-routing-key"),
                AMQPValue::LongString(LongString::from(work.as_str())),
            );
            ch.queue_declare(delay.as_str().into(), durable, args)
                .await
                .map_err(|e| format!("declare {delay}: {e}"))?;
            let mut headers = FieldTable::default();
            headers.insert(
                ShortString::from("x-check"),
                AMQPValue::LongString(LongString::from(&b"\x00\xff"[..])),
            );
            let sent = Instant::now();
            let confirm = ch
                .basic_publish(
                    "".into(),
                    delay.as_str().into(),
                    BasicPublishOptions::default(),
                    b"hello",
                    BasicProperties::default()
                        .with_delivery_mode(2)
                        .with_headers(headers),
                )
                .await
                .map_err(|e| format!("publish: {e}"))?
                .await
                .map_err(|e| format!("confirm: {e}"))?;
            ensure(confirm.is_ack(), || {
                format!("publish not confirmed: {confirm:?}")
            })?;
            let mut consumer = ch
                .basic_consume(
                    work.as_str().into(),
                    "smoke".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| format!("consume: {e}"))?;
            let delivery = tokio::time::timeout(Duration::from_secs(30), consumer.next())
                .await
                .map_err(|_| "nothing came back from the delay queue within 30 s".to_string())?
                .ok_or("consumer closed")?
                .map_err(|e| format!("delivery: {e}"))?;
            let waited = sent.elapsed();
            delivery
                .ack(BasicAckOptions::default())
                .await
                .map_err(|e| format!("ack: {e}"))?;
            ensure(waited >= Duration::from_millis(1_000), || {
                format!("came back after {waited:?}, before the 1 s TTL")
            })?;
            ensure(delivery.data == b"hello", || "payload changed".into())?;
            let header = delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("x-check").cloned());
            ensure(
                matches!(header, Some(AMQPValue::LongString(ref s)) if s.as_bytes() == b"\x00\xff"),
                || format!("header changed: {header:?}"),
            )?;
            for q in [&work, &delay] {
                let _ = ch
                    .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
            let _ = conn.close(200, "bye".into()).await;
            Ok(())
        })
    }
}

/// SQS (ElasticMQ): send with attributes, receive, change visibility, receive again, and let the redrive
/// policy move the message to its DLQ once it was received more often than `maxReceiveCount`.
mod sqs {
    use super::*;
    use aws_sdk_sqs::Client;
    use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    use aws_sdk_sqs::types::{
        MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName,
    };

    async fn receive(
        client: &Client,
        queue: &str,
        wait: i32,
    ) -> Result<Option<aws_sdk_sqs::types::Message>, String> {
        let out = client
            .receive_message()
            .queue_url(queue)
            .wait_time_seconds(wait)
            .max_number_of_messages(1)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .map_err(|e| format!("receive: {e}"))?;
        Ok(out.messages.unwrap_or_default().into_iter().next())
    }

    pub(super) fn smoke(url: String) -> Result<(), String> {
        runtime()?.block_on(async move {
            let config = aws_sdk_sqs::Config::builder()
                .behavior_version(BehaviorVersion::latest())
                .region(Region::new("us-east-1"))
                .endpoint_url(&url)
                .credentials_provider(Credentials::new("test", "test", None, None, "static"))
                .build();
            let client = Client::from_conf(config);
            let dlq = client
                .create_queue()
                .queue_name(unique("smoke-dlq"))
                .send()
                .await
                .map_err(|e| format!("create DLQ: {e:?}"))?
                .queue_url
                .ok_or("no DLQ url")?;
            let dlq_arn = client
                .get_queue_attributes()
                .queue_url(&dlq)
                .attribute_names(QueueAttributeName::QueueArn)
                .send()
                .await
                .map_err(|e| format!("DLQ arn: {e}"))?
                .attributes
                .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
                .ok_or("no DLQ arn")?;
            let redrive = format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"2"}}"#);
            let queue = client
                .create_queue()
                .queue_name(unique("smoke"))
                .attributes(QueueAttributeName::RedrivePolicy, redrive)
                .attributes(QueueAttributeName::VisibilityTimeout, "30")
                .send()
                .await
                .map_err(|e| format!("create queue: {e:?}"))?
                .queue_url
                .ok_or("no queue url")?;
            let attribute = MessageAttributeValue::builder()
                .data_type("Binary")
                .binary_value(aws_sdk_sqs::primitives::Blob::new(vec![0u8, 0xff]))
                .build()
                .map_err(|e| format!("attribute: {e}"))?;
            client
                .send_message()
                .queue_url(&queue)
                .message_body("hello")
                .message_attributes("x-check", attribute)
                .send()
                .await
                .map_err(|e| format!("send: {e:?}"))?;
            let first = receive(&client, &queue, 5)
                .await?
                .ok_or("nothing received")?;
            ensure(first.body.as_deref() == Some("hello"), || {
                "body changed".into()
            })?;
            let check = first
                .message_attributes
                .as_ref()
                .and_then(|a| a.get("x-check"))
                .and_then(|v| v.binary_value.clone());
            ensure(
                check.as_ref().map(|b| b.as_ref()) == Some(&[0u8, 0xff][..]),
                || "attribute changed".into(),
            )?;
            let hidden_at = Instant::now();
            client
                .change_message_visibility()
                .queue_url(&queue)
                .receipt_handle(first.receipt_handle.clone().ok_or("no receipt handle")?)
                .visibility_timeout(1)
                .send()
                .await
                .map_err(|e| format!("change visibility: {e:?}"))?;
            let second = receive(&client, &queue, 10)
                .await?
                .ok_or("not visible again after 1 s")?;
            ensure(hidden_at.elapsed() >= Duration::from_millis(900), || {
                format!("visible again after {:?}", hidden_at.elapsed())
            })?;
            let count = second.attributes.as_ref().and_then(|a| {
                a.get(&MessageSystemAttributeName::ApproximateReceiveCount)
                    .cloned()
            });
            ensure(count.as_deref() == Some("2"), || {
                format!("ApproximateReceiveCount {count:?}, want 2")
            })?;
            client
                .change_message_visibility()
                .queue_url(&queue)
                .receipt_handle(second.receipt_handle.clone().ok_or("no receipt handle")?)
                .visibility_timeout(0)
                .send()
                .await
                .map_err(|e| format!("change visibility: {e:?}"))?;
            // A third receive exceeds maxReceiveCount = 2: the broker moves the message to the DLQ instead.
            let third = receive(&client, &queue, 2).await?;
            ensure(third.is_none(), || {
                "received a third time instead of being redriven".into()
            })?;
            let dead = receive(&client, &dlq, 10)
                .await?
                .ok_or("nothing in the DLQ after the redrive")?;
            ensure(dead.body.as_deref() == Some("hello"), || {
                "DLQ body changed".into()
            })?;
            for q in [&queue, &dlq] {
                let _ = client.delete_queue().queue_url(q).send().await;
            }
            Ok(())
        })
    }
}

/// Pulsar: a message sent with `deliver_at` on a Shared subscription arrives no earlier than its delay,
/// with its properties; a message without delay arrives at once.
mod pulsar_smoke {
    use super::*;
    use futures::TryStreamExt;
    use pulsar::consumer::Consumer;
    use pulsar::producer::Message;
    use pulsar::{Authentication, Pulsar, SubType, TokioExecutor};

    pub(super) fn smoke(url: String) -> Result<(), String> {
        runtime()?.block_on(async move {
            // `tls_ca` and `token` (from `token_file`), as the adapter reads them.
            let (base, settings) = settings_of(&url)?;
            let mut builder = Pulsar::builder(&base, TokioExecutor);
            for (k, v) in settings {
                builder = match k.as_str() {
                    "tls_ca" => builder
                        .with_certificate_chain_file(&v)
                        .map_err(|e| format!("{v}: {e}"))?,
                    "token" => builder.with_auth(Authentication {
                        name: "token".into(),
                        data: v.into_bytes(),
                    }),
                    _ => return Err(format!("the smoke test does not know the setting {k}")),
                };
            }
            let client: Pulsar<TokioExecutor> = builder
                .build()
                .await
                .map_err(|e| format!("connect {base}: {e}"))?;
            let topic = format!("persistent://public/default/{}", unique("smoke"));
            let mut consumer: Consumer<Vec<u8>, TokioExecutor> = client
                .consumer()
                .with_topic(&topic)
                .with_subscription("smoke")
                .with_subscription_type(SubType::Shared)
                .build()
                .await
                .map_err(|e| format!("consumer: {e}"))?;
            let mut producer = client
                .producer()
                .with_topic(&topic)
                .build()
                .await
                .map_err(|e| format!("producer: {e}"))?;
            let delay = Duration::from_secs(2);
            let sent = Instant::now();
            let deliver_at = std::time::SystemTime::now() + delay;
            let deliver_at_ms = deliver_at
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|e| e.to_string())?
                .as_millis() as i64;
            let mut properties = std::collections::HashMap::new();
            properties.insert("x-check".to_string(), "héllo".to_string());
            let delayed = Message {
                payload: b"later".to_vec(),
                properties,
                deliver_at_time: Some(deliver_at_ms),
                partition_key: Some("k1".to_string()),
                ..Message::default()
            };
            producer
                .send_non_blocking(delayed)
                .await
                .map_err(|e| format!("send: {e}"))?
                .await
                .map_err(|e| format!("send receipt: {e}"))?;
            producer
                .send_non_blocking(Message {
                    payload: b"now".to_vec(),
                    ..Message::default()
                })
                .await
                .map_err(|e| format!("send: {e}"))?
                .await
                .map_err(|e| format!("send receipt: {e}"))?;
            let mut seen = Vec::new();
            while seen.len() < 2 {
                let msg = tokio::time::timeout(Duration::from_secs(30), consumer.try_next())
                    .await
                    .map_err(|_| format!("only {} of 2 messages within 30 s", seen.len()))?
                    .map_err(|e| format!("receive: {e}"))?
                    .ok_or("consumer closed")?;
                let at = sent.elapsed();
                let payload = msg.payload.data.clone();
                let props: Vec<(String, String)> = msg
                    .payload
                    .metadata
                    .properties
                    .iter()
                    .map(|kv| (kv.key.clone(), kv.value.clone()))
                    .collect();
                consumer.ack(&msg).await.map_err(|e| format!("ack: {e}"))?;
                seen.push((payload, at, props));
            }
            ensure(seen[0].0 == b"now", || {
                "the undelayed message did not come first".into()
            })?;
            let (payload, at, props) = &seen[1];
            ensure(payload == b"later", || "payload changed".into())?;
            ensure(*at >= delay, || {
                format!("delayed message arrived after {at:?}, before its {delay:?} delay")
            })?;
            ensure(
                props.iter().any(|(k, v)| k == "x-check" && v == "héllo"),
                || format!("properties changed: {props:?}"),
            )?;
            Ok(())
        })
    }
}
