//! Upstream Mooncake error codes (values must match upstream exactly).

use serde::{Deserialize, Serialize};

/// Error codes returned by store operations; the numeric values are upstream's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[repr(i32)]
pub enum ErrorCode {
    /// Unexpected failure (also: setup could not reach the master).
    #[error("INTERNAL_ERROR")]
    InternalError = -1,
    /// A buffer was too small.
    #[error("BUFFER_OVERFLOW")]
    BufferOverflow = -10,
    /// No such segment (or the uuid does not match).
    #[error("SEGMENT_NOT_FOUND")]
    SegmentNotFound = -101,
    /// The segment name is mounted by another live client.
    #[error("SEGMENT_ALREADY_EXISTS")]
    SegmentAlreadyExists = -102,
    /// The master does not know this client.
    #[error("CLIENT_NOT_FOUND")]
    ClientNotFound = -103,
    /// No segment has room for the value.
    #[error("NO_AVAILABLE_HANDLE")]
    NoAvailableHandle = -200,
    /// The key is not acceptable.
    #[error("INVALID_KEY")]
    InvalidKey = -400,
    /// An argument is out of range or inconsistent.
    #[error("INVALID_PARAMS")]
    InvalidParams = -600,
    /// The client does not own what it tried to change.
    #[error("ILLEGAL_CLIENT")]
    IllegalClient = -601,
    /// A replica descriptor is unusable.
    #[error("INVALID_REPLICA")]
    InvalidReplica = -702,
    /// The object has no COMPLETE replica yet.
    #[error("REPLICA_IS_NOT_READY")]
    ReplicaIsNotReady = -703,
    /// No such key.
    #[error("OBJECT_NOT_FOUND")]
    ObjectNotFound = -704,
    /// The key exists (write-once put).
    #[error("OBJECT_ALREADY_EXISTS")]
    ObjectAlreadyExists = -705,
    /// A read lease protects the object.
    #[error("OBJECT_HAS_LEASE")]
    ObjectHasLease = -706,
    /// The read finished after its lease ran out.
    #[error("LEASE_EXPIRED")]
    LeaseExpired = -707,
    /// A replication task holds the object.
    #[error("OBJECT_HAS_REPLICATION_TASK")]
    ObjectHasReplicationTask = -708,
    /// A replica is being read; the upsert cannot replace it now.
    #[error("OBJECT_REPLICA_BUSY")]
    ObjectReplicaBusy = -714,
    /// Moving bytes to or from a replica failed.
    #[error("TRANSFER_FAIL")]
    TransferFail = -800,
    /// Data did not match its checksum.
    #[error("CHECKSUM_MISMATCH")]
    ChecksumMismatch = -801,
    /// The master could not be reached or the call broke.
    #[error("RPC_FAIL")]
    RpcFail = -900,
    /// The master did not answer in time.
    #[error("RPC_TIMEOUT")]
    RpcTimeout = -901,
    /// Not possible in the current state.
    #[error("UNAVAILABLE_IN_CURRENT_STATUS")]
    UnavailableInCurrentStatus = -1010,
    /// Not implemented by this build.
    #[error("NOT_SUPPORTED")]
    NotSupported = -1012,
    /// No copy or move task has this id (never created, or its record was
    /// pruned from the finished history).
    #[error("TASK_NOT_FOUND")]
    TaskNotFound = -1400,
    /// The master's queue of pending tasks is full.
    #[error("TASK_PENDING_LIMIT_EXCEEDED")]
    TaskPendingLimitExceeded = -1401,
    /// The write would take the tenant's memory beyond its quota.
    #[error("TENANT_QUOTA_EXCEEDED")]
    TenantQuotaExceeded = -1700,
    /// The tenant has no quota policy (multi-tenant mode admits writes of
    /// registered tenants only).
    #[error("TENANT_NOT_REGISTERED")]
    TenantNotRegistered = -1701,
    /// The tenant still owns objects or charged memory.
    #[error("TENANT_NOT_EMPTY")]
    TenantNotEmpty = -1702,
}

/// Result alias used across the store crates.
pub type McResult<T> = Result<T, ErrorCode>;

impl ErrorCode {
    /// All codes, for enumeration (e.g. building the Python `ErrorCode` enum).
    pub const ALL: [ErrorCode; 28] = [
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
        ErrorCode::TaskNotFound,
        ErrorCode::TaskPendingLimitExceeded,
        ErrorCode::TenantQuotaExceeded,
        ErrorCode::TenantNotRegistered,
        ErrorCode::TenantNotEmpty,
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
