//! Client <-> master RPC messages. Each request frame carries one
//! [`RequestFrame`] (a [`MasterRequest`] plus the read tickets the client
//! finished); the master answers with one [`MasterResponse`].
//!
//! No message type contains itself, so decoding a frame never recurses
//! deeper than the fixed nesting of these types, whatever its bytes say
//! (a request nested thousands of levels deep used to overflow
//! the master's stack).

use crate::auth::WriteTicket;
use crate::error::ErrorCode;
use crate::ledger::LedgerEntry;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Largest segment a client can map: the user address space of x86-64 and
/// aarch64 with 4-level page tables (128 TiB). The master refuses larger
/// mounts with INVALID_PARAMS, as it refuses any mount whose size would
/// overflow its capacity sum.
pub const MAX_SEGMENT_SIZE: u64 = 1 << 47;

/// How often a client pings the master. The master counts a client whose
/// last ping is older than one and a half intervals as suspect: new
/// replicas go elsewhere while any other segment fits.
pub const HEARTBEAT_INTERVAL_MS: u64 = 1000;

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
    /// Same-host identity of the owner (`mooncake_transfer::hostid`).
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
    /// Keep the object's current soft pin (none for a new object).
    Preserve,
    /// Pin until now + the TTL (the master default when none is given).
    Enable,
    /// Remove the soft pin.
    Disable,
}

/// Write placement/pin configuration (validated client-side and master-side).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteConfig {
    /// Replicas wanted, each on a distinct segment (best effort, at least 1).
    pub replica_num: u32,
    /// Soft-pin action applied when the write commits.
    pub soft_pin: SoftPin,
    /// None means the master default TTL.
    pub soft_pin_ttl_ms: Option<u64>,
    /// Never evict the object (sticky across upserts).
    pub hard_pin: bool,
    /// Segment names tried first, in order.
    pub preferred_segments: Vec<String>,
    /// Host id of the writer, for `local_first` allocation.
    pub writer_host_id: String,
    /// The writer copies into segments on its own host through memory
    /// (its same-host path is on), so such a write cannot stop half done
    /// on a broken connection.
    pub writer_maps_host: bool,
    /// Segments the writer's own process owns (it copies into them through
    /// memory in any case).
    pub writer_own_segments: Vec<String>,
    /// Segment of the writer (placement hint for tensor writes).
    pub writer_segment: Option<String>,
    /// `(key, group id)` of the keys written with a group (see the
    /// master's `groups`).
    pub groups: Vec<(String, String)>,
    /// Id of the writing client (the object's writer: only it may clear
    /// the object's replicas with `BatchReplicaClear`).
    pub writer_client_id: String,
    /// Upstream `ObjectDataType` value, recorded with the object.
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
            writer_maps_host: false,
            writer_own_segments: Vec::new(),
            writer_segment: None,
            writer_client_id: String::new(),
            groups: Vec::new(),
            data_type: 0,
        }
    }
}

/// Where one replica of an object lives.
///
/// The segment's names are shared strings: every replica on one segment
/// holds the same ones, so building, cloning and decoding a reply of many
/// keys allocates them once per segment, not once per key (see
/// [`shared_str`]). On the wire they are plain strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaLoc {
    /// Name (`host:port`) of the segment holding the replica.
    #[serde(with = "shared_str")]
    pub segment_name: Arc<str>,
    /// Id of the segment's memory.
    #[serde(with = "shared_str")]
    pub segment_uuid: Arc<str>,
    /// TCP endpoint of the owner's data server.
    #[serde(with = "shared_str")]
    pub endpoint: Arc<str>,
    /// Same-host identity of the owner.
    #[serde(with = "shared_str")]
    pub host_id: Arc<str>,
    /// Abstract socket name of the owner's mapping server.
    #[serde(with = "shared_str")]
    pub socket_name: Arc<str>,
    /// Size of the whole segment.
    pub segment_size: u64,
    /// Address of the segment in its owner's address space.
    pub base_addr: u64,
    /// Offset of the value inside the segment.
    pub offset: u64,
    /// Size of the value.
    pub size: u64,
    /// With a cluster token: the master's grant to write this replica's
    /// range (only on the replicas of a put in progress).
    pub ticket: Option<WriteTicket>,
}

