//! Write paths: staged puts (local-buffer capped), direct `*_from` puts and
//! their upsert forms. Each batch is one PutStart RPC, the replica writes,
//! then one PutEnd (and one PutRevoke for failures).

use crate::client::Client;
use mooncake_common::proto::{
    MasterRequest, MasterResponse, PutStartItem, ReplicaLoc, WriteConfig,
};
use mooncake_common::ErrorCode;
use mooncake_transfer::{Op, Path, SegmentRef};
use std::sync::atomic::Ordering;

/// Source of one value: (pointer, length) pieces, concatenated.
pub(crate) type Pieces = Vec<(usize, u64)>;

pub(crate) fn seg_ref(l: &ReplicaLoc) -> SegmentRef<'_> {
    SegmentRef {
        uuid: &l.segment_uuid,
        endpoint: &l.endpoint,
        host_id: &l.host_id,
        socket_name: &l.socket_name,
        size: l.segment_size,
    }
}

impl Client {
    pub(crate) fn count_write(&self, path: Path, n: u64) {
        let c = match path {
            Path::Local => &self.stats.bytes_written_local,
            Path::SameHost => &self.stats.bytes_written_same_host,
            Path::Tcp => &self.stats.bytes_written_tcp,
        };
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Write one value into every replica.
    unsafe fn write_replicas(&self, locs: &[ReplicaLoc], pieces: &Pieces) -> Result<(), ErrorCode> {
        if locs.is_empty() {
            return Err(ErrorCode::InvalidReplica);
        }
        for l in locs {
            let mut at = l.offset;
            let ops: Vec<Op> = pieces
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|&(p, n)| {
                    let o = Op {
                        seg_offset: at,
                        local_ptr: p,
                        len: n,
                    };
                    at += n;
                    o
                })
                .collect();
            let path = self.engine.write(&seg_ref(l), &ops)?;
            self.count_write(path, l.size);
        }
        Ok(())
    }

    /// PutStart + writes + PutEnd/PutRevoke for a batch; one code per key.
    pub(crate) unsafe fn put_items(
        &self,
        keys: &[String],
        values: &[Pieces],
        cfg: &WriteConfig,
        upsert: bool,
    ) -> Vec<i32> {
        self.put_items_ex(keys, values, cfg, upsert, false)
    }

