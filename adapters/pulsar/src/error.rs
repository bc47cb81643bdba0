//! The one place where the Pulsar client's errors, and the admin REST API's answers, become the SDK's
//! [`Kind`]s.
//!
//! The broker answers a refused command with a `ServerError` code; the client wraps it (and its own
//! troubles: a broken connection, a closed producer) in nested enums by where it met it. Every call the
//! adapter makes maps its error here, so each code is classified once and the tables below test the
//! whole mapping.

use event_retry_core::error::{Error, Kind};

/// A `map_err` for a client call for `operation`: the client's error as the source, of the kind
/// [`kind_of`] tells.
pub(crate) fn error(operation: &str) -> impl FnOnce(pulsar::Error) -> Error + '_ {
    move |e| Error::from_source(kind_of(&e), e).with_operation(operation.to_string())
}

/// The kind of a client error: the broker's own error code where it sent one (a missing topic is
/// [`Kind::NotFound`], a refused request [`Kind::Rejected`], bad credentials or a bad topic name
/// [`Kind::Config`]), otherwise what the client met (a broken connection, a closed producer or consumer).
pub(crate) fn kind_of(e: &pulsar::Error) -> Kind {
    use pulsar::error::{ConnectionError, ConsumerError, ProducerError, ServiceDiscoveryError};
    let connection = |c: &ConnectionError| match c {
        ConnectionError::PulsarError(Some(code), _) => server_kind(*code),
        ConnectionError::NotFound => Kind::NotFound,
        ConnectionError::Authentication(a) => authentication(a),
        ConnectionError::Shutdown => Kind::Closed,
        _ => Kind::Connection,
    };
    match e {
        pulsar::Error::Connection(c) => connection(c),
        pulsar::Error::Consumer(ConsumerError::Connection(c)) => connection(c),
        pulsar::Error::Consumer(ConsumerError::Closed) => Kind::Closed,
        pulsar::Error::Producer(ProducerError::Connection(c)) => connection(c),
        pulsar::Error::Producer(ProducerError::Closed) => Kind::Closed,
        pulsar::Error::Producer(ProducerError::Fenced) => Kind::Rejected,
        pulsar::Error::ServiceDiscovery(ServiceDiscoveryError::Connection(c)) => connection(c),
        pulsar::Error::ServiceDiscovery(ServiceDiscoveryError::Query(Some(code), _)) => {
            server_kind(*code)
        }
        pulsar::Error::ServiceDiscovery(ServiceDiscoveryError::NotFound) => Kind::NotFound,
        pulsar::Error::Authentication(a) => authentication(a),
        _ => Kind::Connection,
    }
}

/// The kind of an error met by a producer or consumer the adapter makes again when needed: a closed
/// client object is then a passing connection trouble, not the transport closed for good (the runtime
/// stops on [`Kind::Closed`]).
pub(crate) fn passing(kind: Kind) -> Kind {
    match kind {
        Kind::Closed => Kind::Connection,
        other => other,
    }
}

/// An authentication failure is a security error, unless the client calls it retriable (a token
/// provider that could not refresh for now).
fn authentication(e: &pulsar::error::AuthenticationError) -> Kind {
    match e {
        pulsar::error::AuthenticationError::Retriable(_) => Kind::Connection,
        pulsar::error::AuthenticationError::Custom(_) => Kind::Security,
    }
}

/// The kind of an error code the broker sent.
fn server_kind(code: pulsar::message::proto::ServerError) -> Kind {
    use pulsar::message::proto::ServerError as S;
    match code {
        S::TopicNotFound | S::SubscriptionNotFound | S::ConsumerNotFound => Kind::NotFound,
        S::AuthenticationError | S::AuthorizationError => Kind::Security,
        S::InvalidTopicName => Kind::Config,
        // The broker's own trouble, and a producer held back while a backlog quota is exceeded: both
        // pass.
        S::ServiceNotReady
        | S::TooManyRequests
        | S::MetadataError
        | S::PersistenceError
        | S::ProducerBlockedQuotaExceededError
        | S::ProducerBlockedQuotaExceededException => Kind::Connection,
        S::UnsupportedVersionError => Kind::Unsupported,
        _ => Kind::Rejected,
    }
}