/// Where the disk copy of an object lives: the disk tier of the process
/// owning `segment_name`, which serves it through its data server at
/// `endpoint`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskLoc {
    /// The object's key.
    pub key: String,
    /// The version the disk copy holds.
    pub version: u64,
    /// Segment (`host:port`) of the owner holding the copy.
    pub segment_name: String,
    /// TCP endpoint of the owner's data server.
    pub endpoint: String,
}

/// An object in an owner's disk tier, as the owner reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskObject {
    /// The object's key.
    pub key: String,
    /// Its version.
    pub version: u64,
    /// Value size in bytes.
    pub size: u64,
}

/// Result of a read lookup: the object's size, its complete replicas, and
/// the lease the master granted (ms from when the master answered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectInfo {
    /// Value size in bytes.
    pub size: u64,
    /// COMPLETE replicas.
    pub replicas: Vec<ReplicaLoc>,
    /// The disk copy, when the object has one (only when `replicas` is
    /// empty: memory replicas are read first).
    pub disk: Option<DiskLoc>,
    /// Lease granted by this lookup, in ms from when the master answered.
    pub lease_ttl_ms: u64,
    /// Read ticket of this lookup (0 = none): the master keeps the replicas
    /// listed here allocated, even after an upsert or a removal replaced
    /// them, until the client reports the ticket done (or the lease runs
    /// out).
    pub read_ticket: u64,
}

/// Whether `name` may name a tenant (a client's `tenant_id`): not empty, not
/// starting with `_`, and no control character or DEL.
pub fn valid_tenant(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('_') && name.bytes().all(|c| c >= 0x20 && c != 0x7f)
}

