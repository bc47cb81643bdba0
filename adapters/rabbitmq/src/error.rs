//! The one place where lapin's errors become the SDK's [`Kind`]s.
//!
//! RabbitMQ answers a refused command by closing the channel (a soft error: `NOT_FOUND`,
//! `ACCESS_REFUSED`, `PRECONDITION_FAILED`, …) or the connection (a hard error); lapin reports either as
//! a protocol error, and its own troubles (a broken socket, a channel in the wrong state) as other
//! variants. Every call the adapter makes maps its error here; a failed connect is mapped apart, because
//! it names which part of the login or TLS set-up the broker refused.

use event_retry_core::error::{Error, Kind};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::uri::{AMQPScheme, AMQPUri};

/// The kind of a lapin error: a missing queue or exchange is [`Kind::NotFound`], a refused access
/// [`Kind::Security`] (but a queue in another consumer's exclusive use, which RabbitMQ also answers with
/// `ACCESS_REFUSED`, is [`Kind::Rejected`]), a failed precondition or a locked resource
/// [`Kind::Rejected`]; anything else is a connection problem, which heals when the adapter connects
/// again.
pub(crate) fn kind_of(e: &lapin::Error) -> Kind {
    let lapin::ErrorKind::ProtocolError(amqp) = e.kind() else {
        return Kind::Connection;
    };
    let text = amqp.get_message().as_str();
    match amqp.kind() {
        // A classic queue whose node is restarting: it comes back.
        AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) if text.contains("down or inaccessible") => {
            Kind::Connection
        }
        AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => Kind::NotFound,
        AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) if text.contains("exclusive use") => {
            Kind::Rejected
        }
        AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => Kind::Security,
        // A vhost the user may not open; NOT_ALLOWED also closes a connection for other reasons (too
        // many channels), which a new connection heals.
        AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED) if text.contains("access to vhost") => {
            Kind::Security
        }
        AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED | AMQPSoftError::RESOURCELOCKED) => {
            Kind::Rejected
        }
        _ => Kind::Connection,
    }
}

/// The error of a lapin call for `operation`, of the kind [`kind_of`] tells; the lapin error stays the
/// source.
pub(crate) fn amqp_error(e: lapin::Error, operation: impl Into<String>) -> Error {
    Error::from_source(kind_of(&e), e).with_operation(operation.into())
}

/// A `map_err` for a lapin call for `operation` (see [`amqp_error`]).
pub(crate) fn connection_error(operation: &str) -> impl FnOnce(lapin::Error) -> Error + '_ {
    move |e| amqp_error(e, operation)
}

/// Whether `error` is the broker's soft error `kind` (e.g. NOT_FOUND, ACCESS_REFUSED).
pub(crate) fn is_soft_error(error: &lapin::Error, kind: AMQPSoftError) -> bool {
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(e) if *e.kind() == AMQPErrorKind::Soft(kind)
    )
}

/// The error of a failed connect to `uri`: a refused login or a failed TLS handshake is
/// [`Kind::Security`], with the cause in words; anything else a connection error. The broker's
/// address is named, never the password.
pub(crate) fn connect_error(e: lapin::Error, uri: &AMQPUri) -> Error {
    let address = format!("{}:{}", uri.authority.host, uri.authority.port);
    let tls = uri.scheme == AMQPScheme::AMQPS;
    let text = e.to_string();
    let lower = text.to_lowercase();
    let cause = if lower.contains("access_refused") || lower.contains("access-refused") {
        Some(format!(
            "RabbitMQ at {address} refused the login of user {:?}: {text}",
            uri.authority.userinfo.username
        ))
    } else if kind_of(&e) == Kind::Security {
        // The login passed, the virtual host did not: the user has no permission on it.
        Some(format!(
            "RabbitMQ at {address} refused user {:?} access to virtual host {:?}: {text}",
            uri.authority.userinfo.username, uri.vhost
        ))
    } else if lower.contains("certificate") || lower.contains("unknownissuer") {
        Some(format!(
            "RabbitMQ at {address} presented a certificate this client does not trust \
             (is tls_ca the CA that signed it?): {text}"
        ))
    } else if tls && (lower.contains("corrupt message") || lower.contains("invalidcontenttype")) {
        Some(format!(
            "RabbitMQ at {address} did not answer TLS (an amqps:// URL for a plaintext port?): {text}"
        ))
    } else if !tls && is_closed_by_peer(&e) {
        Some(format!(
            "RabbitMQ at {address} closed the connection during the AMQP handshake \
             (an amqp:// URL for a TLS port?): {text}"
        ))
    } else {
        None
    };
    match cause {
        Some(message) => Error::new(Kind::Security, message)
            .with_operation("connect to RabbitMQ")
            .with_quoted_source(e)
            .temporary(false),
        None => Error::from_source(Kind::Connection, e)
            .with_operation(format!("connect to RabbitMQ at {address}")),
    }
}

