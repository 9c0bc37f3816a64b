//! `get_into_ranges`: buffer-major ranged reads. Every distinct key is looked
//! up once (one RPC per call); fragments are batched per source segment so
//! each owner gets one request (or one mapped memcpy pass) per call.

use crate::client::Client;
use crate::writes::seg_ref;
use mooncake_common::ErrorCode;
use mooncake_transfer::Op;
use std::collections::HashMap;
use std::time::Instant;

const INVALID: i64 = ErrorCode::InvalidParams as i64;

/// Result shape mirroring `dst_offsets`, filled with one value.
fn filled(dst: &[Vec<Vec<u64>>], v: i64) -> Vec<Vec<Vec<i64>>> {
    dst.iter()
        .map(|g| g.iter().map(|f| vec![v; f.len()]).collect())
        .collect()
}

impl Client {
    /// Buffer-major ranged reads (spec §2.5 `get_into_ranges`). Destinations
    /// must lie in a registered region; results mirror `dst_offsets`.
    ///
    /// # Safety
    /// Registered regions must stay valid (the caller registered them).
    #[allow(clippy::type_complexity)]
    pub unsafe fn get_into_ranges(
        &self,
        buffer_ptrs: &[usize],
        keys: &[Vec<String>],
        dst_offsets: &[Vec<Vec<u64>>],
        src_offsets: &[Vec<Vec<u64>>],
        sizes: &[Vec<Vec<u64>>],
    ) -> Vec<Vec<Vec<i64>>> {
        let n = buffer_ptrs.len();
        if keys.len() != n || dst_offsets.len() != n || src_offsets.len() != n || sizes.len() != n {
            let mut out = filled(&dst_offsets[..dst_offsets.len().min(n)], INVALID);
            out.resize(n, Vec::new());
            return out;
        }
        let mut results = filled(dst_offsets, 0);
        // Distinct keys that have at least one well-formed group.
        let mut key_index: HashMap<&str, usize> = HashMap::new();
        let mut uniq: Vec<String> = Vec::new();
        let mut rooms: Vec<Option<usize>> = Vec::with_capacity(n);
        for i in 0..n {
            let room = self.regions.room_from(buffer_ptrs[i]);
            rooms.push(room);
            for j in 0..dst_offsets[i].len() {
                let ok_shape = j < keys[i].len()
                    && j < src_offsets[i].len()
                    && j < sizes[i].len()
                    && src_offsets[i][j].len() == dst_offsets[i][j].len()
                    && sizes[i][j].len() == dst_offsets[i][j].len();
                if room.is_none() || !ok_shape {
                    results[i][j].iter_mut().for_each(|r| *r = INVALID);
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
        // Choose one replica per key; batch ops per source segment.
        struct Batch<'a> {
            seg: &'a mooncake_common::proto::ReplicaLoc,
            ops: Vec<Op>,
            slots: Vec<(usize, usize, usize)>,
        }
        let mut batches: HashMap<&str, Batch> = HashMap::new();
        let chosen: Vec<Option<&mooncake_common::proto::ReplicaLoc>> = lk
            .infos
            .iter()
            .map(|i| {
                i.as_ref()
                    .ok()
                    .and_then(|info| self.ordered(info).first().copied())
            })
            .collect();
        for i in 0..n {
            let Some(room) = rooms[i] else { continue };
            for j in 0..dst_offsets[i].len() {
                if results[i][j].first() == Some(&INVALID) {
                    continue;
                }
                let Some(&ki) = key_index.get(keys[i][j].as_str()) else {
                    continue;
                };
                let info = match &lk.infos[ki] {
                    Ok(info) => info,
                    Err(e) => {
                        results[i][j].iter_mut().for_each(|r| *r = e.code() as i64);
                        continue;
                    }
                };
                let Some(rep) = chosen[ki] else {
                    results[i][j]
                        .iter_mut()
                        .for_each(|r| *r = ErrorCode::InvalidReplica.code() as i64);
                    continue;
                };
                for k in 0..dst_offsets[i][j].len() {
                    let (d, s, len) = (dst_offsets[i][j][k], src_offsets[i][j][k], sizes[i][j][k]);
                    if len == 0 {
                        results[i][j][k] = 0;
                        continue;
                    }
                    let dst_ok = d.checked_add(len).is_some_and(|e| e <= room as u64);
                    let src_ok = s.checked_add(len).is_some_and(|e| e <= info.size);
                    if !dst_ok || !src_ok {
                        results[i][j][k] = INVALID;
                        continue;
                    }
                    let b = batches
                        .entry(rep.segment_uuid.as_str())
                        .or_insert_with(|| Batch {
                            seg: rep,
                            ops: Vec::new(),
                            slots: Vec::new(),
                        });
                    b.ops.push(Op {
                        seg_offset: rep.offset + s,
                        local_ptr: buffer_ptrs[i] + d as usize,
                        len,
                    });
                    b.slots.push((i, j, k));
                    results[i][j][k] = len as i64;
                }
            }
        }
        for b in batches.values() {
            match self.engine.read(&seg_ref(b.seg), &b.ops) {
                Ok(path) => {
                    let bytes: u64 = b.ops.iter().map(|o| o.len).sum();
                    self.count_read(path, bytes);
                }
                Err(e) => {
                    tracing::warn!(segment = %b.seg.segment_name, error = %e, "ranged read failed");
                    for &(i, j, k) in &b.slots {
                        results[i][j][k] = e.code() as i64;
                    }
                }
            }
        }
        self.read_finished(lk.ticket);
        if Instant::now() > lk.deadline {
            for b in batches.values() {
                for &(i, j, k) in &b.slots {
                    results[i][j][k] = ErrorCode::LeaseExpired.code() as i64;
                }
            }
        }
        results
    }
}
