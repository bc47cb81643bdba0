//! A TCP forwarder: the consumer's way to the broker when it runs in a network namespace of its own.
//!
//! Brokers listen on 127.0.0.1 of the root namespace, which a namespace cannot reach. Inside the
//! consumer's namespace a forwarder listens on the broker's loopback port and connects over the veth
//! pair to the harness, which forwards again to the broker; so the broker's advertised addresses (Kafka,
//! Pulsar) work unchanged, and taking the veth link down cuts every byte between consumer and broker.

use std::net::{IpAddr, SocketAddr};

use test_support::forward::serve;
use tokio::net::TcpListener;

/// What the forwarder is told.
#[derive(Debug, clap::Args)]
pub(crate) struct ForwardArgs {
    /// The address to listen on.
    #[arg(long)]
    pub(crate) listen: IpAddr,
    /// The address to forward to.
    #[arg(long)]
    pub(crate) to: IpAddr,
    /// The ports to forward (the same port on both sides).
    #[arg(long = "port", required = true)]
    pub(crate) ports: Vec<u16>,
}

/// Forwards every port until killed.
pub(crate) async fn run(args: ForwardArgs) -> Result<(), Box<dyn std::error::Error>> {
    for &port in &args.ports {
        let listener = TcpListener::bind((args.listen, port)).await?;
        tokio::spawn(serve(listener, SocketAddr::new(args.to, port)));
    }
    // The harness waits for this line before it starts the consumer.
    println!("forwarding {:?}", args.ports);
    std::future::pending::<()>().await;
    Ok(())
}