/// The kind of an admin REST API failure: the HTTP status where the broker answered (404 missing, 409
/// exists already, 401/403 refused credentials, 5xx the broker's own trouble, which heals), otherwise
/// the transport's (no answer).
pub(crate) fn admin_kind(e: &ureq::Error) -> Kind {
    match e {
        ureq::Error::StatusCode(404) => Kind::NotFound,
        ureq::Error::StatusCode(409) => Kind::AlreadyExists,
        ureq::Error::StatusCode(401 | 403) => Kind::Security,
        ureq::Error::StatusCode(429 | 500..=599) => Kind::Connection,
        ureq::Error::StatusCode(_) => Kind::Rejected,
        ureq::Error::Timeout(_) => Kind::Timeout,
        _ => Kind::Connection,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulsar::error::{
        AuthenticationError, ConnectionError, ConsumerError, ProducerError, ServiceDiscoveryError,
    };
    use pulsar::message::proto::ServerError;

    fn refused(code: ServerError) -> pulsar::Error {
        pulsar::Error::Connection(ConnectionError::PulsarError(Some(code), None))
    }

    #[test]
    fn every_broker_code_maps_to_its_kind() {
        let table = [
            (ServerError::TopicNotFound, Kind::NotFound),
            (ServerError::SubscriptionNotFound, Kind::NotFound),
            (ServerError::ConsumerNotFound, Kind::NotFound),
            // Who we are, refused after the connection was made: a security error everywhere.
            (ServerError::AuthenticationError, Kind::Security),
            (ServerError::AuthorizationError, Kind::Security),
            (ServerError::InvalidTopicName, Kind::Config),
            (ServerError::ServiceNotReady, Kind::Connection),
            (ServerError::TooManyRequests, Kind::Connection),
            (ServerError::MetadataError, Kind::Connection),
            (ServerError::PersistenceError, Kind::Connection),
            (ServerError::UnsupportedVersionError, Kind::Unsupported),
            (ServerError::TopicTerminatedError, Kind::Rejected),
            (
                ServerError::ProducerBlockedQuotaExceededError,
                Kind::Connection,
            ),
        ];
        for (code, kind) in table {
            assert_eq!(kind_of(&refused(code)), kind, "{code:?}");
            let lookup =
                pulsar::Error::ServiceDiscovery(ServiceDiscoveryError::Query(Some(code), None));
            assert_eq!(kind_of(&lookup), kind, "lookup answered {code:?}");
        }
    }

    #[test]
    fn the_client_s_own_failures_map_by_where_it_met_them() {
        let table = [
            (
                pulsar::Error::Connection(ConnectionError::Authentication(
                    AuthenticationError::Custom("token expired".into()),
                )),
                Kind::Security,
            ),
            (
                pulsar::Error::Authentication(AuthenticationError::Retriable(
                    "refresh later".into(),
                )),
                Kind::Connection,
            ),
            (
                pulsar::Error::Connection(ConnectionError::Disconnected),
                Kind::Connection,
            ),
            (
                pulsar::Error::Connection(ConnectionError::Shutdown),
                Kind::Closed,
            ),
            (
                pulsar::Error::Connection(ConnectionError::NotFound),
                Kind::NotFound,
            ),
            (pulsar::Error::Producer(ProducerError::Closed), Kind::Closed),
            (
                pulsar::Error::Producer(ProducerError::Fenced),
                Kind::Rejected,
            ),
            (pulsar::Error::Consumer(ConsumerError::Closed), Kind::Closed),
            (
                pulsar::Error::ServiceDiscovery(ServiceDiscoveryError::NotFound),
                Kind::NotFound,
            ),
        ];
        for (e, kind) in table {
            assert_eq!(kind_of(&e), kind, "{e:?}");
        }
        let broken = pulsar::Error::Connection(ConnectionError::Disconnected);
        assert!(Error::from_source(kind_of(&broken), broken).is_temporary());
    }

    #[test]
    fn a_closed_producer_or_consumer_the_adapter_remakes_is_passing() {
        assert_eq!(passing(Kind::Closed), Kind::Connection);
        assert_eq!(passing(Kind::Security), Kind::Security);
    }

    #[test]
    fn every_admin_status_maps_to_its_kind() {
        let table = [
            (404, Kind::NotFound),
            (409, Kind::AlreadyExists),
            (401, Kind::Security),
            (403, Kind::Security),
            (412, Kind::Rejected),
            (429, Kind::Connection),
            (400, Kind::Rejected),
            (500, Kind::Connection),
            (503, Kind::Connection),
        ];
        for (status, kind) in table {
            assert_eq!(
                admin_kind(&ureq::Error::StatusCode(status)),
                kind,
                "{status}"
            );
        }
        assert_eq!(admin_kind(&ureq::Error::ConnectionFailed), Kind::Connection);
    }
}
