//! TLS and token authentication: the CA of a `pulsar+ssl://` connection, the JWT kept out of the URL,
//! and the connect error that says which of them the broker refused.
//!
//! The client speaks TLS through native-tls (OpenSSL here) on its tokio runtime. It cannot present a
//! client certificate (the `pulsar` crate has no API for one), so mTLS is refused with a clear error
//! rather than connecting without it.

use std::path::PathBuf;

use event_retry_core::error::{Error, Kind};
use event_retry_core::options::{OptionReader, redact_url};
use event_retry_core::secret::Secret;
use pulsar::{Authentication, Pulsar, PulsarBuilder, TokioExecutor};

/// How the adapter proves who it is and whom it trusts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PulsarSecurity {
    /// A JWT for Pulsar's token authentication; from the options `token`, `token_env` or `token_file`.
    pub token: Option<Secret>,
    /// A PEM file of CA certificates to trust for `pulsar+ssl://` (option `tls_ca`), instead of the
    /// platform's.
    pub tls_ca: Option<PathBuf>,
    /// Whether the broker's certificate must name the host connected to (option
    /// `tls_hostname_verification`). Default true.
    pub tls_hostname_verification: bool,
}

impl Default for PulsarSecurity {
    fn default() -> Self {
        Self {
            token: None,
            tls_ca: None,
            tls_hostname_verification: true,
        }
    }
}

impl PulsarSecurity {
    /// Reads `token` (or `token_env` / `token_file`), `tls_ca` and `tls_hostname_verification`; a
    /// client certificate (`tls_cert`, `tls_key`) is refused, as the client cannot present one.
    pub(crate) fn read(read: &mut OptionReader<'_>) -> Result<Self, Error> {
        if read.string("tls_cert").is_some() || read.string("tls_key").is_some() {
            return Err(Error::new(
                Kind::Unsupported,
                "the Apache Pulsar adapter cannot present a client certificate (mTLS): the pulsar \
                 client crate has no API for one; use token authentication",
            ));
        }
        Ok(Self {
            token: read.secret("token")?,
            tls_ca: read.string("tls_ca").map(PathBuf::from),
            tls_hostname_verification: read.bool("tls_hostname_verification")?.unwrap_or(true),
        })
    }

    /// `builder` with the token and TLS settings put in.
    pub(crate) fn apply(
        &self,
        url: &str,
        mut builder: PulsarBuilder<TokioExecutor>,
    ) -> Result<PulsarBuilder<TokioExecutor>, Error> {
        let tls = url.starts_with("pulsar+ssl://");
        if let Some(ca) = &self.tls_ca {
            if !tls {
                return Err(Error::new(
                    Kind::Config,
                    "tls_ca of the Apache Pulsar adapter needs a pulsar+ssl:// URL",
                ));
            }
            builder = builder.with_certificate_chain_file(ca).map_err(|e| {
                Error::new(
                    Kind::Config,
                    format!(
                        "cannot read {} for the Apache Pulsar adapter: {e}",
                        ca.display()
                    ),
                )
            })?;
        }
        if tls {
            builder =
                builder.with_tls_hostname_verification_enabled(self.tls_hostname_verification);
        }
        if let Some(token) = &self.token {
            builder = builder.with_auth(Authentication {
                name: "token".to_string(),
                data: token.expose().as_bytes().to_vec(),
            });
        }
        Ok(builder)
    }
}

/// The error of a failed connect to `url`: a refused token or a failed TLS handshake is
/// [`Kind::Security`] with the cause in words; anything else keeps the kind the client's error has.
///
/// The client reports every non-retryable failure of a connection as one "fatal error", so the cause
/// is found with a TLS handshake of our own: for `pulsar+ssl://`, with the same trust settings (a
/// refused handshake says why; one that succeeds leaves the token as what was refused); for
/// `pulsar://`, with any certificate accepted (a handshake that succeeds means the port speaks TLS).
async fn connect_error(e: pulsar::Error, url: &str, security: &PulsarSecurity) -> Error {
    let shown = redact_url(url);
    let fatal = e.to_string().contains("fatal error");
    let cause = if !fatal {
        None
    } else if let Some((host, port)) = host_and_port(url) {
        let tls = url.starts_with("pulsar+ssl://");
        let handshake = handshake(&host, port, security, !tls).await;
        match (tls, handshake) {
            (true, Err(why)) if why.contains("certificate") => Some(format!(
                "Apache Pulsar at {shown} presented a certificate this client does not trust (is \
                 tls_ca the CA that signed it?): {why}"
            )),
            (true, Err(why)) => Some(format!(
                "Apache Pulsar at {shown}: the TLS handshake failed (a pulsar+ssl:// URL for a \
                 plaintext port?): {why}"
            )),
            (false, Ok(())) => Some(format!(
                "Apache Pulsar at {shown} answers TLS on this port (a pulsar:// URL for a TLS port? \
                 use pulsar+ssl://)"
            )),
            (_, _) if security.token.is_some() => Some(format!(
                "Apache Pulsar at {shown} refused the authentication: the broker did not accept the \
                 token"
            )),
            _ => None,
        }
    } else {
        None
    };
    match cause {
        Some(message) => Error::new(Kind::Security, message)
            .with_operation("connect to Apache Pulsar")
            .with_source(e)
            .temporary(false),
        None => Error::from_source(crate::error::kind_of(&e), e)
            .with_operation(format!("connect to {shown}")),
    }
}

