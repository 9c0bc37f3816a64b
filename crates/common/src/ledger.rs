//! The replica ledger: what a segment's owner knows about the objects its
//! segment holds, so that a master that lost its memory (restart, failover)
//! can rebuild its metadata from the clients. The segments are the ground
//! truth for where the bytes are; the ledger says which bytes form which
//! committed object version.
//!
//! Protocol (messages here, rules in the master's recovery module and the
//! client's ledger):
//! - each client keeps one *ledger stream* connection to the master; the
//!   master pushes [`LedgerPush`] batches (commits and forgets for replicas
//!   in that client's segment) and the client answers [`LedgerAck`];
//! - the master acknowledges a write (PutEnd) or a removal only after the
//!   owners of every replica touched acked the matching ops, and returns
//!   freed space to its allocator only after the owner acked the forget;
//! - when a client (re)mounts on a master that does not know it, it reports
//!   its ledger ([`LedgerEntry`] chunks), and the master adopts each entry
//!   unless it already has a newer version of the key.
//!
//! Versions are assigned by the master: the greater of the last version + 1
//! and the wall clock in microseconds, so versions keep growing across master
//! restarts and failovers (as long as the masters' clocks are within the
//! failover time of each other).

use serde::{Deserialize, Serialize};

/// Allocation alignment of segments (the master's allocator granularity).
pub const ALLOC_ALIGN: u64 = 64;

/// Bytes a replica of `size` bytes occupies in its segment.
pub fn alloc_len(size: u64) -> u64 {
    size.div_ceil(ALLOC_ALIGN).saturating_mul(ALLOC_ALIGN)
}

/// One committed replica in the owner's segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// Object key.
    pub key: String,
    /// Version of the object (master-assigned, see the module doc).
    pub version: u64,
    /// Offset of the replica in the segment.
    pub offset: u64,
    /// Value size in bytes.
    pub size: u64,
    /// The object is hard-pinned.
    pub hard_pin: bool,
    /// Soft-pin deadline as Unix milliseconds (None: not soft-pinned).
    pub soft_pin_until_ms: Option<u64>,
}

impl LedgerEntry {
    /// A replica of `key` at `version`: `size` bytes at `offset`, with
    /// neither pin.
    pub fn unpinned(key: impl Into<String>, version: u64, offset: u64, size: u64) -> LedgerEntry {
        LedgerEntry {
            key: key.into(),
            version,
            offset,
            size,
            hard_pin: false,
            soft_pin_until_ms: None,
        }
    }
}

/// One change to an owner's ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerOp {
    /// A replica was committed: record it (replacing whatever overlaps it).
    Commit(LedgerEntry),
    /// A replica is gone (removed, evicted, overwritten, or about to be
    /// rewritten in place): drop the entry at `offset` if it has `version`.
    Forget {
        /// Offset of the replica.
        offset: u64,
        /// Version the entry must have to be dropped.
        version: u64,
    },
    /// The replica is evicted to the owner's disk tier: the owner copies
    /// the `size` bytes at `offset` (the object `key` at `version`) to its
    /// disk tier before acknowledging, then drops the entry as a
    /// [`LedgerOp::Forget`]. The space is reused only after the ack.
    Offload {
        /// Offset of the replica.
        offset: u64,
        /// The object's version.
        version: u64,
        /// The object's key.
        key: String,
        /// Value size in bytes.
        size: u64,
    },
    /// Write-through: the owner copies the `size` bytes at `offset` (the
    /// object `key` at `version`) to its disk tier and keeps the entry (the
    /// replica stays in memory). A later forget of the replica comes after
    /// this op, so its space is reused only once the copy is made.
    Persist {
        /// Offset of the replica.
        offset: u64,
        /// The object's version.
        version: u64,
        /// The object's key.
        key: String,
        /// Value size in bytes.
        size: u64,
    },
    /// Promotion: the owner reads its disk copy of the object `key` at
    /// `version` into the `size` bytes at `offset` of its segment (space the
    /// master allocated for it) and reports the result with
    /// `MasterRequest::Promoted` before acknowledging. The ledger entry is
    /// not recorded: the disk copy stays, so a master rebuilt from the
    /// ledgers still has the object.
    Promote {
        /// Offset of the new replica.
        offset: u64,
        /// The object's version.
        version: u64,
        /// The object's key.
        key: String,
        /// Value size in bytes.
        size: u64,
    },
    /// The object `key` at `version` is gone: the owner deletes its disk
    /// copy (a later version stays).
    DiskForget {
        /// The object's key.
        key: String,
        /// The version to delete.
        version: u64,
    },
    /// A copy or move task gives the object `key` at `version` a replica
    /// on this segment: the owner reads the object (from any replica) into
    /// the `size` bytes at `offset` of its segment (space the master
    /// allocated for it and hands to nobody else until the result is
    /// reported) and reports with `MasterRequest::Fetched`. It may
    /// acknowledge the op before the copy is made; the master records the
    /// replica in the ledger with a later `Commit` once it installs it.
    Fetch {
        /// Offset of the new replica.
        offset: u64,
        /// The object's version.
        version: u64,
        /// The object's key.
        key: String,
        /// Value size in bytes.
        size: u64,
    },
}

/// How an owner applied one [`LedgerOp::Fetch`]: `(key, version, offset,
/// copied)`.
pub type FetchResult = (String, u64, u64, bool);

/// How an owner applied one [`LedgerOp::Promote`]: `(key, version,
/// offset, copied)`.
pub type PromoteResult = (String, u64, u64, bool);

/// Master -> owner: ops to apply in order; `seq` is the sequence number of
/// the last op (per segment, counting from 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerPush {
    /// Sequence number of the last op in `ops`.
    pub seq: u64,
    /// The ops, oldest first.
    pub ops: Vec<LedgerOp>,
}

/// Owner -> master: every op up to `seq` is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerAck {
    /// Highest sequence number applied.
    pub seq: u64,
}

/// Entries per report chunk when a client remounts (keeps each frame small).
pub const REPORT_CHUNK: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_len_rounds_to_the_alignment() {
        assert_eq!(alloc_len(1), 64);
        assert_eq!(alloc_len(64), 64);
        assert_eq!(alloc_len(65), 128);
        assert_eq!(alloc_len(0), 0);
        assert_eq!(alloc_len(u64::MAX), u64::MAX);
    }
}
