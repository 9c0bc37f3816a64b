//! `get_into_ranges`: buffer-major ranged reads, with upstream's per-range
//! failure codes. Every distinct key is looked
//! up once (one RPC per call); fragments are batched per source segment so
//! each owner gets one request (or one mapped memcpy pass) per call.
//!
//! The copies run through [`Client::read_ranges`], the batched ranged read
//! tensor IO lowers onto as well: one replica per object by path preference,
//! ops batched per owner segment (owners in parallel, big local groups over
//! several threads), and a failed owner falls back to each object's other
//! replicas.
//!
//! The result always mirrors the shape of `dst_offsets`. Failures, from
//! the whole call down to one fragment: lists of different lengths fail
//! every fragment (the outer list keeps one entry per buffer); a buffer
//! whose key/offset/size lists differ in length from its `dst_offsets`, or
//! that does not start inside a registered region, fails all its
//! fragments; a group whose three fragment lists differ in length, or
//! whose key is empty, fails that group; a missing key fails its groups
//! with the master's code; a fragment that ends past the registered
//! region or past the object fails alone; a size-0 fragment reads 0.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::ops::writes::seg_ref;
use crate::parallel::{group_tasks, run_all};
use mooncake_common::proto::{ObjectInfo, ReplicaLoc};
use mooncake_common::ErrorCode;
use mooncake_transfer::{Path, Rows, Stores};
use std::collections::HashMap;
use std::time::Instant;

/// Per buffer, per key group, per fragment: the bytes read or the failure.
pub type Ranges = Vec<Vec<Vec<Result<u64>>>>;

