//! Client <-> master RPC messages. Each request frame carries one
//! [`MasterRequest`]; the master answers with one [`MasterResponse`].

use crate::error::ErrorCode;
use crate::ledger::LedgerEntry;
use serde::{Deserialize, Serialize};

/// A mounted segment as described by its owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentDesc {
    /// `host:port`, the client's hostname and data-server port.
    pub name: String,
    /// Random id of this segment's memory (changes when the memory changes).
    pub uuid: String,
    /// Segment size in bytes.
    pub size: u64,
    /// Address of the segment in its owner's address space (reported by `/query_key`).
    pub base_addr: u64,
    /// Same-host identity of the owner (see `hostid`).
    pub host_id: String,
    /// Owner process id.
    pub pid: u32,
    /// TCP endpoint of the owner's data server (`host:port`).
    pub endpoint: String,
    /// Abstract Unix socket name (without the leading NUL) for the mapping handshake.
    pub socket_name: String,
}

/// Soft-pin action carried by a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SoftPin {
    Preserve,
    Enable,
    Disable,
}

/// Write placement/pin configuration (validated client-side and master-side).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteConfig {
    pub replica_num: u32,
    pub soft_pin: SoftPin,
    /// None means the master default TTL.
    pub soft_pin_ttl_ms: Option<u64>,
    pub hard_pin: bool,
    /// Segment names tried first, in order.
    pub preferred_segments: Vec<String>,
    /// Host id of the writer, for `local_first` allocation.
    pub writer_host_id: String,
    /// Segment of the writer (placement hint for tensor writes).
    pub writer_segment: Option<String>,
    pub data_type: u32,
}

impl Default for WriteConfig {
    fn default() -> Self {
        WriteConfig {
            replica_num: 1,
            soft_pin: SoftPin::Preserve,
            soft_pin_ttl_ms: None,
            hard_pin: false,
            preferred_segments: Vec::new(),
            writer_host_id: String::new(),
            writer_segment: None,
            data_type: 0,
        }
    }
}

/// Where one replica of an object lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaLoc {
    pub segment_name: String,
    pub segment_uuid: String,
    pub endpoint: String,
    pub host_id: String,
    pub socket_name: String,
    pub segment_size: u64,
    pub base_addr: u64,
    /// Offset of the value inside the segment.
    pub offset: u64,
    pub size: u64,
}

/// Result of a read lookup: the object's size, its complete replicas, and
/// the lease the master granted (ms from when the master answered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectInfo {
    pub size: u64,
    pub replicas: Vec<ReplicaLoc>,
    pub lease_ttl_ms: u64,
    /// Read ticket of this lookup (0 = none): the master counts the object
    /// as being read until the client reports the ticket done (or the
    /// lease runs out); upserts of a read object return OBJECT_REPLICA_BUSY.
    pub read_ticket: u64,
}

/// Requests a client sends to the master.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MasterRequest {
    /// Heartbeat; the answer says whether the client must remount.
    Ping {
        client_id: String,
    },
    /// Mount (or remount) a segment for a client.
    MountSegment {
        client_id: String,
        segment: SegmentDesc,
    },
    /// Unmount a client's segment (its replicas are dropped).
    UnmountSegment {
        client_id: String,
        segment_name: String,
    },
    /// The client is going away.
    Disconnect {
        client_id: String,
    },
    /// Begin writes for a batch of keys; `upsert` selects upsert semantics.
    PutStart {
        keys: Vec<String>,
        sizes: Vec<u64>,
        config: WriteConfig,
        upsert: bool,
    },
    /// Commit writes that succeeded.
    PutEnd {
        keys: Vec<String>,
    },
    /// Revoke writes that failed.
    PutRevoke {
        keys: Vec<String>,
    },
    /// Look up complete replicas (grants a lease per found key). With
    /// `track`, the found objects are marked as being read under a new
    /// read ticket (see [`ObjectInfo::read_ticket`]).
    GetReplicaList {
        keys: Vec<String>,
        track: bool,
    },
    /// The reads of these tickets finished.
    ReadsDone {
        tickets: Vec<u64>,
    },
    /// Finished read tickets piggybacked on another request; the master
    /// applies them before `req`.
    WithDone {
        done: Vec<u64>,
        req: Box<MasterRequest>,
    },
    /// Existence check (grants a lease when it answers 1).
    Exist {
        keys: Vec<String>,
    },
    Remove {
        keys: Vec<String>,
        force: bool,
    },
    RemoveByRegex {
        pattern: String,
        force: bool,
    },
    RemoveAll {
        force: bool,
    },
    /// Mount a segment whose memory already holds objects (the master lost
    /// its metadata): `entries` is a chunk of the owner's ledger; the segment
    /// is used only once the chunk with `done` arrived, and the master then
    /// answers [`MasterResponse::Remounted`].
    RemountSegment {
        /// The owning client.
        client_id: String,
        /// The segment (same name and memory as before).
        segment: SegmentDesc,
        /// A chunk of the owner's ledger.
        entries: Vec<LedgerEntry>,
        /// Last chunk.
        done: bool,
    },
    /// Commit writes like `PutEnd`, except that the ledger entries of
    /// replicas in `local_segments` (segments owned by the writer's own
    /// process) come back in [`MasterResponse::Committed`] for the writer to
    /// record, instead of being pushed to their owner and awaited.
    CommitEnd {
        /// Keys whose replicas were all written.
        keys: Vec<String>,
        /// Segments whose ledgers the writer updates itself.
        local_segments: Vec<String>,
    },
    /// Turn this connection into the owner's ledger stream for its segment:
    /// after the `Ok`, the master sends `LedgerPush` frames and the client
    /// answers each with a `LedgerAck` (see `ledger`).
    LedgerStream {
        /// The owning client.
        client_id: String,
        /// Its segment.
        segment_name: String,
    },
}

/// Outcome of one key in a `PutStart` batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PutStartItem {
    /// Write the value into these replicas, then PutEnd.
    Write(Vec<ReplicaLoc>),
    /// Write-once put of an existing key: the old value is kept, report success.
    AlreadyExists,
    Err(ErrorCode),
}

/// Master answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MasterResponse {
    Pong {
        need_remount: bool,
    },
    Ok,
    PutStart(Vec<PutStartItem>),
    Objects(Vec<Result<ObjectInfo, ErrorCode>>),
    Codes(Vec<i32>),
    Count(i64),
    Err(ErrorCode),
    /// `CommitEnd` done: record these `(segment, op)` in the local ledgers.
    Committed {
        /// Ledger ops for the writer's own segments.
        ops: Vec<(String, crate::ledger::LedgerOp)>,
    },
    /// The remount finished: the owner drops the listed `(offset, version)`
    /// ledger entries (stale: the master has newer versions of those keys),
    /// or its whole ledger when `discard_all` (the master had expired the
    /// segment, and dropped its objects, while the owner was unreachable).
    Remounted {
        /// Stale entries.
        stale: Vec<(u64, u64)>,
        /// Forget every entry.
        discard_all: bool,
    },
}
