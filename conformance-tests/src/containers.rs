//! Brokers as containers, for laptops with a Docker engine (feature `testcontainers`, off by default).
//!
//! Where no `RETRY_TEST_*` variable names a broker, the harness asks this module to start one; if no
//! Docker engine answers, the broker is skipped loudly like any other missing broker. The containers live
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

async fn run<I: Image + 'static>(image: I, port: ContainerPort) -> Result<(String, u16), String> {
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

/// Starts `broker` ("kafka", "rabbitmq", "sqs", "pulsar") as a container and returns its URL.
pub async fn start(broker: &str) -> Result<String, String> {
    match broker {
        "kafka" => run(Kafka::default(), KAFKA_PORT)
            .await
            .map(|(h, p)| format!("kafka://{h}:{p}")),
        "rabbitmq" => run(RabbitMq::default(), ContainerPort::Tcp(5672))
            .await
            .map(|(h, p)| format!("amqp://guest:guest@{h}:{p}/%2f")),
        "sqs" => run(ElasticMq::default(), ContainerPort::Tcp(9324))
            .await
            .map(|(h, p)| format!("http://{h}:{p}")),
        "pulsar" => run(
            Pulsar::default()
                .with_config_env("delayedDeliveryTickTimeMillis", "100")
                .with_config_env("isDelayedDeliveryDeliverAtTimeStrict", "true"),
            ContainerPort::Tcp(6650),
        )
        .await
        .map(|(h, p)| format!("pulsar://{h}:{p}")),
        other => Err(format!("no container image for {other}")),
    }
}
