//! What a failed publish means for the row and for the relay.
//!
//! Three answers, from the SDK's typed [`Error`]:
//! * the **broker** is unreachable, timing out or throttling (a temporary error): the row's attempt counts
//!   and it waits per the policy, and the whole relay backs off — one row at a time until a publish goes
//!   through — instead of throwing every due row at a broker that is down;
//! * the **row** was refused for good (invalid input, a payload the broker rejects as too large, an
//!   operation the broker cannot do): `DEAD` at once, with the reason;
//! * anything else (a topic that does not exist yet, a misconfiguration being fixed) is the row's own
//!   trouble: it is retried per the policy while other rows go on.

use event_retry_core::error::{Error, Kind};

/// How a publish failure is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishFailure {
    /// The broker is down or throttling: retry the row later and back the whole relay off.
    BrokerDown,
    /// The row cannot be published, ever: `DEAD` at once.
    Permanent,
    /// This row failed: retry it per the policy.
    Retry,
}

impl PublishFailure {
    /// The label used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            PublishFailure::BrokerDown => "broker_down",
            PublishFailure::Permanent => "permanent",
            PublishFailure::Retry => "retry",
        }
    }
}

/// The default classification of a publish error.
pub fn classify(error: &Error) -> PublishFailure {
    if error.is_temporary()
        || matches!(
            error.kind(),
            Kind::Connection | Kind::Timeout | Kind::Closed
        )
    {
        return PublishFailure::BrokerDown;
    }
    match error.kind() {
        Kind::InvalidInput | Kind::Rejected | Kind::Unsupported => PublishFailure::Permanent,
        _ => PublishFailure::Retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_what_the_relay_does() {
        let of = |kind| classify(&Error::new(kind, "x"));
        assert_eq!(of(Kind::Connection), PublishFailure::BrokerDown);
        assert_eq!(of(Kind::Timeout), PublishFailure::BrokerDown);
        assert_eq!(of(Kind::Closed), PublishFailure::BrokerDown);
        assert_eq!(of(Kind::Rejected), PublishFailure::Permanent);
        assert_eq!(of(Kind::InvalidInput), PublishFailure::Permanent);
        assert_eq!(of(Kind::NotFound), PublishFailure::Retry);
        assert_eq!(of(Kind::Other), PublishFailure::Retry);
        let throttled = Error::new(Kind::Rejected, "slow down").temporary(true);
        assert_eq!(classify(&throttled), PublishFailure::BrokerDown);
    }
}