/// The host and port of a `pulsar://` or `pulsar+ssl://` URL (the first of a list).
fn host_and_port(url: &str) -> Option<(String, u16)> {
    let rest = url.split_once("://")?.1;
    let first = rest.split([',', '/', '?']).next()?;
    let (host, port) = first.rsplit_once(':')?;
    Some((
        host.trim_matches(['[', ']']).to_string(),
        port.parse().ok()?,
    ))
}

/// A TLS handshake with `host:port` within 5 s, trusting what `security` trusts (or anything, when
/// `accept_any`): `Ok` when it completed, else why not.
async fn handshake(
    host: &str,
    port: u16,
    security: &PulsarSecurity,
    accept_any: bool,
) -> Result<(), String> {
    let mut builder = native_tls::TlsConnector::builder();
    if let Some(ca) = &security.tls_ca {
        let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
        let cert = native_tls::Certificate::from_pem(&pem).map_err(|e| e.to_string())?;
        builder.add_root_certificate(cert);
    }
    builder.danger_accept_invalid_hostnames(accept_any || !security.tls_hostname_verification);
    builder.danger_accept_invalid_certs(accept_any);
    let connector =
        tokio_native_tls::TlsConnector::from(builder.build().map_err(|e| e.to_string())?);
    let attempt = async {
        let stream = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| e.to_string())?;
        connector
            .connect(host, stream)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), attempt)
        .await
        .unwrap_or_else(|_| Err("no TLS answer within 5 s".to_string()))
}

/// Builds the client for `url` with `security`, or the error that names what was refused.
pub(crate) async fn connect(
    url: &str,
    security: &PulsarSecurity,
) -> Result<Pulsar<TokioExecutor>, Error> {
    build(url, security, Pulsar::builder(url, TokioExecutor)).await
}

/// A client for `url` whose requests are never sent again by the client itself: a broker's refusal
/// comes back as an error at once. The pulsar crate retries a refused subscribe (`ConsumerBusy`,
/// `ServiceNotReady`) for ever, which is right for a consumer that must come back but wrong where the
/// refusal is the answer (a subscription held by a consumer of another type exists).
pub(crate) async fn connect_without_retries(
    url: &str,
    security: &PulsarSecurity,
) -> Result<Pulsar<TokioExecutor>, Error> {
    let once = pulsar::OperationRetryOptions {
        max_retries: Some(0),
        ..pulsar::OperationRetryOptions::default()
    };
    let builder = Pulsar::builder(url, TokioExecutor).with_operation_retry_options(once);
    build(url, security, builder).await
}

async fn build(
    url: &str,
    security: &PulsarSecurity,
    builder: pulsar::PulsarBuilder<TokioExecutor>,
) -> Result<Pulsar<TokioExecutor>, Error> {
    let builder = security.apply(url, builder)?;
    match builder.build().await {
        Ok(client) => Ok(client),
        Err(e) => Err(connect_error(e, url, security).await),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use event_retry_core::options::Options;

    #[test]
    fn hosts_and_ports_of_urls() {
        assert_eq!(
            host_and_port("pulsar+ssl://127.0.0.1:6651?token=x"),
            Some(("127.0.0.1".to_string(), 6651))
        );
        assert_eq!(
            host_and_port("pulsar://a:6650,b:6650/"),
            Some(("a".to_string(), 6650))
        );
        assert_eq!(host_and_port("pulsar://nohost"), None);
    }

    #[test]
    fn a_token_never_shows_and_mtls_is_refused_clearly() {
        let o = Options::new()
            .set("token", "eyJhbGciOi.hunter2.sig")
            .set("tls_ca", "/ca.pem");
        let mut r = o.reader("Apache Pulsar");
        let s = PulsarSecurity::read(&mut r).unwrap();
        r.finish().unwrap();
        assert!(s.tls_hostname_verification);
        assert!(!format!("{s:?}").contains("hunter2"));
        let o = Options::new()
            .set("tls_cert", "/c.pem")
            .set("tls_key", "/k.pem");
        let e = PulsarSecurity::read(&mut o.reader("Apache Pulsar")).unwrap_err();
        assert_eq!(e.kind(), Kind::Unsupported);
        assert!(e.to_string().contains("client certificate"), "{e}");
    }
}