    /// `put_items`; with `report_existing`, a key that already existed
    /// yields -705 instead of 0.
    pub(crate) unsafe fn put_items_ex(
        &self,
        keys: &[String],
        values: &[Pieces],
        cfg: &WriteConfig,
        upsert: bool,
        report_existing: bool,
    ) -> Vec<i32> {
        if upsert {
            self.bump_mutations();
        }
        let sizes: Vec<u64> = values.iter().map(|v| v.iter().map(|p| p.1).sum()).collect();
        let mut cfg = cfg.clone();
        cfg.writer_host_id = self.engine.host_id().to_string();
        let items = match self.rpc(MasterRequest::PutStart {
            keys: keys.to_vec(),
            sizes,
            config: cfg,
            upsert,
        }) {
            Ok(MasterResponse::PutStart(items)) if items.len() == keys.len() => items,
            Ok(MasterResponse::Err(e)) | Err(e) => return vec![e.code(); keys.len()],
            Ok(_) => return vec![ErrorCode::InternalError.code(); keys.len()],
        };
        let mut codes = vec![0i32; keys.len()];
        let mut done = Vec::new();
        let mut failed = Vec::new();
        // Segments of this process among the replicas: their ledgers are
        // updated here rather than through the master's push.
        let mut local_segments: Vec<String> = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            match item {
                PutStartItem::AlreadyExists => {
                    if report_existing {
                        codes[i] = ErrorCode::ObjectAlreadyExists.code();
                    }
                }
                PutStartItem::Err(e) => codes[i] = e.code(),
                PutStartItem::Write(locs) => match self.write_replicas(&locs, &values[i]) {
                    Ok(()) => {
                        for l in &locs {
                            if !local_segments.contains(&l.segment_name)
                                && crate::ledger::local(&l.segment_name).is_some()
                            {
                                local_segments.push(l.segment_name.clone());
                            }
                        }
                        done.push(keys[i].clone())
                    }
                    Err(e) => {
                        tracing::warn!(key = %keys[i], error = %e, "replica write failed; revoking put");
                        codes[i] = ErrorCode::TransferFail.code();
                        failed.push(keys[i].clone());
                    }
                },
            }
        }
        if !failed.is_empty() {
            let _ = self.rpc(MasterRequest::PutRevoke { keys: failed });
        }
        if !done.is_empty() {
            let ended = match self.rpc(MasterRequest::CommitEnd {
                keys: done.clone(),
                local_segments,
            }) {
                Ok(MasterResponse::Committed { ops }) => {
                    record_local(ops);
                    Ok(())
                }
                Ok(MasterResponse::Err(e)) | Err(e) => Err(e),
                Ok(_) => Err(ErrorCode::InternalError),
            };
            if let Err(e) = ended {
                for (i, k) in keys.iter().enumerate() {
                    if done.contains(k) {
                        codes[i] = e.code();
                    }
                }
            }
        }
        codes
    }

    /// Staged write of the concatenation of `parts` (put/put_parts/upsert/upsert_parts).
    /// Needs local-buffer space for the total size (else -600). Empty total -> -600.
    pub fn put_parts(&self, key: &str, parts: &[&[u8]], cfg: &WriteConfig, upsert: bool) -> i32 {
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if key.is_empty() || total == 0 {
            return ErrorCode::InvalidParams.code();
        }
        let Some(_r) = self.staging.reserve(total) else {
            return ErrorCode::InvalidParams.code();
        };
        let pieces: Pieces = parts
            .iter()
            .map(|p| (p.as_ptr() as usize, p.len() as u64))
            .collect();
        // SAFETY: the slices are borrowed for the duration of the call.
        unsafe { self.put_items(&[key.to_string()], &[pieces], cfg, upsert)[0] }
    }

    /// Staged batch write (put_batch/upsert_batch): 0 or the first failing code.
    pub fn put_batch(
        &self,
        keys: &[String],
        values: &[&[u8]],
        cfg: &WriteConfig,
        upsert: bool,
    ) -> i32 {
        if keys.is_empty() && values.is_empty() {
            return 0;
        }
        if keys.len() != values.len()
            || values.iter().any(|v| v.is_empty())
            || keys.iter().any(|k| k.is_empty())
        {
            return ErrorCode::InvalidParams.code();
        }
        let total: u64 = values.iter().map(|v| v.len() as u64).sum();
        let Some(_r) = self.staging.reserve(total) else {
            return ErrorCode::InvalidParams.code();
        };
        let pieces: Vec<Pieces> = values
            .iter()
            .map(|v| vec![(v.as_ptr() as usize, v.len() as u64)])
            .collect();
        // SAFETY: the slices are borrowed for the duration of the call.
        let codes = unsafe { self.put_items(keys, &pieces, cfg, upsert) };
        codes.into_iter().find(|c| *c != 0).unwrap_or(0)
    }

    /// Direct write from caller memory (put_from/upsert_from). `size == 0` -> 0, nothing stored.
    ///
    /// # Safety
    /// `ptr..ptr+size` must be readable for the duration of the call.
    pub unsafe fn put_from(
        &self,
        key: &str,
        ptr: usize,
        size: usize,
        cfg: &WriteConfig,
        upsert: bool,
    ) -> i32 {
        if size == 0 {
            return 0;
        }
        if key.is_empty() || ptr == 0 {
            return ErrorCode::InvalidParams.code();
        }
        self.put_items(&[key.to_string()], &[vec![(ptr, size as u64)]], cfg, upsert)[0]
    }

    /// Direct batch write; one code per item (a size of 0 -> -600 for that item).
    ///
    /// # Safety
    /// Every `ptrs[i]..+sizes[i]` must be readable for the duration of the call.
    pub unsafe fn batch_put_from(
        &self,
        keys: &[String],
        ptrs: &[usize],
        sizes: &[usize],
        cfg: &WriteConfig,
        upsert: bool,
    ) -> Vec<i32> {
        if keys.len() != ptrs.len() || keys.len() != sizes.len() {
            return vec![ErrorCode::InvalidParams.code(); keys.len()];
        }
        let mut codes = vec![0i32; keys.len()];
        let mut idx = Vec::new();
        for i in 0..keys.len() {
            if sizes[i] == 0 || ptrs[i] == 0 || keys[i].is_empty() {
                codes[i] = ErrorCode::InvalidParams.code();
            } else {
                idx.push(i);
            }
        }
        if idx.is_empty() {
            return codes;
        }
        let ks: Vec<String> = idx.iter().map(|&i| keys[i].clone()).collect();
        let vs: Vec<Pieces> = idx
            .iter()
            .map(|&i| vec![(ptrs[i], sizes[i] as u64)])
            .collect();
        let res = self.put_items(&ks, &vs, cfg, upsert);
        for (j, &i) in idx.iter().enumerate() {
            codes[i] = res[j];
        }
        codes
    }

    /// Create-only direct batch write: like `batch_put_from` (no upsert) but
    /// a key that already exists yields -705 and is left untouched.
    ///
    /// # Safety
    /// Every `ptrs[i]..+sizes[i]` must be readable for the duration of the call.
    pub unsafe fn batch_create_from(
        &self,
        keys: &[String],
        ptrs: &[usize],
        sizes: &[usize],
        cfg: &WriteConfig,
    ) -> Vec<i32> {
        if keys.len() != ptrs.len()
            || keys.len() != sizes.len()
            || sizes.iter().zip(ptrs).any(|(s, p)| *s == 0 || *p == 0)
            || keys.iter().any(|k| k.is_empty())
        {
            return vec![ErrorCode::InvalidParams.code(); keys.len()];
        }
        if keys.is_empty() {
            return Vec::new();
        }
        let vs: Vec<Pieces> = ptrs
            .iter()
            .zip(sizes)
            .map(|(&p, &s)| vec![(p, s as u64)])
            .collect();
        self.put_items_ex(keys, &vs, cfg, false, true)
    }
}

/// Record commits the master handed back for segments of this process.
fn record_local(ops: Vec<(String, mooncake_common::ledger::LedgerOp)>) {
    let mut by_segment: Vec<(String, Vec<mooncake_common::ledger::LedgerOp>)> = Vec::new();
    for (seg, op) in ops {
        match by_segment.iter_mut().find(|(s, _)| *s == seg) {
            Some((_, v)) => v.push(op),
            None => by_segment.push((seg, vec![op])),
        }
    }
    for (seg, ops) in by_segment {
        if let Some(l) = crate::ledger::local(&seg) {
            l.apply(ops);
        }
    }
}