/// `err` in every fragment slot of `dst_offsets` (one outer entry per
/// buffer of `n_buffers`; a buffer with no `dst_offsets` entry has no
/// groups) — the answer of a call that failed as a whole.
pub fn ranges_failed(dst_offsets: &[Vec<Vec<u64>>], n_buffers: usize, err: &Error) -> Ranges {
    (0..n_buffers)
        .map(|i| {
            dst_offsets
                .get(i)
                .map(|groups| {
                    groups
                        .iter()
                        .map(|f| vec![Err(err.clone()); f.len()])
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// `count` ranged copies of `len` bytes out of a located object, the `i`-th
/// from `src + i * src_stride` to `dst + i * dst_stride` (the unit of
/// [`Client::read_ranges`]; most are one range, [`RangeOp::ONE_ROW`]).
#[derive(Clone, Copy)]
pub(crate) struct RangeOp {
    /// Index into the object table of the call.
    pub(crate) key: usize,
    /// Offset of the first row in the object.
    pub(crate) src: u64,
    /// Destination address of the first row.
    pub(crate) dst: usize,
    /// Bytes per row.
    pub(crate) len: u64,
    /// Rows.
    pub(crate) count: u64,
    /// Bytes between rows in the object.
    pub(crate) src_stride: u64,
    /// Bytes between rows at the destination.
    pub(crate) dst_stride: u64,
}

impl RangeOp {
    /// The row fields of a single range (`..RangeOp::ONE_ROW` after the
    /// key, offsets and length).
    pub(crate) const ONE_ROW: RangeOp = RangeOp {
        key: 0,
        src: 0,
        dst: 0,
        len: 0,
        count: 1,
        src_stride: 0,
        dst_stride: 0,
    };

    /// The rows against a replica at `base` of its segment.
    fn rows_at(&self, base: u64) -> Rows {
        Rows {
            seg_offset: base + self.src,
            local_ptr: self.dst,
            len: self.len,
            count: self.count,
            seg_stride: self.src_stride,
            local_stride: self.dst_stride,
        }
    }

    /// Bytes copied.
    fn bytes(&self) -> u64 {
        self.len.saturating_mul(self.count)
    }
}

fn fail_all(slots: &mut [Result<u64>], err: &Error) {
    slots.iter_mut().for_each(|r| *r = Err(err.clone()));
}

impl Client {
    /// Buffer-major ranged reads; see the module doc for the rules.
    /// Destinations must lie in a region registered with
    /// [`Client::register_buffer`].
    ///
    /// # Safety
    /// Registered regions must stay valid and writable (the caller
    /// registered them).
    pub unsafe fn get_into_ranges(
        &self,
        buffer_ptrs: &[usize],
        keys: &[Vec<String>],
        dst_offsets: &[Vec<Vec<u64>>],
        src_offsets: &[Vec<Vec<u64>>],
        sizes: &[Vec<Vec<u64>>],
    ) -> Ranges {
        let n = buffer_ptrs.len();
        if keys.len() != n || dst_offsets.len() != n || src_offsets.len() != n || sizes.len() != n {
            let e =
                Error::invalid("buffer_ptrs, all_keys and the offset/size lists differ in length");
            return ranges_failed(dst_offsets, n, &e);
        }
        let mut results: Ranges = dst_offsets
            .iter()
            .map(|g| g.iter().map(|f| vec![Ok(0); f.len()]).collect())
            .collect();
        let bad_buffer = Error::invalid("a buffer's key/offset/size lists differ in length");
        let unregistered = Error::invalid("buffer is not inside a registered region");
        let bad_group = Error::invalid("empty key, or fragment lists differ in length");
        // Distinct keys of the groups that are well formed.
        let mut key_index: HashMap<&str, usize> = HashMap::new();
        let mut uniq: Vec<String> = Vec::new();
        let mut rooms: Vec<Option<usize>> = Vec::with_capacity(n);
        for i in 0..n {
            let groups = dst_offsets[i].len();
            if keys[i].len() != groups || src_offsets[i].len() != groups || sizes[i].len() != groups
            {
                results[i].iter_mut().for_each(|g| fail_all(g, &bad_buffer));
                rooms.push(None);
                continue;
            }
            let room = self.regions.room_from(buffer_ptrs[i]);
            rooms.push(room);
            if room.is_none() {
                results[i]
                    .iter_mut()
                    .for_each(|g| fail_all(g, &unregistered));
                continue;
            }
            for j in 0..groups {
                let d = dst_offsets[i][j].len();
                if keys[i][j].is_empty() || src_offsets[i][j].len() != d || sizes[i][j].len() != d {
                    fail_all(&mut results[i][j], &bad_group);
                    continue;
                }
                let k = keys[i][j].as_str();
                if !key_index.contains_key(k) {
                    key_index.insert(k, uniq.len());
                    uniq.push(k.to_string());
                }
            }
        }
        if uniq.is_empty() {
            return results;
        }
        let lk = self.lookup(&uniq, true);
        // Fragments become ranges of located objects, read in one batch per
        // owner segment (the path tensor reads are lowered onto).
        let mut infos: Vec<&ObjectInfo> = Vec::new();
        let mut info_of: Vec<Option<usize>> = Vec::with_capacity(lk.infos.len());
        for info in &lk.infos {
            match info {
                Ok(x) if !x.replicas.is_empty() || x.disk.is_some() => {
                    info_of.push(Some(infos.len()));
                    infos.push(x);
                }
                _ => info_of.push(None),
            }
        }
        let mut ops: Vec<RangeOp> = Vec::new();
        let mut slots: Vec<(usize, usize, usize)> = Vec::new();
        let out_of_bounds = Error::invalid("fragment outside the registered buffer or the object");
        for i in 0..n {
            let Some(room) = rooms[i] else { continue };
            for j in 0..dst_offsets[i].len() {
                let Some(&ki) = key_index.get(keys[i][j].as_str()) else {
                    continue;
                };
                if results[i][j].first().is_some_and(|r| r.is_err()) {
                    continue;
                }
                let info = match &lk.infos[ki] {
                    Ok(info) => info,
                    Err(e) => {
                        fail_all(&mut results[i][j], e);
                        continue;
                    }
                };
                let Some(at) = info_of[ki] else {
                    fail_all(&mut results[i][j], &ErrorCode::InvalidReplica.into());
                    continue;
                };
                for k in 0..dst_offsets[i][j].len() {
                    let (d, s, len) = (dst_offsets[i][j][k], src_offsets[i][j][k], sizes[i][j][k]);
                    if len == 0 {
                        continue;
                    }
                    let dst_ok = d.checked_add(len).is_some_and(|e| e <= room as u64);
                    let src_ok = s.checked_add(len).is_some_and(|e| e <= info.size);
                    if !dst_ok || !src_ok {
                        results[i][j][k] = Err(out_of_bounds.clone());
                        continue;
                    }
                    ops.push(RangeOp {
                        key: at,
                        src: s,
                        dst: buffer_ptrs[i] + d as usize,
                        len,
                        ..RangeOp::ONE_ROW
                    });
                    slots.push((i, j, k));
                    results[i][j][k] = Ok(len);
                }
            }
        }
        // SAFETY: every destination lies inside a registered region (checked
        // above), which the caller keeps valid.
        let errs = unsafe { self.read_ranges(&infos, &ops) };
        for (e, &(i, j, k)) in errs.iter().zip(&slots) {
            if let Some(e) = e {
                results[i][j][k] = Err(e.clone());
            }
        }
        self.read_finished(lk.ticket);
        if Instant::now() > lk.deadline {
            let e = Error::from(ErrorCode::LeaseExpired);
            for &(i, j, k) in &slots {
                results[i][j][k] = Err(e.clone());
            }
        }
        results
    }
}

/// Disk-copy reads of one call run on at most this many threads.
const DISK_READERS: usize = 4;

impl Client {
    /// Read `len` bytes of `info`'s disk copy from byte `src` into `dst`:
    /// from this client's tier, or from the owner's over TCP.
    ///
    /// # Safety
    /// `dst..dst+len` must be writable for the duration of the call.
    unsafe fn read_disk_copy(
        &self,
        info: &ObjectInfo,
        src: u64,
        dst: usize,
        len: u64,
    ) -> std::result::Result<(), ErrorCode> {
        let Some(loc) = info.disk.as_ref() else {
            return Err(ErrorCode::InvalidReplica);
        };
        let Ok(n) = usize::try_from(len) else {
            return Err(ErrorCode::InvalidParams);
        };
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the caller vouches for `dst..dst+len`.
        let buf = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, n) };
        match &self.disk {
            Some(d) if loc.segment_name == self.desc.name => {
                d.read_local(loc, src, buf)?;
                self.count_read(Path::Local, len);
            }
            _ => {
                crate::durability::disk::read_remote(self.auth.as_ref(), loc, src, buf)?;
                self.count_read(Path::Tcp, len);
            }
        }
        Ok(())
    }

    /// Read `ops` (ranges of the objects `infos[op.key]`): the first replica
    /// of each object by path preference, ops batched per owner segment,
    /// owners in parallel; a failed owner falls back to each object's other
    /// replicas. An object with only a disk copy is read from its owner's
    /// disk tier (this client's own directly), a few ops in parallel.
    /// Returns per op `None` or the error.
    ///
    /// # Safety
    /// Every `op.dst..+len` must be writable for the duration of the call.
    pub(crate) unsafe fn read_ranges(
        &self,
        infos: &[&ObjectInfo],
        ops: &[RangeOp],
    ) -> Vec<Option<Error>> {
        let mut errs: Vec<Option<Error>> = vec![None; ops.len()];
        let chosen: Vec<Option<&ReplicaLoc>> = infos
            .iter()
            .map(|i| self.ordered(i).first().copied())
            .collect();
        struct Group<'a> {
            rep: &'a ReplicaLoc,
            ops: Vec<Rows>,
            idx: Vec<usize>,
        }
        let mut groups: Vec<Group> = Vec::new();
        // The group of each object's segment, found once per object (a
        // tensor read can have many thousands of ops over a few objects).
        let mut by_seg: HashMap<&str, usize> = HashMap::new();
        let group_of: Vec<Option<usize>> = chosen
            .iter()
            .map(|c| {
                c.map(|rep| {
                    *by_seg.entry(&*rep.segment_uuid).or_insert_with(|| {
                        groups.push(Group {
                            rep,
                            ops: Vec::new(),
                            idx: Vec::new(),
                        });
                        groups.len() - 1
                    })
                })
            })
            .collect();
        let mut from_disk: Vec<usize> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let (Some(rep), Some(g)) = (chosen[op.key], group_of[op.key]) else {
                if infos[op.key].disk.is_some() {
                    from_disk.push(i);
                } else {
                    errs[i] = Some(ErrorCode::InvalidReplica.into());
                }
                continue;
            };
            groups[g].ops.push(op.rows_at(rep.offset));
            groups[g].idx.push(i);
        }
        // Spread big local/same-host groups over several threads; a TCP group
        // is one request (the engine splits it over parallel connections).
        if !from_disk.is_empty() {
            let workers = from_disk.len().min(DISK_READERS);
            let res = run_all(
                &from_disk,
                workers,
                |&i| -> std::result::Result<(), ErrorCode> {
                    let op = ops[i];
                    for row in 0..op.count {
                        let (src, dst) = (
                            op.src + row * op.src_stride,
                            op.dst + (row * op.dst_stride) as usize,
                        );
                        // SAFETY: destinations vouched for by our caller.
                        unsafe { self.read_disk_copy(infos[op.key], src, dst, op.len) }?;
                    }
                    Ok(())
                },
            );
            for (&i, r) in from_disk.iter().zip(res) {
                errs[i] = r.err().map(Error::from);
            }
        }
        let (tasks, workers) = group_tasks(groups.iter().map(|g| {
            let local = self.data_path.preferred_path(&seg_ref(g.rep)) != Path::Tcp;
            (g.ops.as_slice(), local)
        }));
        let results = run_all(&tasks, workers, |t| -> Result<()> {
            let g = &groups[t.group];
            // SAFETY: destinations vouched for by our caller.
            let path = unsafe { self.data_path.read_rows(&seg_ref(g.rep), &t.ops, t.stores) }?;
            self.count_read(path, t.ops.iter().map(|o| o.len * o.count).sum());
            Ok(())
        });
        let mut failed_groups: Vec<Option<Error>> = vec![None; groups.len()];
        for (t, r) in tasks.iter().zip(results) {
            if let Err(e) = r {
                tracing::info!(segment = %groups[t.group].rep.segment_name, error = %e, "batched read failed; trying other replicas");
                failed_groups[t.group] = Some(e);
            }
        }
        for (gi, g) in groups.iter().enumerate() {
            let Some(first) = &failed_groups[gi] else {
                continue;
            };
            for &i in &g.idx {
                let op = ops[i];
                let mut last = first.clone();
                let mut ok = false;
                for r in self.ordered(infos[op.key]) {
                    if r.segment_uuid == g.rep.segment_uuid {
                        continue;
                    }
                    let one = [op.rows_at(r.offset)];
                    // SAFETY: as above.
                    match unsafe { self.data_path.read_rows(&seg_ref(r), &one, Stores::Cached) } {
                        Ok(path) => {
                            self.count_read(path, op.bytes());
                            ok = true;
                            break;
                        }
                        Err(e) => last = e.into(),
                    }
                }
                if !ok {
                    errs[i] = Some(last);
                }
            }
        }
        errs
    }
}
