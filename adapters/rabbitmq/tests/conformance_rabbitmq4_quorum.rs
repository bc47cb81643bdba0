//! The conformance suite against RabbitMQ 4 (`RETRY_TEST_AMQP4`) on quorum queues (`queue_type=quorum`):
//! every queue the adapter declares — work and retry queues, the DLQ, the delay ladder — is a quorum
//! queue, each with an explicit delivery limit, where RabbitMQ 4 would otherwise drop a message returned
//! 20 times. The report's column is `rabbitmq4-quorum`.

mod suite;

use event_retry_rabbitmq::{QueueType, RabbitConfig};
use event_retry_testkit::Adapter;

fn main() {
    event_retry_testkit::run(Adapter {
        name: "rabbitmq4-quorum",
        url_env: Some("RETRY_TEST_AMQP4"),
        container: None,
        connect: |url| {
            Box::pin(suite::connect(
                url,
                "rabbitmq4-quorum",
                "RETRY_TEST_AMQP4",
                RabbitConfig {
                    queue_type: QueueType::Quorum,
                    ..RabbitConfig::default()
                },
            ))
        },
    })
}
