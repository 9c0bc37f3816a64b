//! The store's face: its data path. [`DataPath`] picks and runs the path of
//! each transfer (in-process memcpy, same-host mapped memcpy, or TCP to the
//! owner's data server, large transfers split across parallel
//! connections); [`data_server`] serves this client's segment to the
//! others, in the format of [`data_proto`]; [`tcp_pool`] is its client side.
//!
//! The store owns the memory it serves (its [`Segment`]s), so a reader on
//! the same host maps the owner's segment once and copies with memcpy
//! ([`crate::same_host::mapping`]). Everything here uses the layers below
//! (`net`, `same_host`, `segment`, `op`, `workers`, `hostid`) and nothing
//! of the upstream-compatible engine; nothing below uses this module.

pub mod data_proto;
pub mod data_server;
pub(crate) mod error;
pub mod tcp_pool;

use crate::net::streams::{tcp_parts, tcp_streams, TCP_PART_MIN_PACED};
pub use crate::op::{Op, Rows, Stores};
use crate::same_host::mapping::{MapLookup, MappingCache};
use crate::segment::{local_segment, FreshWrite, Segment};
use crate::workers;
use error::{Error, Result};
use mooncake_common::{AuthKey, ErrorCode, WriteTicket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tcp_pool::TcpPool;

/// Which data path a transfer took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The segment is this process's own: `memcpy`.
    Local,
    /// Another process on this host: `memcpy` through a shared mapping.
    SameHost,
    /// Another host (or mapping unavailable): the owner's data server.
    Tcp,
}

/// Where a segment lives (from the master's replica descriptor).
#[derive(Debug, Clone, Copy)]
pub struct SegmentRef<'a> {
    /// Id of the segment's memory.
    pub uuid: &'a str,
    /// The owner's data server (`host:port`).
    pub endpoint: &'a str,
    /// The owner's same-host identity.
    pub host_id: &'a str,
    /// The owner's mapping socket name.
    pub socket_name: &'a str,
    /// Segment size.
    pub size: u64,
    /// The master's grant for a write over TCP (with a cluster token).
    pub ticket: Option<&'a WriteTicket>,
}

/// Bytes above which a memcpy uses two threads.
const PAR_COPY: u64 = 8 << 20;

/// The store's data path: executes one client's transfers.
pub struct DataPath {
    host_id: String,
    same_host: bool,
    auth: Option<AuthKey>,
    /// Mappings this engine created (for `same_host_mappings`).
    pub mappings_created: AtomicU64,
}

impl Default for DataPath {
    fn default() -> Self {
        Self::new()
    }
}

fn env_is(name: &str, val: &str) -> bool {
    std::env::var(name)
        .map(|v| v.eq_ignore_ascii_case(val))
        .unwrap_or(false)
}

impl DataPath {
    /// Reads `MC_STORE_SAME_HOST` (auto|off) and `MC_FORCE_TCP` (1 disables the mapped path).
    pub fn new() -> Self {
        let same_host = !(env_is("MC_STORE_SAME_HOST", "off") || env_is("MC_FORCE_TCP", "1"));
        DataPath {
            host_id: crate::hostid::host_id(),
            same_host,
            auth: None,
            mappings_created: AtomicU64::new(0),
        }
    }

    /// Authenticate to peers (data servers, mapping servers) with the
    /// cluster token `key`.
    pub fn with_auth(mut self, key: Option<AuthKey>) -> Self {
        self.auth = key;
        self
    }

    /// This host's id.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    /// Whether segments on this host are reached by mapping their memory.
    pub fn maps_same_host(&self) -> bool {
        self.same_host
    }

    /// The path a transfer to this segment would try first (for replica choice).
    pub fn preferred_path(&self, seg: &SegmentRef) -> Path {
        if local_segment(seg.uuid).is_some() {
            Path::Local
        } else if self.same_host && seg.host_id == self.host_id {
            Path::SameHost
        } else {
            Path::Tcp
        }
    }

