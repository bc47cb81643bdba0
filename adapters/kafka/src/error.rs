//! The one place where librdkafka's errors become the SDK's [`Kind`]s.
//!
//! librdkafka reports a broker's refusal and its own troubles alike as an error code
//! ([`RDKafkaErrorCode`]) inside a variant that says where it met it (a produce, a metadata request, an
//! admin operation). The kind depends on the code, not on the variant: a topic the credentials may not
//! write is a security error whether a produce or a metadata request found it out. Every call the
//! adapter makes maps its error here, so each code is classified once and the table below tests the
//! whole mapping.

use std::borrow::Cow;

use event_retry_core::error::{Error, Kind};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode as C;

/// The kind of a librdkafka error: by its code where it has one, otherwise by its variant (a refused
/// setting is [`Kind::Config`], a canceled operation [`Kind::Closed`]).
pub(crate) fn kind_of(e: &KafkaError) -> Kind {
    match e {
        KafkaError::AdminOp(code) => code_kind(*code),
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) => Kind::Config,
        KafkaError::Canceled => Kind::Closed,
        KafkaError::Nul(_) => Kind::InvalidInput,
        other => other.rdkafka_error_code().map_or(Kind::Other, code_kind),
    }
}

/// The kind of a librdkafka error code. Connection, timeout and the producer's own breakage (the
/// adapter replaces a broken producer) heal when tried again; a refused login or permission is
/// [`Kind::Security`]; what the broker refuses of the record itself is [`Kind::Rejected`].
pub(crate) fn code_kind(code: C) -> Kind {
    match code {
        C::Authentication
        | C::SSL
        | C::SaslAuthenticationFailed
        | C::UnsupportedSASLMechanism
        | C::IllegalSASLState
        | C::UnacceptableCredential
        | C::SecurityDisabled
        | C::PrincipalDeserializationFailure
        | C::TopicAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed
        | C::DelegationTokenAuthorizationFailed => Kind::Security,
        C::UnknownTopicOrPartition
        | C::UnknownTopic
        | C::UnknownPartition
        | C::UnknownTopicId
        | C::ResourceNotFound
        | C::GroupIdNotFound => Kind::NotFound,
        C::TopicAlreadyExists | C::DuplicateResource => Kind::AlreadyExists,
        C::MessageTimedOut | C::RequestTimedOut | C::OperationTimedOut | C::TimedOutQueue => {
            Kind::Timeout
        }
        C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::Resolve
        | C::BrokerDestroy
        | C::DestroyBroker
        | C::BrokerNotAvailable
        | C::LeaderNotAvailable
        | C::NotLeaderForPartition
        | C::ReplicaNotAvailable
        | C::PreferredLeaderNotAvailable
        | C::EligibleLeadersNotAvailable
        | C::FencedLeaderEpoch
        | C::UnknownLeaderEpoch
        | C::NotController
        | C::NetworkException
        | C::NotEnoughReplicas
        | C::NotEnoughReplicasAfterAppend
        | C::ISRInsufficient
        | C::KafkaStorageError
        | C::CoordinatorLoadInProgress
        | C::CoordinatorNotAvailable
        | C::NotCoordinator
        | C::WaitingForCoordinator
        | C::RebalanceInProgress
        | C::ReassignmentInProgress
        | C::ThrottlingQuotaExceeded
        | C::QueueFull
        | C::Retry
        | C::Interrupted
        | C::RebootstrapRequired
        // librdkafka's own name for a broken broker connection, and a member the group dropped (it
        // joins again by itself).
        | C::Fail
        | C::PollExceeded
        | C::AssignmentLost
        | C::UnknownMemberId
        | C::IllegalGeneration
        | C::FencedMemberEpoch
        | C::StaleMemberEpoch
        // The idempotent producer broke (the adapter replaces it and sends again).
        | C::Fatal
        | C::PurgeQueue
        | C::PurgeInflight
        | C::OutOfOrderSequenceNumber
        | C::UnknownProducerId
        | C::InvalidProducerEpoch => Kind::Connection,
        C::InvalidArgument
        | C::InvalidConfig
        | C::NotConfigured
        | C::InvalidTopic
        | C::InvalidPartitions
        | C::InvalidReplicationFactor
        | C::InvalidReplicaAssignment
        | C::InvalidRequiredAcks
        | C::InvalidGroupId
        | C::InvalidSessionTimeout
        | C::InconsistentGroupProtocol
        | C::UnsupportedAssignor
        | C::TopicDeletionDisabled => Kind::Config,
        C::UnsupportedFeature
        | C::UnsupportedVersion
        | C::UnsupportedForMessageFormat
        | C::UnsupportedCompressionType
        | C::NotImplemented => Kind::Unsupported,
        _ => Kind::Rejected,
    }
}

/// A `map_err` for a librdkafka call for `operation`, of the kind [`kind_of`] tells. librdkafka's text
/// already quotes its code's description (the error's cause), so the chain ends with it: a printed
/// chain says each thing once.
pub(crate) fn error(operation: impl Into<Cow<'static, str>>) -> impl FnOnce(KafkaError) -> Error {
    let operation = operation.into();
    move |e| {
        Error::new(kind_of(&e), e.to_string())
            .with_operation(operation)
            .with_quoted_chain(e)
    }
}

