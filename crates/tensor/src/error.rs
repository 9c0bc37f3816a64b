//! The one error type of tensor IO: an upstream error code plus the reason
//! a user reads in the `mooncake.store` log line.

use mooncake_common::ErrorCode;

/// A failed tensor operation: the code a write returns (or that a read's
/// `None` stands for) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct TensorError {
    /// Upstream error code (`-600` for bad input, `-704` for a missing object, ...).
    pub code: ErrorCode,
    /// Human-readable reason, logged by the Python front.
    pub reason: String,
}

impl TensorError {
    /// Bad caller input (INVALID_PARAMS, -600).
    pub fn invalid(reason: impl Into<String>) -> Self {
        TensorError {
            code: ErrorCode::InvalidParams,
            reason: reason.into(),
        }
    }

    /// A needed object does not exist (OBJECT_NOT_FOUND, -704).
    pub fn not_found(reason: impl Into<String>) -> Self {
        TensorError {
            code: ErrorCode::ObjectNotFound,
            reason: reason.into(),
        }
    }

    /// Stored bytes that are not a valid tensor object, or a shard set whose
    /// members disagree (reported as INVALID_PARAMS, -600).
    pub fn corrupt(reason: impl Into<String>) -> Self {
        TensorError {
            code: ErrorCode::InvalidParams,
            reason: reason.into(),
        }
    }

    /// A store-level failure with its code.
    pub fn store(code: ErrorCode, reason: impl Into<String>) -> Self {
        TensorError {
            code,
            reason: reason.into(),
        }
    }

    /// The numeric code.
    pub fn code(&self) -> i32 {
        self.code.code()
    }

    /// The same error with `context: ` prefixed to its reason.
    pub fn context(mut self, context: impl std::fmt::Display) -> Self {
        self.reason = format!("{context}: {}", self.reason);
        self
    }
}

/// Result alias of this crate.
pub type TensorResult<T> = Result<T, TensorError>;
