//! A TCP forwarder: a second address for a broker.
//!
//! The fault runs reach a broker from a network namespace through it; the TLS tests reach a broker's
//! secured listener through it at an address its certificate does not name (127.0.0.2), to show a
//! client checks the name and refuses the connection.

use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpListener, TcpStream};

/// Accepts connections on `listener` and copies each, both ways, to a new connection to `to`.
pub async fn serve(listener: TcpListener, to: SocketAddr) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            // A refused or unreachable upstream closes the inbound connection, as a broker that cannot
            // be reached would.
            if let Ok(mut outbound) = TcpStream::connect(to).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// Forwards a free port of `listen` to `to` on the current runtime, until the runtime ends; returns
/// the address it listens on.
pub async fn forward(listen: IpAddr, to: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind((listen, 0)).await?;
    let at = listener.local_addr()?;
    tokio::spawn(serve(listener, to));
    Ok(at)
}
