//! Consumer groups through SNS (the `sns` setting) against moto's server (`RETRY_TEST_SNS`, started by
//! `scripts/brokers`), read back with raw aws-sdk-sns and aws-sdk-sqs clients:
//!
//! * declaring a group makes an SNS topic, and a queue per group (the default group's named as the
//!   topic) subscribed to it with raw message delivery, each with a redrive policy to its own DLQ and a
//!   policy that lets the topic send to it;
//! * a dead letter of one group lands in that group's DLQ alone, while the other group handles the
//!   event once;
//! * deleting the topic removes the topic, every group's queue, retry queue and DLQ (a queue counts as
//!   gone only when SQS answers that it does not exist).
//!
//! Without `RETRY_TEST_SNS` the test is listed as ignored with the reason; with `RETRY_TEST_REQUIRE`
//! naming sqs, that is a failure.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use event_retry_core::adapter::{Admin, default_group};
use event_retry_core::broker::Broker;
use event_retry_core::classify::HandlerError;
use event_retry_core::event::Event;
use event_retry_core::policy::RetryPolicy;
use event_retry_core::runtime::{ConsumerHandle, Context, handler_fn};
use event_retry_sqs::{SqsConfig, SqsTransport};
use libtest_mimic::Arguments;

fn main() {
    let args = Arguments::from_args();
    let tests = test_support::named_tests![each_group_has_its_own_subscribed_queue_and_dlq];
    let trials = test_support::broker::trials("sqs-sns", "RETRY_TEST_SNS", &tests);
    libtest_mimic::run(&args, trials).exit();
}

/// Raw clients of the endpoint at `url`.
fn raw_clients(url: &str) -> (aws_sdk_sns::Client, aws_sdk_sqs::Client) {
    let shared = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(url)
        .credentials_provider(aws_sdk_sqs::config::SharedCredentialsProvider::new(
            aws_sdk_sqs::config::Credentials::new("local", "local", None, None, "test"),
        ))
        .build();
    (
        aws_sdk_sns::Client::new(&shared),
        aws_sdk_sqs::Client::new(&shared),
    )
}

/// The queue `name`'s attribute `attribute`, read with the raw client (`None` when the queue is gone).
///
/// Only SQS's answer that the queue does not exist means gone; any other error (the endpoint
/// unreachable, a refused request, …) is an error, so a deletion check cannot pass on a failed read.
async fn queue_attribute(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    attribute: &str,
) -> Result<Option<String>, String> {
    let found = match sqs.get_queue_url().queue_name(name).send().await {
        Ok(found) => found,
        Err(e) if queue_does_not_exist(&e) => return Ok(None),
        Err(e) => {
            return Err(format!(
                "look up queue {name}: {}",
                aws_sdk_sqs::error::DisplayErrorContext(&e)
            ));
        }
    };
    let attributes = sqs
        .get_queue_attributes()
        .queue_url(found.queue_url.unwrap_or_default())
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
        .send()
        .await
        .map_err(|e| format!("read the attributes of {name}: {e}"))?
        .attributes
        .unwrap_or_default();
    Ok(Some(
        attributes
            .get(&aws_sdk_sqs::types::QueueAttributeName::from(attribute))
            .cloned()
            .unwrap_or_default(),
    ))
}

/// Whether `error` is SQS's answer that the queue does not exist: `QueueDoesNotExist`, the code
/// `AWS.SimpleQueueService.NonExistentQueue` that the SDK reads from the `x-amzn-query-error` header
/// (as moto sends it), or the bare `QueueDoesNotExist` type of a server that sends no such header.
fn queue_does_not_exist(
    error: &aws_sdk_sqs::error::SdkError<aws_sdk_sqs::operation::get_queue_url::GetQueueUrlError>,
) -> bool {
    use aws_sdk_sqs::error::ProvideErrorMetadata;
    error.as_service_error().is_some_and(|e| {
        e.is_queue_does_not_exist()
            || matches!(
                e.code(),
                Some("AWS.SimpleQueueService.NonExistentQueue" | "QueueDoesNotExist")
            )
    })
}

/// The messages in queue `name` (visible, delayed and in flight), read with the raw client.
async fn held(sqs: &aws_sdk_sqs::Client, name: &str) -> Result<u64, String> {
    let mut total = 0;
    for attribute in [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesDelayed",
        "ApproximateNumberOfMessagesNotVisible",
    ] {
        total += queue_attribute(sqs, name, attribute)
            .await?
            .ok_or(format!("queue {name} does not exist"))?
            .parse::<u64>()
            .unwrap_or(0);
    }
    Ok(total)
}

async fn consumer(
    broker: &Broker,
    topic: &str,
    group: &str,
    refuse: bool,
    calls: Arc<AtomicUsize>,
) -> Result<ConsumerHandle, String> {
    broker
        .consumer(topic)
        .group(group)
        .policy(RetryPolicy::parse("1s x2").map_err(|e| e.to_string())?)
        .build()
        .map_err(|e| e.to_string())?
        .start(handler_fn(move |_event: Event, _ctx: Context| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if refuse {
                    Err(HandlerError::non_retryable("billing refuses it"))
                } else {
                    Ok(())
                }
            }
        }))
        .await
        .map_err(|e| e.to_string())
}

