//! Upstream Mooncake error codes (values must match upstream exactly).

use serde::{Deserialize, Serialize};

/// Error codes returned by store operations; the numeric values are upstream's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[repr(i32)]
pub enum ErrorCode {
    #[error("INTERNAL_ERROR")]
    InternalError = -1,
    #[error("BUFFER_OVERFLOW")]
    BufferOverflow = -10,
    #[error("SEGMENT_NOT_FOUND")]
    SegmentNotFound = -101,
    #[error("SEGMENT_ALREADY_EXISTS")]
    SegmentAlreadyExists = -102,
    #[error("CLIENT_NOT_FOUND")]
    ClientNotFound = -103,
    #[error("NO_AVAILABLE_HANDLE")]
    NoAvailableHandle = -200,
    #[error("INVALID_KEY")]
    InvalidKey = -400,
    #[error("INVALID_PARAMS")]
    InvalidParams = -600,
    #[error("ILLEGAL_CLIENT")]
    IllegalClient = -601,
    #[error("INVALID_REPLICA")]
    InvalidReplica = -702,
    #[error("REPLICA_IS_NOT_READY")]
    ReplicaIsNotReady = -703,
    #[error("OBJECT_NOT_FOUND")]
    ObjectNotFound = -704,
    #[error("OBJECT_ALREADY_EXISTS")]
    ObjectAlreadyExists = -705,
    #[error("OBJECT_HAS_LEASE")]
    ObjectHasLease = -706,
    #[error("LEASE_EXPIRED")]
    LeaseExpired = -707,
    #[error("OBJECT_HAS_REPLICATION_TASK")]
    ObjectHasReplicationTask = -708,
    #[error("OBJECT_REPLICA_BUSY")]
    ObjectReplicaBusy = -714,
    #[error("TRANSFER_FAIL")]
    TransferFail = -800,
    #[error("CHECKSUM_MISMATCH")]
    ChecksumMismatch = -801,
    #[error("RPC_FAIL")]
    RpcFail = -900,
    #[error("RPC_TIMEOUT")]
    RpcTimeout = -901,
    #[error("UNAVAILABLE_IN_CURRENT_STATUS")]
    UnavailableInCurrentStatus = -1010,
    #[error("NOT_SUPPORTED")]
    NotSupported = -1012,
}

/// Result alias used across the store crates.
pub type McResult<T> = Result<T, ErrorCode>;

impl ErrorCode {
    /// All codes, for enumeration (e.g. building the Python `ErrorCode` enum).
    pub const ALL: [ErrorCode; 23] = [
        ErrorCode::InternalError,
        ErrorCode::BufferOverflow,
        ErrorCode::SegmentNotFound,
        ErrorCode::SegmentAlreadyExists,
        ErrorCode::ClientNotFound,
        ErrorCode::NoAvailableHandle,
        ErrorCode::InvalidKey,
        ErrorCode::InvalidParams,
        ErrorCode::IllegalClient,
        ErrorCode::InvalidReplica,
        ErrorCode::ReplicaIsNotReady,
        ErrorCode::ObjectNotFound,
        ErrorCode::ObjectAlreadyExists,
        ErrorCode::ObjectHasLease,
        ErrorCode::LeaseExpired,
        ErrorCode::ObjectHasReplicationTask,
        ErrorCode::ObjectReplicaBusy,
        ErrorCode::TransferFail,
        ErrorCode::ChecksumMismatch,
        ErrorCode::RpcFail,
        ErrorCode::RpcTimeout,
        ErrorCode::UnavailableInCurrentStatus,
        ErrorCode::NotSupported,
    ];

    /// The numeric upstream value.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// Upstream name, e.g. `OBJECT_NOT_FOUND`.
    pub fn name(self) -> String {
        self.to_string()
    }

    /// Map a numeric code back to the enum (unknown values become INTERNAL_ERROR).
    pub fn from_code(code: i32) -> ErrorCode {
        Self::ALL
            .iter()
            .copied()
            .find(|c| c.code() == code)
            .unwrap_or(ErrorCode::InternalError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_upstream() {
        assert_eq!(ErrorCode::InvalidParams.code(), -600);
        assert_eq!(ErrorCode::ObjectNotFound.code(), -704);
        assert_eq!(ErrorCode::NotSupported.code(), -1012);
        assert_eq!(ErrorCode::from_code(-706), ErrorCode::ObjectHasLease);
        assert_eq!(ErrorCode::from_code(12345), ErrorCode::InternalError);
        assert_eq!(ErrorCode::TransferFail.name(), "TRANSFER_FAIL");
    }
}