    fn memory_for(&self, seg: &SegmentRef) -> Result<Option<(Arc<Segment>, Path)>> {
        if let Some(s) = local_segment(seg.uuid) {
            return Ok(Some((s, Path::Local)));
        }
        if self.same_host && seg.host_id == self.host_id {
            let created = || {
                self.mappings_created.fetch_add(1, Ordering::Relaxed);
            };
            let cache = MappingCache::global();
            match cache.get(
                seg.uuid,
                seg.socket_name,
                seg.size,
                self.auth.as_ref(),
                created,
            ) {
                MapLookup::Mapped(s) => return Ok(Some((s, Path::SameHost))),
                MapLookup::OwnerDead => {
                    return Err(Error::new(
                        ErrorCode::TransferFail,
                        "same-host owner of the segment is gone",
                    )
                    .with_peer(seg.endpoint))
                }
                MapLookup::UseTcp => {}
            }
        }
        Ok(None)
    }

    /// Copy segment ranges into local memory; a copy through memory uses
    /// `stores`.
    ///
    /// # Safety
    /// Every `op.local_ptr..+len` must be writable.
    pub unsafe fn read(&self, seg: &SegmentRef, ops: &[Op], stores: Stores) -> Result<Path> {
        let sets: Vec<Rows> = ops.iter().map(|&o| Rows::single(o)).collect();
        // SAFETY: the same destinations, vouched for by our caller.
        unsafe { self.read_rows(seg, &sets, stores) }
    }

    /// Copy sets of segment rows into local memory ([`Rows`]); a copy
    /// through memory uses `stores`, a TCP read moves every row as a range.
    ///
    /// # Safety
    /// Every row's `local_ptr + i * local_stride .. + len` must be writable,
    /// and no two destination rows may overlap.
    pub unsafe fn read_rows(
        &self,
        seg: &SegmentRef,
        sets: &[Rows],
        stores: Stores,
    ) -> Result<Path> {
        crate::segment::note_use();
        if let Some((mem, path)) = self.memory_for(seg)? {
            let outside = || Error::new(ErrorCode::InvalidParams, "read range outside the segment");
            for r in sets {
                let span = r.seg_span().ok_or_else(outside)?;
                if r.bytes().is_none() || !mem.check_range(r.seg_offset, span) {
                    return Err(outside());
                }
            }
            for r in sets {
                let src = mem.base().wrapping_add(r.seg_offset as usize);
                if r.count == 1 {
                    // SAFETY: the range lies in the mapping (checked above)
                    // and the caller guarantees the destination is writable.
                    unsafe { copy(src, r.local_ptr as *mut u8, r.len, stores) };
                } else {
                    // SAFETY: every row lies in the mapping (its span was
                    // checked above) and the caller guarantees the
                    // destination rows are writable and disjoint.
                    unsafe {
                        mooncake_common::memcopy::copy_rows(
                            src,
                            r.local_ptr as *mut u8,
                            r.len as usize,
                            r.count as usize,
                            r.seg_stride as usize,
                            r.local_stride as usize,
                            stores == Stores::Streaming,
                        )
                    };
                }
            }
            return Ok(path);
        }
        let ops: Vec<Op> = sets.iter().flat_map(|r| r.ops()).collect();
        let key = self.auth.as_ref();
        tcp_parallel(seg.endpoint, &ops, |part| {
            // SAFETY: `part` is a piece of the caller's writable destinations.
            unsafe { TcpPool::global().read(seg.endpoint, seg.uuid, part, key, stores) }
        })?;
        Ok(Path::Tcp)
    }

