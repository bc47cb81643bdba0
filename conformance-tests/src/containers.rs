//! Brokers as containers, for laptops with a Docker engine (feature `testcontainers`, off by default).
//!
//! Where no `RETRY_TEST_*` variable names a broker, the harness asks this module to start one; if no
//! Docker engine answers, the broker is skipped loudly like any other missing broker. The containers live
//! as long as the test binary (they are removed when it exits). SQS is ElasticMQ here too.

use std::any::Any;
use std::sync::Mutex;

use testcontainers_modules::elasticmq::ElasticMq;
use testcontainers_modules::kafka::apache::{KAFKA_PORT, Kafka};
use testcontainers_modules::pulsar::Pulsar;
use testcontainers_modules::rabbitmq::RabbitMq;
use testcontainers_modules::testcontainers::core::ContainerPort;
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, Image};

/// Containers started so far, kept alive until the process exits.
static RUNNING: Mutex<Vec<Box<dyn Any + Send>>> = Mutex::new(Vec::new());

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
        .push(Box::new(container));
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
        "pulsar" => run(Pulsar::default(), ContainerPort::Tcp(6650))
            .await
            .map(|(h, p)| format!("pulsar://{h}:{p}")),
        other => Err(format!("no container image for {other}")),
    }
}
