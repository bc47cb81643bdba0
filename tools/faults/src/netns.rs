//! A network namespace for the consumer, joined to the root namespace by a veth pair whose link the
//! harness takes down to cut the network (`tc netem` is not available; a link that is down drops every
//! packet, which is what a partition looks like to both ends: connections stay open and go silent).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use raw_brokers::BoxError;

/// The namespace's name.
const NAMESPACE: &str = "event-retry-faults";
/// The veth end in the root namespace, which is taken down to cut.
const HOST_LINK: &str = "erf-host";
/// The veth end inside the namespace.
const INNER_LINK: &str = "erf-consumer";
/// The root end's address (a /30 of the harness's own, on this machine only).
const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 77, 1);
/// The namespace end's address.
const INNER_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 77, 2);

/// The consumer's namespace, up, with the broker's ports forwarded; torn down on drop.
pub(crate) struct Namespace {
    inner_forwarder: Child,
    host_forwarders: Vec<JoinHandle<()>>,
}

/// Runs `ip ARGS…`, failing with its error output.
async fn ip(args: &[&str]) -> Result<(), BoxError> {
    let out = Command::new("ip").args(args).output().await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into())
    }
}

impl Namespace {
    /// Creates the namespace and the veth pair (replacing a leftover of an earlier run) and forwards
    /// `ports` of 127.0.0.1 inside it to the same ports of 127.0.0.1 outside.
    pub(crate) async fn up(ports: &[u16]) -> Result<Self, BoxError> {
        let _ = ip(&["netns", "del", NAMESPACE]).await;
        let _ = ip(&["link", "del", HOST_LINK]).await;
        let host_cidr = format!("{HOST_IP}/30");
        let inner_cidr = format!("{INNER_IP}/30");
        ip(&["netns", "add", NAMESPACE]).await?;
        ip(&[
            "link", "add", HOST_LINK, "type", "veth", "peer", "name", INNER_LINK,
        ])
        .await?;
        ip(&["link", "set", INNER_LINK, "netns", NAMESPACE]).await?;
        ip(&["addr", "add", &host_cidr, "dev", HOST_LINK]).await?;
        ip(&["link", "set", HOST_LINK, "up"]).await?;
        for args in [
            vec!["addr", "add", &inner_cidr, "dev", INNER_LINK],
            vec!["link", "set", INNER_LINK, "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut full = vec!["netns", "exec", NAMESPACE, "ip"];
            full.extend(args);
            ip(&full).await?;
        }
        let mut host_forwarders = Vec::new();
        for &port in ports {
            let listener = TcpListener::bind((IpAddr::V4(HOST_IP), port)).await?;
            let broker = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
            host_forwarders.push(tokio::spawn(test_support::forward::serve(listener, broker)));
        }
        let mut command = Self::exec(std::env::current_exe()?);
        command.args([
            "forward",
            "--listen",
            "127.0.0.1",
            "--to",
            &HOST_IP.to_string(),
        ]);
        for port in ports {
            command.args(["--port", &port.to_string()]);
        }
        let mut inner_forwarder = command.stdout(Stdio::piped()).kill_on_drop(true).spawn()?;
        let stdout = inner_forwarder.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        match tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line()).await {
            Ok(Ok(Some(line))) if line.starts_with("forwarding") => {}
            other => {
                return Err(format!("the namespace's forwarder did not start: {other:?}").into());
            }
        }
        Ok(Self {
            inner_forwarder,
            host_forwarders,
        })
    }

    /// A command that runs `program` inside the namespace.
    pub(crate) fn exec(program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", NAMESPACE]).arg(program);
        command
    }

    /// Cuts the link: every packet between the namespace and the broker is dropped.
    pub(crate) async fn cut(&self) -> Result<(), BoxError> {
        ip(&["link", "set", HOST_LINK, "down"]).await
    }

    /// Restores the link.
    pub(crate) async fn restore(&self) -> Result<(), BoxError> {
        ip(&["link", "set", HOST_LINK, "up"]).await
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.inner_forwarder.start_kill();
        for task in &self.host_forwarders {
            task.abort();
        }
        // Deleting the namespace deletes its veth end, and with it the pair.
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", NAMESPACE])
            .status();
    }
}