/// Requests a client sends to the master.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MasterRequest {
    /// Heartbeat; the answer says whether the client must remount.
    Ping {
        /// The client's id (random per `setup`).
        client_id: String,
    },
    /// Mount (or remount) a segment for a client.
    MountSegment {
        /// The owning client.
        client_id: String,
        /// The segment.
        segment: SegmentDesc,
    },
    /// Unmount a client's segment (its replicas are dropped).
    UnmountSegment {
        /// The owning client.
        client_id: String,
        /// The segment's name.
        segment_name: String,
    },
    /// The client is going away.
    Disconnect {
        /// The client leaving.
        client_id: String,
    },
    /// Begin writes for a batch of keys; `upsert` selects upsert semantics.
    PutStart {
        /// Keys to write.
        keys: Vec<String>,
        /// Value size per key.
        sizes: Vec<u64>,
        /// Placement and pins.
        config: WriteConfig,
        /// Upsert (replace) instead of write-once put.
        upsert: bool,
        /// Segments not to place replicas on: the writer failed to write
        /// there earlier in the same call (it retries elsewhere).
        exclude: Vec<String>,
    },
    /// Commit writes that succeeded.
    PutEnd {
        /// Keys whose replicas were all written.
        keys: Vec<String>,
        /// The version `PutStart` granted each key's write (parallel to
        /// `keys`; a missing or 0 entry names the key's first write).
        versions: Vec<u64>,
    },
    /// Revoke writes that failed.
    PutRevoke {
        /// Keys whose writes failed.
        keys: Vec<String>,
        /// The version of each write (as in `PutEnd`).
        versions: Vec<u64>,
    },
    /// Look up complete replicas (grants a lease per found key). With
    /// `track`, the found objects are marked as being read under a new
    /// read ticket (see [`ObjectInfo::read_ticket`]).
    GetReplicaList {
        /// Keys to look up.
        keys: Vec<String>,
        /// Mark the found objects as being read.
        track: bool,
    },
    /// The reads of these tickets finished.
    ReadsDone {
        /// Finished read tickets.
        tickets: Vec<u64>,
    },
    /// Existence check (grants a lease when it answers 1).
    Exist {
        /// Keys to check.
        keys: Vec<String>,
    },
    /// Remove keys (OBJECT_HAS_LEASE while leased unless forced).
    Remove {
        /// Keys to remove.
        keys: Vec<String>,
        /// Ignore read leases.
        force: bool,
    },
    /// Remove every key an ECMAScript-style pattern finds.
    RemoveByRegex {
        /// The pattern (search semantics).
        pattern: String,
        /// Ignore read leases.
        force: bool,
    },
    /// Remove every removable key.
    RemoveAll {
        /// Ignore read leases.
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
        /// The version of each write (as in `PutEnd`).
        versions: Vec<u64>,
        /// Segments whose ledgers the writer updates itself.
        local_segments: Vec<String>,
    },
    /// The owner of `segment_name` has a disk tier holding `objects` (a
    /// chunk of its report; `done` on the last). The master adopts as disk
    /// copies the objects it does not know and answers
    /// [`MasterResponse::Codes`]: 1 adopted, 0 not (the owner deletes those).
    DiskTier {
        /// The owning client.
        client_id: String,
        /// Its segment.
        segment_name: String,
        /// Objects in its disk tier.
        objects: Vec<DiskObject>,
        /// Last chunk of the report.
        done: bool,
    },
    /// These `(key, version)` disk copies left the owner's disk tier
    /// (evicted, corrupt, or never written): the master forgets them.
    DiskDropped {
        /// The owning client.
        client_id: String,
        /// Its segment.
        segment_name: String,
        /// The copies gone.
        objects: Vec<(String, u64)>,
    },
    /// The owner of `segment_name` drains its disk tier: the master
    /// forgets every disk copy on it (an object with no memory replica
    /// left is gone) and queues no more copies to it.
    DiskTierDrain {
        /// The owning client.
        client_id: String,
        /// Its segment.
        segment_name: String,
    },
    /// Where owners keep their disk tiers when the master has a
    /// `--root_fs_dir`: answered with [`MasterResponse::StorageConfig`].
    StorageConfig,
    /// Turn this connection into the owner's ledger stream for its segment:
    /// after the `Ok`, the master sends `LedgerPush` frames and the client
    /// answers each with a `LedgerAck` (see `ledger`).
    LedgerStream {
        /// The owning client.
        client_id: String,
        /// Its segment.
        segment_name: String,
    },
    /// The owner of `segment_name` applied these
    /// [`crate::ledger::LedgerOp::Promote`] ops: `(key, version, offset,
    /// copied)`. A copied one becomes a memory replica of the object (if it
    /// is still that version with no memory replica); otherwise the master
    /// frees the space. Answered with `Ok`.
    Promoted {
        /// The owning client.
        client_id: String,
        /// Its segment.
        segment_name: String,
        /// One entry per promote op.
        done: Vec<crate::ledger::PromoteResult>,
    },
    /// Clear the replicas of `keys` that the client `client_id` wrote and
    /// no lease protects: on `segment_name` only, or all of them (the
    /// object goes) when it is empty. Answered with
    /// [`MasterResponse::Keys`]: the keys cleared.
    BatchReplicaClear {
        /// The asking client.
        client_id: String,
        /// The keys.
        keys: Vec<String>,
        /// A segment name, or empty for every segment.
        segment_name: String,
    },
    /// Ask for replicas of `key` on each of the segments `targets` (a
    /// segment that already holds one is left as it is). Answered with
    /// [`MasterResponse::TaskId`].
    CreateCopyTask {
        /// The object's key.
        key: String,
        /// Segment names.
        targets: Vec<String>,
    },
    /// Ask to move the replica of `key` on segment `source` to segment
    /// `target`. Answered with [`MasterResponse::TaskId`].
    CreateMoveTask {
        /// The object's key.
        key: String,
        /// Segment name holding the replica.
        source: String,
        /// Segment name to move it to.
        target: String,
    },
    /// The state of a copy or move task. Answered with
    /// [`MasterResponse::Task`].
    QueryTask {
        /// The task's id.
        id: u128,
    },
    /// The owner of `segment_name` applied these
    /// [`crate::ledger::LedgerOp::Fetch`] ops. A copied one becomes a
    /// replica of the object if it is still that version; otherwise the
    /// master frees the space. Answered with `Ok`.
    Fetched {
        /// The owning client.
        client_id: String,
        /// Its segment.
        segment_name: String,
        /// One entry per fetch op.
        done: Vec<crate::ledger::FetchResult>,
    },
    /// The requests that follow on this connection act for tenant
    /// `tenant_id` (sent first by clients of a tenant other than
    /// `default`). Answered with `Count(1)` when the master keeps tenant
    /// namespaces (`--enable_multi_tenants`), `Count(0)` when all tenants
    /// share one, or `Err(InvalidParams)` for a name no tenant may have.
    Tenant {
        /// The tenant.
        tenant_id: String,
    },
}

