//! The client's one error type: the upstream `ErrorCode` a store method
//! returns (upstream's values) together with the human reason its log line
//! shows (every failing return logs one line naming the method, the key and
//! the reason).
//!
//! Result convention of this crate: every fallible operation returns
//! [`Result<T>`]; a per-item batch operation returns `Vec<Result<T>>`,
//! wrapped in an outer [`Result`] when the whole call can fail at once
//! (argument lengths, the write config). Codes from the master and the
//! transfer engine convert with `From<ErrorCode>` (no reason: the code says
//! it all); [`Error::context`] prefixes where a failure happened, layer by
//! layer, so no caller has to re-derive it.

use mooncake_common::ErrorCode;
use std::borrow::Cow;
use std::fmt;

/// A failed client operation: the upstream code and why. It crosses
/// process boundaries as is (serde), so a standalone daemon answers its
/// dummy clients with the error its own client returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub struct Error {
    code: ErrorCode,
    reason: Cow<'static, str>,
}

/// Result alias of the client crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with `code` and `reason`.
    pub fn new(code: ErrorCode, reason: impl Into<Cow<'static, str>>) -> Self {
        Error {
            code,
            reason: reason.into(),
        }
    }

    /// INVALID_PARAMS (-600): an argument or config the store rejects.
    pub fn invalid(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorCode::InvalidParams, reason)
    }

    /// NOT_SUPPORTED (-1012): a feature this build does not have.
    pub fn not_supported(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorCode::NotSupported, reason)
    }

    /// INTERNAL_ERROR (-1).
    pub fn internal(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorCode::InternalError, reason)
    }

    /// The failure of every call on a store that is not set up or is closed:
    /// INVALID_PARAMS (`int` methods return -600 and never crash).
    pub fn not_set_up() -> Self {
        Self::invalid("store is not set up (or closed)")
    }

    /// The upstream code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// Why, or `""` when the code says it all.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The same error with `ctx` in front of its reason (`"ctx: reason"`).
    pub fn context(self, ctx: impl fmt::Display) -> Self {
        let reason = if self.reason.is_empty() {
            ctx.to_string()
        } else {
            format!("{ctx}: {}", self.reason)
        };
        Error {
            code: self.code,
            reason: reason.into(),
        }
    }
}

impl From<ErrorCode> for Error {
    fn from(code: ErrorCode) -> Self {
        Error {
            code,
            reason: Cow::Borrowed(""),
        }
    }
}

impl From<mooncake_transfer::Error> for Error {
    /// The transfer's code, with what failed, the peer and the OS error as
    /// the reason.
    fn from(e: mooncake_transfer::Error) -> Self {
        Error::new(e.code(), e.to_string())
    }
}

impl fmt::Display for Error {
    /// `NAME (code)`, then `: reason` when there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.code, self.code.code())?;
        if !self.reason.is_empty() {
            write!(f, ": {}", self.reason)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_reason_and_context() {
        let e = Error::invalid("empty key");
        assert_eq!(e.code(), ErrorCode::InvalidParams);
        assert_eq!(e.reason(), "empty key");
        assert_eq!(e.to_string(), "INVALID_PARAMS (-600): empty key");
        let e = Error::from(ErrorCode::ObjectNotFound);
        assert_eq!(e.reason(), "");
        assert_eq!(e.to_string(), "OBJECT_NOT_FOUND (-704)");
        let e = e.context("replica list");
        assert_eq!(e.reason(), "replica list");
        let e = e.context("get");
        assert_eq!(e.reason(), "get: replica list");
        assert_eq!(e.code(), ErrorCode::ObjectNotFound);
        assert_eq!(Error::not_set_up().code().code(), -600);
        assert_eq!(Error::not_supported("x").code().code(), -1012);
        assert_eq!(Error::internal("x").code().code(), -1);
    }
}