/// Whether the broker hung up on us (as a TLS listener does on a plaintext AMQP header), as opposed to
/// refusing the connection outright (nothing listening).
fn is_closed_by_peer(e: &lapin::Error) -> bool {
    match e.kind() {
        lapin::ErrorKind::IOError(io) => matches!(
            io.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
        ),
        lapin::ErrorKind::InvalidConnectionState(_) | lapin::ErrorKind::ParsingError(_) => true,
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use lapin::protocol::AMQPError;

    fn answered(kind: AMQPErrorKind, text: &str) -> lapin::Error {
        lapin::ErrorKind::ProtocolError(AMQPError::new(kind, text.into())).into()
    }

    #[test]
    fn every_broker_answer_maps_to_its_kind() {
        let soft = AMQPErrorKind::Soft;
        let table = [
            (
                soft(AMQPSoftError::NOTFOUND),
                "NOT_FOUND - no queue 'orders' in vhost '/'",
                Kind::NotFound,
            ),
            (
                soft(AMQPSoftError::ACCESSREFUSED),
                "ACCESS_REFUSED - write access to exchange 'orders.dlq' in vhost '/' refused for user 'app'",
                Kind::Security,
            ),
            (
                soft(AMQPSoftError::ACCESSREFUSED),
                "ACCESS_REFUSED - queue 'orders' in vhost '/' in exclusive use",
                Kind::Rejected,
            ),
            (
                soft(AMQPSoftError::PRECONDITIONFAILED),
                "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'orders'",
                Kind::Rejected,
            ),
            (
                soft(AMQPSoftError::RESOURCELOCKED),
                "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'orders'",
                Kind::Rejected,
            ),
            (
                AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED),
                "NOT_ALLOWED - access to vhost 'shop' refused for user 'app'",
                Kind::Security,
            ),
            (
                soft(AMQPSoftError::NOTFOUND),
                "NOT_FOUND - home node 'rabbit@a' of durable queue 'orders' in vhost '/' is down or inaccessible",
                Kind::Connection,
            ),
            (
                AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED),
                "NOT_ALLOWED - number of channels opened (2047) has reached the negotiated channel_max (2047)",
                Kind::Connection,
            ),
            (
                AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED),
                "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
                Kind::Connection,
            ),
        ];
        for (kind, text, want) in table {
            let e = amqp_error(answered(kind, text), "declare");
            assert_eq!(e.kind(), want, "{text}");
            assert_eq!(e.is_temporary(), want == Kind::Connection, "{text}");
        }
    }

    #[test]
    fn the_client_s_own_failures_are_connection_problems() {
        let io: lapin::Error = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
        assert_eq!(kind_of(&io), Kind::Connection);
        let closed: lapin::Error =
            lapin::ErrorKind::InvalidChannelState(lapin::ChannelState::Closed, "basic.publish")
                .into();
        assert_eq!(kind_of(&closed), Kind::Connection);
    }

    #[test]
    fn a_refused_login_says_who_and_keeps_the_password_out() {
        let uri: AMQPUri = "amqp://app:hunter2@mq:5672/%2f".parse().unwrap();
        let refused = answered(
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED),
            "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN",
        );
        let e = connect_error(refused, &uri);
        assert_eq!(e.kind(), Kind::Security);
        assert!(!e.is_temporary());
        let text = e.to_string();
        assert!(
            text.contains("mq:5672") && text.contains("\"app\""),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
        let no_vhost = answered(
            AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED),
            "NOT_ALLOWED - access to vhost '/' refused for user 'app'",
        );
        let e = connect_error(no_vhost, &uri);
        assert_eq!(e.kind(), Kind::Security);
        assert!(!e.is_temporary(), "a user without permission stays refused");
        assert!(e.to_string().contains("virtual host"), "{e}");
        let too_many = answered(
            AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED),
            "NOT_ALLOWED - number of channels opened has reached the negotiated channel_max",
        );
        assert!(connect_error(too_many, &uri).is_temporary());
        let down: lapin::Error = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        let e = connect_error(down, &uri);
        assert_eq!(e.kind(), Kind::Connection);
        assert!(e.is_temporary());
    }
}
