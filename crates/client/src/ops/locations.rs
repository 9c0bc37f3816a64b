//! Public location accessors for callers that cache replica locations
//! (EngramStore): one batched replica query returning the preferred
//! replica per key with its lease deadline, and raw reads against a
//! cached replica.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::ops::writes::seg_ref;
use mooncake_common::proto::ReplicaLoc;
use mooncake_common::ErrorCode;
use mooncake_transfer::{Op, Path, Stores};
use std::time::{Duration, Instant};

/// Where one object lives: its size and the replica the path rule prefers
/// (own segment, then same-host mapped segment, then a TCP owner).
#[derive(Debug, Clone)]
pub struct ObjectLocation {
    /// Object size in bytes.
    pub size: u64,
    /// The preferred replica.
    pub replica: ReplicaLoc,
    /// The path a read of `replica` takes first.
    pub path: Path,
}

/// Result of [`Client::lookup_locations`].
#[derive(Debug, Clone)]
pub struct Locations {
    /// One entry per key, in order.
    pub items: Vec<Result<ObjectLocation>>,
    /// When the granted leases run out.
    pub deadline: Instant,
    /// The lease length the master granted.
    pub lease_ttl: Duration,
}

impl Client {
    /// One batched replica query for `keys` (grants leases); picks the
    /// preferred replica per key. The caller may read the locations until
    /// the lease runs out: the lookup is tracked as a read for that long,
    /// so an upsert or removal meanwhile keeps these replicas allocated.
    pub fn lookup_locations(&self, keys: &[String]) -> Locations {
        let t0 = Instant::now();
        let lk = self.lookup(keys, true);
        let ttl = lk.deadline.saturating_duration_since(t0);
        let items = lk
            .infos
            .into_iter()
            .map(|i| {
                let info = i?;
                let rep = self
                    .ordered(&info)
                    .first()
                    .map(|r| (*r).clone())
                    .ok_or_else(|| Error::from(ErrorCode::InvalidReplica))?;
                let path = self.data_path.preferred_path(&seg_ref(&rep));
                Ok(ObjectLocation {
                    size: info.size,
                    replica: rep,
                    path,
                })
            })
            .collect();
        Locations {
            items,
            deadline: lk.deadline,
            lease_ttl: ttl,
        }
    }

    /// Copy `ops` (segment offsets are absolute in the replica's segment)
    /// from `replica` into local memory: one memcpy pass or one TCP request.
    /// Counts the bytes in the read statistics.
    ///
    /// # Safety
    /// Every `op.local_ptr..+len` must be writable for the duration of the call.
    pub unsafe fn read_ops(&self, replica: &ReplicaLoc, ops: &[Op]) -> Result<Path> {
        let total: u64 = ops.iter().map(|o| o.len).sum();
        let stores = Stores::for_bytes(total);
        // SAFETY: the caller vouches for every destination.
        let path = unsafe { self.data_path.read(&seg_ref(replica), ops, stores)? };
        self.count_read(path, total);
        Ok(path)
    }

    /// Incremented by every remove/upsert issued through this client; a
    /// location cache compares it to detect its own client's mutations.
    pub fn mutation_epoch(&self) -> u64 {
        self.mutations.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn bump_mutations(&self) {
        self.mutations
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// One replica of an object as upstream's `Replica::Descriptor` describes
/// it. Only complete replicas are listed: the master hands out nothing else.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ReplicaDesc {
    /// A copy in a segment's memory.
    Memory {
        /// Value size in bytes.
        size: u64,
        /// Address of the value in its owner's address space.
        buffer_address: u64,
        /// The owner's data endpoint (`host:port`).
        transport_endpoint: String,
    },
    /// A copy in the disk tier of the process that owns `segment_name`
    /// (upstream's local-disk replica).
    LocalDisk {
        /// Value size in bytes.
        object_size: u64,
        /// The owner's data endpoint, which serves the copy.
        transport_endpoint: String,
    },
}

impl Client {
    /// The replicas of each key, in the order a read prefers them (own
    /// process, same host, other hosts), from one replica query that takes
    /// no read lease. A key with no memory replica lists its disk copy.
    /// A missing key is OBJECT_NOT_FOUND in its place.
    pub fn replica_descs(&self, keys: &[String]) -> Vec<Result<Vec<ReplicaDesc>>> {
        self.lookup(keys, false)
            .infos
            .into_iter()
            .map(|info| {
                let info = info?;
                let mut out: Vec<ReplicaDesc> = self
                    .ordered(&info)
                    .into_iter()
                    .map(|r| ReplicaDesc::Memory {
                        size: r.size,
                        buffer_address: r.base_addr.saturating_add(r.offset),
                        transport_endpoint: r.endpoint.to_string(),
                    })
                    .collect();
                if let Some(d) = &info.disk {
                    out.push(ReplicaDesc::LocalDisk {
                        object_size: info.size,
                        transport_endpoint: d.endpoint.clone(),
                    });
                }
                Ok(out)
            })
            .collect()
    }
}
