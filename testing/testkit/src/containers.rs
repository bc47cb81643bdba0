//! Brokers as containers, for laptops with a Docker engine (feature `testcontainers`, off by default).
//!
//! Each function here is a [`Container`](crate::Container) hook an [`Adapter`](crate::Adapter) names in
//! its `container` field ([`crate::hooks`] gives them whether the feature is on or not); an adapter
//! outside this repository writes its own hook the same way, with [`start`] for its image. Where no
//! `RETRY_TEST_*` variable names a broker, the driver calls the hook; if no Docker engine answers, the
//! broker is skipped loudly like any other missing broker. The containers live
//! as long as the suite runs: [`remove_all`] removes them before the test binary exits. SQS is ElasticMQ
//! here too; Pulsar runs with the delayed-delivery tick (100 ms) and strict `deliverAt` the Pulsar
//! fixture expects without an admin URL.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use testcontainers_modules::elasticmq::ElasticMq;
use testcontainers_modules::kafka::apache::{KAFKA_PORT, Kafka};
use testcontainers_modules::pulsar::Pulsar;
use testcontainers_modules::rabbitmq::RabbitMq;
use testcontainers_modules::testcontainers::core::ContainerPort;
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, Image};

use crate::suite::BoxFuture;

type Removal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How to remove each container started so far.
static RUNNING: Mutex<Vec<Removal>> = Mutex::new(Vec::new());

/// Removes every container this process started (the suite calls it before it exits: an exiting
/// process runs no destructors).
pub async fn remove_all() {
    let removals: Vec<Removal> =
        std::mem::take(&mut *RUNNING.lock().unwrap_or_else(|p| p.into_inner()));
    for removal in removals {
        removal.await;
    }
}

/// Starts `image` and returns the host and host port that reach its `port`; the container is removed
/// by [`remove_all`] when the suite ends.
pub async fn start<I: Image + 'static>(
    image: I,
    port: ContainerPort,
) -> Result<(String, u16), String> {
    let container: ContainerAsync<I> = image
        .start()
        .await
        .map_err(|e| format!("no Docker engine or the container failed: {e}"))?;
    let host = container
        .get_host()
        .await
        .map_err(|e| e.to_string())?
        .to_string();
    let port = container
        .get_host_port_ipv4(port)
        .await
        .map_err(|e| e.to_string())?;
    RUNNING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Box::pin(async move {
            if let Err(e) = container.rm().await {
                eprintln!("could not remove a container: {e}");
            }
        }));
    Ok((host, port))
}

/// Kafka as a container: a [`Container`](crate::Container) hook for [`Adapter::container`](crate::Adapter::container).
pub fn kafka() -> BoxFuture<Result<String, String>> {
    Box::pin(async {
        start(Kafka::default(), KAFKA_PORT)
            .await
            .map(|(h, p)| format!("kafka://{h}:{p}"))
    })
}

/// RabbitMQ as a container (the default `guest` user and vhost).
pub fn rabbitmq() -> BoxFuture<Result<String, String>> {
    Box::pin(async {
        start(RabbitMq::default(), ContainerPort::Tcp(5672))
            .await
            .map(|(h, p)| format!("amqp://guest:guest@{h}:{p}/%2f"))
    })
}

/// ElasticMQ as a container, for SQS.
pub fn sqs() -> BoxFuture<Result<String, String>> {
    Box::pin(async {
        start(ElasticMq::default(), ContainerPort::Tcp(9324))
            .await
            .map(|(h, p)| format!("http://{h}:{p}"))
    })
}

/// Pulsar as a container, with the delayed-delivery tick (100 ms) and strict `deliverAt` the Pulsar
/// fixture expects without an admin URL.
pub fn pulsar() -> BoxFuture<Result<String, String>> {
    Box::pin(async {
        start(
            Pulsar::default()
                .with_config_env("delayedDeliveryTickTimeMillis", "100")
                .with_config_env("isDelayedDeliveryDeliverAtTimeStrict", "true"),
            ContainerPort::Tcp(6650),
        )
        .await
        .map(|(h, p)| format!("pulsar://{h}:{p}"))
    })
}