impl MasterRequest {
    /// Whether the request changes metadata: what a deposed leader must
    /// stop accepting, and what must reach the master after every read the
    /// same client finished.
    pub fn changes_metadata(&self) -> bool {
        matches!(
            self,
            MasterRequest::PutStart { .. }
                | MasterRequest::PutEnd { .. }
                | MasterRequest::CommitEnd { .. }
                | MasterRequest::PutRevoke { .. }
                | MasterRequest::Remove { .. }
                | MasterRequest::RemoveByRegex { .. }
                | MasterRequest::RemoveAll { .. }
                | MasterRequest::MountSegment { .. }
                | MasterRequest::RemountSegment { .. }
                | MasterRequest::UnmountSegment { .. }
                | MasterRequest::DiskTier { .. }
                | MasterRequest::DiskDropped { .. }
                | MasterRequest::DiskTierDrain { .. }
                | MasterRequest::Promoted { .. }
                | MasterRequest::CreateCopyTask { .. }
                | MasterRequest::BatchReplicaClear { .. }
                | MasterRequest::CreateMoveTask { .. }
                | MasterRequest::Fetched { .. }
        )
    }
}

/// Kind of an asynchronous replica task (numbered as upstream's `TaskType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskKind {
    /// Copy an object to more segments.
    ReplicaCopy = 0,
    /// Move one replica of an object to another segment.
    ReplicaMove = 1,
}

/// Lifecycle of a task (numbered as upstream's `TaskStatus`): PENDING until
/// the master starts it, PROCESSING while segment owners copy, then FAILED
/// or SUCCESS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    /// Queued.
    Pending = 0,
    /// Copies in flight.
    Processing = 1,
    /// Finished without reaching its goal (see the message).
    Failed = 2,
    /// Finished: the object has its replicas where asked.
    Success = 3,
}

impl TaskState {
    /// FAILED or SUCCESS.
    pub fn is_finished(self) -> bool {
        matches!(self, TaskState::Failed | TaskState::Success)
    }
}

/// What `QueryTask` tells about a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// The task's id.
    pub id: u128,
    /// Copy or move.
    pub kind: TaskKind,
    /// Where it stands.
    pub state: TaskState,
    /// Creation time, Unix ms.
    pub created_at_ms: u64,
    /// Last state change, Unix ms.
    pub updated_at_ms: u64,
    /// The client whose segment does (or did) the copying (a client id,
    /// or empty when no copy was started).
    pub assigned_client: String,
    /// Why it failed, or what it did.
    pub message: String,
}

/// What a client sends in one request frame: the request, plus finished
/// read tickets riding along (the master applies them first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestFrame {
    /// Read tickets whose reads finished (see [`ObjectInfo::read_ticket`]).
    pub done: Vec<u64>,
    /// The request.
    pub req: MasterRequest,
}

/// Encode a whole request frame (length prefix included) for `req` with
/// the finished tickets `done`, without copying the request.
pub fn encode_request(req: &MasterRequest, done: &[u64]) -> std::io::Result<Vec<u8>> {
    // A (slice, request) tuple has the same bincode layout as RequestFrame.
    crate::framing::encode_frame(&(done, req))
}

/// Outcome of one key in a `PutStart` batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PutStartItem {
    /// Write the value into these replicas, then end the write (`PutEnd`,
    /// `CommitEnd` or `PutRevoke`) naming `version`.
    Write {
        /// Where the value goes: fresh allocations, never bytes a reader
        /// may be copying.
        replicas: Vec<ReplicaLoc>,
        /// The version this write creates; it names the write when it ends.
        version: u64,
    },
    /// Write-once put of an existing key: the old value is kept, report success.
    AlreadyExists,
    /// The key cannot be written.
    Err(ErrorCode),
}