/// The error of a consumer's poll. librdkafka keeps trying by itself whatever it met while consuming (a
/// broker down, a subscribed topic not created yet, a member dropped from its group, a handshake cut by
/// a restarting broker, which it reports as a local authentication or SSL error, group members
/// disagreeing on the assignor during a rolling deploy), so such an error stays temporary and the receive
/// loop goes on. Only the broker's explicit refusals are permanent, and end the consumer when they last.
pub(crate) fn consume_error(e: KafkaError) -> Error {
    let refused = matches!(
        e.rdkafka_error_code(),
        Some(
            C::SaslAuthenticationFailed
                | C::TopicAuthorizationFailed
                | C::GroupAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::InvalidGroupId
                | C::InvalidSessionTimeout
        )
    );
    error("consume")(e).temporary(!refused)
}

/// A client settings error (librdkafka refused a setting).
pub(crate) fn settings_error(what: &'static str) -> impl FnOnce(KafkaError) -> Error {
    move |e| Error::from_source(Kind::Config, e).with_operation(format!("Kafka {what} settings"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_the_adapter_meets_maps_to_its_kind() {
        let table = [
            (C::SaslAuthenticationFailed, Kind::Security),
            (C::Authentication, Kind::Security),
            (C::SSL, Kind::Security),
            (C::TopicAuthorizationFailed, Kind::Security),
            (C::GroupAuthorizationFailed, Kind::Security),
            (C::ClusterAuthorizationFailed, Kind::Security),
            (C::UnknownTopicOrPartition, Kind::NotFound),
            (C::UnknownTopic, Kind::NotFound),
            (C::TopicAlreadyExists, Kind::AlreadyExists),
            (C::MessageTimedOut, Kind::Timeout),
            (C::RequestTimedOut, Kind::Timeout),
            (C::OperationTimedOut, Kind::Timeout),
            (C::BrokerTransportFailure, Kind::Connection),
            (C::AllBrokersDown, Kind::Connection),
            (C::NotLeaderForPartition, Kind::Connection),
            (C::NotEnoughReplicas, Kind::Connection),
            (C::QueueFull, Kind::Connection),
            (C::Fatal, Kind::Connection),
            (C::OutOfOrderSequenceNumber, Kind::Connection),
            (C::InvalidReplicationFactor, Kind::Config),
            (C::InvalidConfig, Kind::Config),
            (C::InconsistentGroupProtocol, Kind::Config),
            (C::UnsupportedVersion, Kind::Unsupported),
            (C::MessageSizeTooLarge, Kind::Rejected),
            (C::InvalidMessage, Kind::Rejected),
            (C::PolicyViolation, Kind::Rejected),
        ];
        for (code, kind) in table {
            assert_eq!(code_kind(code), kind, "{code:?}");
            // The code decides, whichever operation met it.
            for e in [
                KafkaError::MessageProduction(code),
                KafkaError::MetadataFetch(code),
                KafkaError::MessageConsumption(code),
                KafkaError::AdminOp(code),
            ] {
                assert_eq!(kind_of(&e), kind, "{e:?}");
                let mapped = error("send")(e);
                assert_eq!(
                    mapped.is_temporary(),
                    matches!(kind, Kind::Connection | Kind::Timeout),
                    "{code:?}"
                );
            }
        }
    }

    #[test]
    fn a_consumer_s_error_is_permanent_only_when_librdkafka_cannot_get_past_it() {
        let cases = [
            (C::TopicAuthorizationFailed, false),
            (C::SaslAuthenticationFailed, false),
            (C::GroupAuthorizationFailed, false),
            (C::InvalidGroupId, false),
            // A handshake a restarting broker cut, and assignors changing in a rolling deploy.
            (C::Authentication, true),
            (C::SSL, true),
            (C::InconsistentGroupProtocol, true),
            (C::UnknownTopicOrPartition, true),
            (C::BrokerTransportFailure, true),
            (C::Fail, true),
            (C::PollExceeded, true),
            (C::OffsetOutOfRange, true),
        ];
        for (code, temporary) in cases {
            let e = consume_error(KafkaError::MessageConsumption(code));
            assert_eq!(e.is_temporary(), temporary, "{code:?}");
            assert_eq!(e.kind(), code_kind(code), "{code:?}");
        }
    }

    #[test]
    fn errors_without_a_code_map_by_variant() {
        assert_eq!(kind_of(&KafkaError::Canceled), Kind::Closed);
        assert_eq!(
            kind_of(&KafkaError::ClientCreation("bad".into())),
            Kind::Config
        );
        assert_eq!(kind_of(&KafkaError::NoMessageReceived), Kind::Other);
    }

    #[test]
    fn the_printed_error_names_the_operation_and_quotes_the_client_once() {
        let e = error("publish to orders")(KafkaError::MessageProduction(C::MessageSizeTooLarge));
        let printed: Vec<String> = event_retry_core::classify::chain(&e)
            .map(ToString::to_string)
            .collect();
        assert_eq!(printed.len(), 1, "{printed:?}");
        assert!(printed[0].starts_with("publish to orders: "), "{printed:?}");
    }
}