    /// Copy local memory into segment ranges; a copy through memory uses
    /// `stores`.
    ///
    /// # Safety
    /// Every `op.local_ptr..+len` must be readable.
    pub unsafe fn write(&self, seg: &SegmentRef, ops: &[Op], stores: Stores) -> Result<Path> {
        crate::segment::note_use();
        if let Some((mem, path)) = self.memory_for(seg)? {
            if ops.iter().any(|o| !mem.check_range(o.seg_offset, o.len)) {
                return Err(Error::new(
                    ErrorCode::InvalidParams,
                    "write range outside the segment",
                ));
            }
            // Ops that continue one another in the segment (the buffers of
            // one multi-buffer value) are written as one run: one residency
            // check and one vectored pwrite, or one map_range.
            let mut pieces: Vec<(*const u8, u64)> = Vec::new();
            for run in contiguous_runs(ops) {
                let start = run[0].seg_offset;
                let total: u64 = run.iter().map(|o| o.len).sum();
                pieces.clear();
                pieces.extend(run.iter().map(|o| (o.local_ptr as *const u8, o.len)));
                // SAFETY: every op's range lies in the mapping (checked
                // above), so does the run they tile; the caller guarantees
                // the sources are readable.
                unsafe {
                    match mem.write_fresh_run(start, &pieces) {
                        FreshWrite::Written => continue,
                        // Never-written pages: the stores fault them in.
                        FreshWrite::CopyFresh => {}
                        // Pages in memory but not mapped here fault in 16 at
                        // a time instead of one per store.
                        FreshWrite::CopyMapped => mem.map_range(start, total),
                    }
                    for o in run {
                        copy(
                            o.local_ptr as *const u8,
                            mem.base().add(o.seg_offset as usize),
                            o.len,
                            stores,
                        );
                    }
                }
            }
            return Ok(path);
        }
        let key = self.auth.as_ref();
        tcp_parallel(seg.endpoint, ops, |part| {
            // SAFETY: `part` is a piece of the caller's readable sources.
            unsafe { TcpPool::global().write(seg.endpoint, seg.uuid, part, key, seg.ticket) }
        })?;
        Ok(Path::Tcp)
    }
}

/// `ops` cut into maximal runs whose segment ranges follow one another
/// (each op starting where the previous one ended), in order.
fn contiguous_runs(ops: &[Op]) -> impl Iterator<Item = &[Op]> {
    ops.chunk_by(|a, b| a.seg_offset.checked_add(a.len) == Some(b.seg_offset))
}

/// A copy with `stores`, using two threads for large copies.
///
/// # Safety
/// `src..+len` must be readable, `dst..+len` writable, and the two must
/// not overlap.
unsafe fn copy(src: *const u8, dst: *mut u8, len: u64, stores: Stores) {
    use mooncake_common::memcopy;
    let n = len as usize;
    let stream = stores == Stores::Streaming;
    if len < PAR_COPY {
        // SAFETY: the caller's contract.
        unsafe { memcopy::copy(src, dst, n, stream) };
        return;
    }
    let half = (n / 2) & !63;
    let (src, dst) = (src as usize, dst as usize);
    let halves = [(0, half), (half, n - half)];
    workers::run_all(&halves, 2, |&(at, len)| {
        // SAFETY: disjoint halves of the caller's valid, disjoint ranges.
        unsafe { memcopy::copy((src + at) as *const u8, (dst + at) as *mut u8, len, stream) }
    });
}

/// Split a large batch to the peer at `endpoint` into up to
/// `tcp_streams()` parts of similar byte size (see [`tcp_parts`]) and run
/// them in parallel.
fn tcp_parallel(
    endpoint: &str,
    ops: &[Op],
    run: impl Fn(&[Op]) -> Result<()> + Sync,
) -> Result<()> {
    let total: u64 = ops.iter().map(|o| o.len).sum();
    if total < 2 * TCP_PART_MIN_PACED {
        // Too small to split under either rule.
        return run(ops);
    }
    let paced = TcpPool::global().paced(endpoint);
    let parts_n = tcp_parts(total, paced, tcp_streams());
    if parts_n <= 1 {
        return run(ops);
    }
    let parts = Op::split(
        ops,
        usize::try_from(parts_n).unwrap_or(usize::MAX),
        u64::MAX,
    );
    // The calling thread runs parts too, and runs a part a helper has not
    // claimed yet rather than wait for it.
    let workers = parts.len();
    workers::run_all(&parts, workers, |p| run(p))
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(seg_offset: u64, len: u64) -> Op {
        Op {
            seg_offset,
            local_ptr: 0,
            len,
        }
    }

    #[test]
    fn runs_follow_segment_offsets() {
        let ops = [
            op(0, 10),
            op(10, 5),
            op(15, 1),
            op(100, 4),
            op(50, 50),
            op(104, 0),
            op(104, 8),
            op(u64::MAX - 1, 1),
            op(u64::MAX, 1),
        ];
        let lens: Vec<usize> = contiguous_runs(&ops).map(<[Op]>::len).collect();
        // [0,10)+[10,15)+[15,16) | [100,104) | [50,100) | [104,104)+[104,112) | ...
        assert_eq!(lens, vec![3, 1, 1, 2, 2]);
        assert_eq!(contiguous_runs(&[]).count(), 0);
    }
}
