//! TLS and authentication: the password kept out of the URL, the CA and client certificate of an
//! `amqps://` connection (the connect error that says which of them the broker refused is in
//! `error.rs`).
//!
//! lapin speaks TLS through rustls. A CA given here is trusted in addition to the platform's roots; a
//! client certificate and key (PEM, the key PKCS#8) are presented to the broker, which RabbitMQ's
//! `EXTERNAL` mechanism (`auth_mechanism=external`) takes as the login.

use std::path::{Path, PathBuf};

use event_retry_core::error::{Error, Kind};
use event_retry_core::options::OptionReader;
use event_retry_core::secret::Secret;
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::uri::{AMQPScheme, AMQPUri};

/// How the adapter proves who it is and whom it trusts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RabbitSecurity {
    /// The password, instead of (or overriding) the one in the URL's user info; from the options
    /// `password`, `password_env` or `password_file`.
    pub password: Option<Secret>,
    /// A PEM file of CA certificates to trust for `amqps://` (option `tls_ca`), besides the platform's.
    pub tls_ca: Option<PathBuf>,
    /// A PEM client certificate to present (option `tls_cert`); needs `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's PKCS#8 PEM private key (option `tls_key`).
    pub tls_key: Option<PathBuf>,
}

impl RabbitSecurity {
    /// Reads `password` (or `password_env` / `password_file`), `tls_ca`, `tls_cert` and `tls_key`.
    pub(crate) fn read(read: &mut OptionReader<'_>) -> Result<Self, Error> {
        Ok(Self {
            password: read.secret("password")?,
            tls_ca: read.string("tls_ca").map(PathBuf::from),
            tls_cert: read.string("tls_cert").map(PathBuf::from),
            tls_key: read.string("tls_key").map(PathBuf::from),
        })
    }

    /// Checks that a certificate comes with its key.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(Error::new(
                Kind::Config,
                "tls_cert and tls_key of the RabbitMQ adapter go together: give both or neither",
            ));
        }
        Ok(())
    }

    /// The connection URI: `url` parsed, with the password put in.
    pub(crate) fn uri(&self, url: &str) -> Result<AMQPUri, Error> {
        let mut uri: AMQPUri = url.parse().map_err(|e| {
            Error::new(
                Kind::Config,
                format!(
                    "{} is not an AMQP URI: {e}",
                    event_retry_core::options::redact_url(url)
                ),
            )
        })?;
        if let Some(password) = &self.password {
            uri.authority.userinfo.password = password.expose().to_string();
        }
        let tls_asked = self.tls_ca.is_some() || self.tls_cert.is_some();
        if tls_asked && uri.scheme != AMQPScheme::AMQPS {
            return Err(Error::new(
                Kind::Config,
                "tls_ca, tls_cert and tls_key need an amqps:// URL",
            ));
        }
        Ok(uri)
    }

    /// The TLS settings lapin connects with: the files read now, so a missing one fails at connect.
    pub(crate) fn tls_config(&self) -> Result<OwnedTLSConfig, Error> {
        let cert_chain = self.tls_ca.as_deref().map(read_pem).transpose()?;
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(OwnedIdentity::PKCS8 {
                pem: read_pem(cert)?.into_bytes(),
                key: read_pem(key)?.into_bytes(),
            }),
            _ => None,
        };
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }
}

fn read_pem(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|e| {
        Error::new(
            Kind::Config,
            format!(
                "cannot read {} for the RabbitMQ adapter: {e}",
                path.display()
            ),
        )
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use event_retry_core::options::Options;

    #[test]
    fn the_password_option_overrides_the_urls_and_never_shows() {
        let o = Options::new()
            .set("password", "hunter2-amqp")
            .set("tls_ca", "/ca.pem");
        let mut r = o.reader("RabbitMQ");
        let s = RabbitSecurity::read(&mut r).unwrap();
        r.finish().unwrap();
        let uri = s.uri("amqps://app:old@mq:5671/%2f").unwrap();
        assert_eq!(uri.authority.userinfo.password, "hunter2-amqp");
        assert!(!format!("{s:?}").contains("hunter2"));
        let e = s.uri("amqp://app@mq:5672/%2f").unwrap_err();
        assert!(e.to_string().contains("need an amqps:// URL"), "{e}");
    }

    #[test]
    fn a_certificate_needs_its_key_and_missing_files_are_named() {
        let s = RabbitSecurity {
            tls_cert: Some("/c.pem".into()),
            ..RabbitSecurity::default()
        };
        assert!(s.validate().is_err());
        let s = RabbitSecurity {
            tls_ca: Some("/surely/missing/ca.pem".into()),
            ..RabbitSecurity::default()
        };
        let e = s.tls_config().unwrap_err();
        assert!(e.to_string().contains("/surely/missing/ca.pem"), "{e}");
    }
}
