//! The one place where the AWS SDK's errors become the SDK's [`Kind`]s.
//!
//! SQS tells what went wrong by an error code (`QueueDoesNotExist`, `AccessDenied`, …) inside a service
//! error, and the SDK itself by the error's variant (a timeout, a request that never left). Every call
//! the adapter makes maps its error here, so a code is classified once and the table below is the
//! whole mapping.

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use event_retry_core::error::{Error, Kind};

/// The error of an SQS call for `operation`, by kind: a missing queue is [`Kind::NotFound`], throttling
/// and transport failures are temporary ([`Kind::Connection`], [`Kind::Timeout`]), refused credentials
/// or permissions are [`Kind::Security`], any other request SQS refused is [`Kind::Rejected`]. The
/// SDK's error stays the source.
pub(crate) fn sdk_error<E, R>(operation: &str, e: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let kind = match &e {
        SdkError::TimeoutError(_) => Kind::Timeout,
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => Kind::Connection,
        SdkError::ServiceError(service) => code_kind(service.err().code()),
        _ => Kind::Other,
    };
    let message = describe(&e);
    Error::new(kind, message)
        .with_operation(operation.to_string())
        .with_quoted_chain(e)
}

/// The words of an SQS error, each said once: the service's code and message where SQS answered (the
/// SDK's own rendering repeats the message in a debug dump), otherwise the SDK's text and its causes'.
fn describe<E, R>(e: &SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    if let Some(code) = e.as_service_error().and_then(|s| s.code()) {
        return match e.as_service_error().and_then(|s| s.message()) {
            Some(message) => format!("{code}: {message}"),
            None => code.to_string(),
        };
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

/// The codes SQS answers for a queue that does not exist (the query protocol's and the JSON protocol's),
/// and SNS for a topic that does not exist.
const MISSING_QUEUE: [&str; 4] = [
    "AWS.SimpleQueueService.NonExistentQueue",
    "QueueDoesNotExist",
    "NotFound",
    "NotFoundException",
];

/// The codes of refusals that heal by themselves: throttling, and the service's own trouble.
const TEMPORARY: [&str; 7] = [
    "RequestThrottled",
    "Throttled",
    "ThrottlingException",
    "KMS.ThrottlingException",
    "ServiceUnavailable",
    "InternalFailure",
    "InternalError",
];

/// The codes of refusals of who we are or what we may do: credentials SQS does not know or that
/// expired, a signature that does not match, an action or a KMS key the credentials may not use.
const SECURITY: [&str; 14] = [
    "AccessDenied",
    "AuthorizationError",
    "AccessDeniedException",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "InvalidSecurity",
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
    "KMS.AccessDeniedException",
    "KmsAccessDenied",
];

/// The kind of an error code SQS answered.
fn code_kind(code: Option<&str>) -> Kind {
    match code {
        Some(c) if MISSING_QUEUE.contains(&c) => Kind::NotFound,
        Some(c) if TEMPORARY.contains(&c) => Kind::Connection,
        Some(c) if SECURITY.contains(&c) => Kind::Security,
        _ => Kind::Rejected,
    }
}

/// Whether SQS said the queue does not exist.
pub(crate) fn is_missing<E, R>(e: &SdkError<E, R>) -> bool
where
    E: ProvideErrorMetadata,
{
    e.as_service_error()
        .and_then(|s| s.code())
        .is_some_and(|c| MISSING_QUEUE.contains(&c))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use aws_sdk_sqs::error::ErrorMetadata;
    use aws_sdk_sqs::operation::receive_message::ReceiveMessageError;

    /// A service error SQS could answer with `code`.
    fn answered(code: &str) -> SdkError<ReceiveMessageError, ()> {
        let meta = ErrorMetadata::builder()
            .code(code)
            .message("the service's words")
            .build();
        SdkError::service_error(ReceiveMessageError::generic(meta), ())
    }

    #[test]
    fn every_code_maps_to_its_kind() {
        let table: Vec<(&str, Kind)> = MISSING_QUEUE
            .iter()
            .map(|c| (*c, Kind::NotFound))
            .chain(TEMPORARY.iter().map(|c| (*c, Kind::Connection)))
            .chain(SECURITY.iter().map(|c| (*c, Kind::Security)))
            .chain([
                ("InvalidAttributeValue", Kind::Rejected),
                ("OverLimit", Kind::Rejected),
                ("NotQueueDoesNotExistReally", Kind::Rejected),
            ])
            .collect();
        for (code, kind) in table {
            let e = sdk_error("receive", answered(code));
            assert_eq!(e.kind(), kind, "{code}");
            assert_eq!(
                e.is_temporary(),
                kind == Kind::Connection,
                "{code}: temporary only when SQS will heal"
            );
        }
        assert_eq!(code_kind(None), Kind::Rejected);
    }

    #[test]
    fn the_sdk_s_own_failures_map_by_variant() {
        let timeout = SdkError::<ReceiveMessageError, ()>::timeout_error("no answer");
        assert_eq!(sdk_error("receive", timeout).kind(), Kind::Timeout);
        let construction = SdkError::<ReceiveMessageError, ()>::construction_failure("bad input");
        assert_eq!(sdk_error("receive", construction).kind(), Kind::Other);
    }

    #[test]
    fn a_missing_queue_is_told_apart_from_other_refusals() {
        assert!(is_missing(&answered("QueueDoesNotExist")));
        assert!(is_missing(&answered(
            "AWS.SimpleQueueService.NonExistentQueue"
        )));
        assert!(!is_missing(&answered("AccessDenied")));
    }

    #[test]
    fn the_printed_chain_quotes_the_service_once() {
        let e = sdk_error("receive", answered("AccessDenied"));
        let printed = event_retry_core::classify::chain(&e)
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" | ");
        assert_eq!(
            printed.matches("the service's words").count(),
            1,
            "{printed}"
        );
        assert_eq!(printed, "receive: AccessDenied: the service's words");
        let timeout = SdkError::<ReceiveMessageError, ()>::timeout_error(std::io::Error::other(
            "no answer in 5 s",
        ));
        let printed = sdk_error("receive", timeout).to_string();
        assert_eq!(printed.matches("no answer in 5 s").count(), 1, "{printed}");
    }
}