/// Master answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MasterResponse {
    /// Answer to `Ping`.
    Pong {
        /// The master does not know the client (it restarted): remount.
        need_remount: bool,
    },
    /// Success without a payload.
    Ok,
    /// One item per key of a `PutStart`.
    PutStart(Vec<PutStartItem>),
    /// One lookup result per key of a `GetReplicaList`.
    Objects(Vec<Result<ObjectInfo, ErrorCode>>),
    /// One code per key (`Exist`: 1/0; `Remove`: 0 or an error code).
    Codes(Vec<i32>),
    /// A count (`RemoveByRegex`, `RemoveAll`), or a negative code.
    Count(i64),
    /// The whole request failed.
    Err(ErrorCode),
    /// `CommitEnd` done: record these `(segment, op)` in the local ledgers.
    Committed {
        /// Ledger ops for the writer's own segments.
        ops: Vec<(String, crate::ledger::LedgerOp)>,
    },
    /// Answer to `StorageConfig`.
    StorageConfig {
        /// `<root_fs_dir>/<cluster_id>`, or empty without `--root_fs_dir`.
        fsdir: String,
        /// The master copies objects to owners' disk tiers.
        offload: bool,
        /// Tiers under `fsdir` evict their oldest copies to make room
        /// (`--enable_disk_eviction`); false: a full tier refuses new copies.
        disk_eviction: bool,
        /// The most bytes each tier under `fsdir` may hold (`--quota_bytes`);
        /// 0: 90% of its file system.
        quota_bytes: u64,
    },
    /// Keys (`BatchReplicaClear`: those cleared).
    Keys(Vec<String>),
    /// Id of the task a `CreateCopyTask` or `CreateMoveTask` created.
    TaskId(u128),
    /// Answer to `QueryTask`.
    Task(TaskInfo),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framing;

    #[test]
    fn request_frames_roundtrip() {
        let req = MasterRequest::Remove {
            keys: vec!["a".into()],
            force: true,
        };
        let frame = encode_request(&req, &[7, 9]).expect("encode");
        let body = framing::read_frame(&mut &frame[..], 1024).expect("frame");
        let got: RequestFrame = framing::decode(&body).expect("decode");
        assert_eq!(got.done, vec![7, 9]);
        assert_eq!(got.req, req);
    }

    #[test]
    fn old_nested_envelope_is_refused_not_recursed() {
        // Protocol 2's WithDone (variant 9) nested 100 000 deep.
        let body = crate::fuzz::nested_request_body(100_000);
        assert!(framing::decode::<RequestFrame>(&body).is_err());
    }
}

/// Shared strings on the wire: written as plain strings; read back through
/// a small per-thread table of the strings read last, so that a string
/// repeated across a message (a segment's name in every replica of a
/// lookup of many keys) is one allocation, shared, instead of one per
/// occurrence.
pub mod shared_str {
    use serde::de::{Error, Visitor};
    use serde::{Deserializer, Serializer};
    use std::cell::RefCell;
    use std::fmt;
    use std::sync::Arc;

    /// Distinct strings the table keeps (a message names a few segments,
    /// five strings each); the oldest goes first.
    const KEEP: usize = 32;

    thread_local! {
        static RECENT: RefCell<Vec<Arc<str>>> = const { RefCell::new(Vec::new()) };
    }

    /// `s` as a shared string: the table's copy when it has one, else a new
    /// one, remembered.
    pub fn intern(s: &str) -> Arc<str> {
        RECENT.with(|t| {
            let mut t = t.borrow_mut();
            if let Some(hit) = t.iter().rev().find(|a| &***a == s) {
                return Arc::clone(hit);
            }
            let a: Arc<str> = Arc::from(s);
            if t.len() >= KEEP {
                t.remove(0);
            }
            t.push(Arc::clone(&a));
            a
        })
    }

    /// Write `s` as a plain string.
    pub fn serialize<S: Serializer>(s: &Arc<str>, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(s)
    }

    /// Read a plain string as a shared one ([`intern`]).
    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Arc<str>, D::Error> {
        struct Shared;
        impl Visitor<'_> for Shared {
            type Value = Arc<str>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<Arc<str>, E> {
                Ok(intern(v))
            }
        }
        de.deserialize_str(Shared)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn repeated_strings_share_one_allocation_and_keep_their_value() {
            let a = intern("host-a:1234");
            let b = intern("host-a:1234");
            assert!(Arc::ptr_eq(&a, &b));
            assert_eq!(&*b, "host-a:1234");
            let c = intern("host-b:1234");
            assert_eq!(&*c, "host-b:1234");
            assert!(!Arc::ptr_eq(&a, &c));
        }

        #[test]
        fn the_table_forgets_the_oldest_beyond_its_size_without_changing_values() {
            let first = intern("first-of-many");
            for i in 0..KEEP {
                let s = format!("other-{i}");
                assert_eq!(&*intern(&s), s);
            }
            let again = intern("first-of-many");
            assert_eq!(&*again, "first-of-many");
            assert!(!Arc::ptr_eq(&first, &again));
            RECENT.with(|t| assert!(t.borrow().len() <= KEEP));
        }
    }
}
