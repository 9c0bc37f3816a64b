//! The EngramStore error type: which of upstream's messages the caller
//! sees, with the upstream code and the reason behind it (every failure
//! raises with exactly upstream's message, and the exact reason is
//! logged).
//!
//! Result convention of this crate: every fallible operation returns
//! [`Result<T>`]. The variant says how the binding raises it: a
//! [`Error::Layout`] is a `ValueError`, everything else a `RuntimeError`
//! whose text is [`Error::message`]; the reason ([`Error::reason`]) goes to
//! the log.

use mooncake_client::{Error as ClientError, ErrorCode};
use std::borrow::Cow;

/// A failed EngramStore operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A layer layout that is rejected, with its exact message.
    #[error("{0}")]
    Layout(&'static str),
    /// An argument that is rejected, with its own message.
    #[error("{0}")]
    Argument(Cow<'static, str>),
    /// `populate` failed (`populate failed`); why is in the inner error.
    #[error("populate failed: {0}")]
    Populate(ClientError),
    /// A lookup failed (`EngramStore lookup failed`); why is in the inner error.
    #[error("EngramStore lookup failed: {0}")]
    Lookup(ClientError),
    /// `remove_from_store` failed with the first failing code in head order.
    #[error("remove_from_store failed: {0}")]
    Remove(ClientError),
}

/// Result alias of the engram crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A populate failure with `code` and `reason`.
    pub fn populate(code: ErrorCode, reason: impl Into<Cow<'static, str>>) -> Self {
        Error::Populate(ClientError::new(code, reason))
    }

    /// A lookup failure with `code` and `reason`.
    pub fn lookup(code: ErrorCode, reason: impl Into<Cow<'static, str>>) -> Self {
        Error::Lookup(ClientError::new(code, reason))
    }

    /// The upstream code: INVALID_PARAMS for layout and argument errors.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Layout(_) | Error::Argument(_) => ErrorCode::InvalidParams,
            Error::Populate(e) | Error::Lookup(e) | Error::Remove(e) => e.code(),
        }
    }

    /// The exception text Python sees for this failure.
    pub fn message(&self) -> Cow<'static, str> {
        match self {
            Error::Layout(m) => Cow::Borrowed(m),
            Error::Argument(m) => m.clone(),
            Error::Populate(_) => Cow::Borrowed("populate failed"),
            Error::Lookup(_) => Cow::Borrowed("EngramStore lookup failed"),
            Error::Remove(e) => {
                Cow::Owned(format!("remove_from_store failed, rc={}", e.code().code()))
            }
        }
    }

    /// Why, beyond [`Error::message`] (`""` when the message says it all).
    pub fn reason(&self) -> &str {
        match self {
            Error::Layout(_) | Error::Argument(_) => "",
            Error::Populate(e) | Error::Lookup(e) | Error::Remove(e) => e.reason(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_the_spec_texts() {
        let e = Error::populate(ErrorCode::ObjectAlreadyExists, "key exists");
        assert_eq!(e.message(), "populate failed");
        assert_eq!(e.reason(), "key exists");
        assert_eq!(e.code(), ErrorCode::ObjectAlreadyExists);
        let e = Error::lookup(ErrorCode::InvalidParams, "id out of range");
        assert_eq!(e.message(), "EngramStore lookup failed");
        let e = Error::Remove(ErrorCode::ObjectHasLease.into());
        assert_eq!(e.message(), "remove_from_store failed, rc=-706");
        let e = Error::Layout("EngramStoreConfig.embedding_dim must be positive");
        assert_eq!(
            e.message(),
            "EngramStoreConfig.embedding_dim must be positive"
        );
        assert_eq!(e.code(), ErrorCode::InvalidParams);
        assert_eq!(e.reason(), "");
    }
}