fn each_group_has_its_own_subscribed_queue_and_dlq(url: String) -> Result<(), String> {
    test_support::broker::runtime()?.block_on(async move {
        let config = SqsConfig {
            sns: true,
            ..SqsConfig::default()
        };
        let transport = SqsTransport::connect_with(&url, config)
            .await
            .map_err(|e| e.to_string())?;
        let (sns, sqs) = raw_clients(&url);
        let topic = format!("sns-groups-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let billing = format!("{topic}-billing");
        transport
            .declare(&topic, Some("billing"))
            .await
            .map_err(|e| e.to_string())?;

        // The topic, and one subscription per group with raw message delivery.
        let topics = sns
            .list_topics()
            .send()
            .await
            .map_err(|e| format!("list topics: {e}"))?;
        let topic_arn = topics
            .topics()
            .iter()
            .filter_map(|t| t.topic_arn())
            .find(|arn| arn.ends_with(&format!(":{topic}")))
            .ok_or(format!("SNS has no topic {topic}"))?
            .to_string();
        let subscriptions = sns
            .list_subscriptions_by_topic()
            .topic_arn(&topic_arn)
            .send()
            .await
            .map_err(|e| format!("list subscriptions: {e}"))?;
        let mut endpoints = Vec::new();
        for s in subscriptions.subscriptions() {
            let raw = sns
                .get_subscription_attributes()
                .subscription_arn(s.subscription_arn().unwrap_or_default())
                .send()
                .await
                .map_err(|e| format!("read a subscription: {e}"))?
                .attributes
                .unwrap_or_default()
                .get("RawMessageDelivery")
                .cloned();
            if raw.as_deref() != Some("true") {
                return Err(format!("{s:?} is not raw message delivery: {raw:?}"));
            }
            endpoints.push(
                s.endpoint()
                    .and_then(|e| e.rsplit(':').next())
                    .unwrap_or_default()
                    .to_string(),
            );
        }
        endpoints.sort();
        let mut want = vec![topic.clone(), billing.clone()];
        want.sort();
        if endpoints != want {
            return Err(format!(
                "queues subscribed to {topic}: {endpoints:?}, want {want:?}"
            ));
        }
        // Each queue redrives to a DLQ of its own, and lets the topic send to it.
        for queue in [&topic, &billing] {
            let redrive = queue_attribute(&sqs, queue, "RedrivePolicy")
                .await?
                .unwrap_or_default();
            if !redrive.contains(&format!(":{queue}-dlq\"")) {
                return Err(format!("{queue} redrives elsewhere: {redrive}"));
            }
            let policy = queue_attribute(&sqs, queue, "Policy")
                .await?
                .unwrap_or_default();
            if !policy.contains(&topic_arn) {
                return Err(format!("{queue}'s policy does not let {topic_arn} send: {policy}"));
            }
        }

        // Billing refuses the event; the default group handles it.
        let broker = Broker::new(transport.clone());
        let (billing_calls, default_calls) = (Arc::default(), Arc::default());
        let b = consumer(&broker, &topic, "billing", true, Arc::clone(&billing_calls)).await?;
        let d = consumer(
            &broker,
            &topic,
            &default_group(&topic),
            false,
            Arc::clone(&default_calls),
        )
        .await?;
        broker
            .producer()
            .publish(&topic, Event::new("refused by billing").with_id("e1"))
            .await
            .map_err(|e| e.to_string())?;
        // Both groups have had the event: billing's dead letter is in its DLQ and the default group
        // was called.
        let deadline = Instant::now() + Duration::from_secs(30);
        while held(&sqs, &format!("{billing}-dlq")).await? < 1
            || default_calls.load(Ordering::SeqCst) < 1
        {
            if Instant::now() > deadline {
                return Err(format!(
                    "within 30 s: billing DLQ {}, default group's calls {}, want 1 and 1",
                    held(&sqs, &format!("{billing}-dlq")).await?,
                    default_calls.load(Ordering::SeqCst)
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // No window for a stray copy to show up: once both consumers are shut down (in-flight work
        // finished or released), no copy of the event is outside SQS, and every copy inside it is
        // counted now — visible, in flight or delayed, in a group's queue, its retry queue (where a
        // retry waits out its delay) or its DLQ. moto's SNS delivers to the subscribed queues within
        // the publish call, so no copy is still on its way from the topic.
        b.shutdown().await.map_err(|e| e.to_string())?;
        d.shutdown().await.map_err(|e| e.to_string())?;
        let counts = [
            billing_calls.load(Ordering::SeqCst) as u64,
            default_calls.load(Ordering::SeqCst) as u64,
            held(&sqs, &format!("{billing}-dlq")).await?,
            held(&sqs, &format!("{topic}-dlq")).await?,
            held(&sqs, &billing).await?,
            held(&sqs, &topic).await?,
            held(&sqs, &format!("{billing}-retry")).await?,
            held(&sqs, &format!("{topic}-retry")).await?,
        ];
        if counts != [1, 1, 1, 0, 0, 0, 0, 0] {
            return Err(format!(
                "[billing calls, default calls, billing DLQ, default DLQ, billing queue, default queue, \
                 billing retry queue, default retry queue] = {counts:?}, want [1, 1, 1, 0, 0, 0, 0, 0]"
            ));
        }

        transport.delete(&topic).await.map_err(|e| e.to_string())?;
        let left = sns
            .list_topics()
            .send()
            .await
            .map_err(|e| format!("list topics: {e}"))?
            .topics()
            .iter()
            .any(|t| t.topic_arn() == Some(topic_arn.as_str()));
        for queue in [topic.clone(), billing.clone()]
            .into_iter()
            .flat_map(|q| [format!("{q}-retry"), format!("{q}-dlq"), q])
        {
            if queue_attribute(&sqs, &queue, "QueueArn").await?.is_some() {
                return Err(format!("queue {queue} is left after deleting the topic"));
            }
        }
        if left {
            return Err(format!("SNS topic {topic} is left after deleting it"));
        }
        Ok(())
    })
}
