//! Write paths: staged puts (local-buffer capped), direct `*_from` puts and
//! their upsert forms. Each batch is one PutStart RPC, the replica writes,
//! then one PutEnd (and one PutRevoke for failures).
//!
//! A key whose replica write fails is revoked and placed again within the
//! same call, away from the segments that failed (the segment of an owner
//! that died stays mounted until its client expires, so a put may be placed
//! on it meanwhile).
//!
//! The argument rules of the store's write methods live here: an empty key or an empty value is
//! INVALID_PARAMS; `put_parts` of zero bytes and `put_from` of size 0 store
//! nothing and succeed; a batch whose lists differ in length fails whole;
//! in a staged batch the first value of a duplicated key wins; a staged
//! write needs local-buffer room for its bytes. The config is checked by
//! [`ReplicateConfig::write_config`].

use crate::caller_mem::{Mem, MemList, Src, Srcs};
use crate::client::Client;
use crate::config::{ReplicateConfig, WriteKind};
use crate::error::{Error, Result};
use crate::ops::{only, screen};
use crate::parallel::{group_tasks, run_all};
use mooncake_common::ledger::LedgerOp;
use mooncake_common::proto::{
    MasterRequest, MasterResponse, PutStartItem, ReplicaLoc, WriteConfig,
};
use mooncake_common::ErrorCode;
use mooncake_transfer::{Op, Path, SegmentRef};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// How many times a put whose replica write failed is placed again, on
/// other segments, within one call.
pub(crate) const PLACEMENT_RETRIES: usize = 2;

/// Source of one value: (pointer, length) pieces, concatenated.
pub(crate) type Pieces = Vec<(usize, u64)>;

/// Each slice as a piece, `(address, length)`.
fn pieces_of_slices(slices: &[&[u8]]) -> Pieces {
    slices
        .iter()
        .map(|v| (v.as_ptr() as usize, v.len() as u64))
        .collect()
}

pub(crate) fn seg_ref(l: &ReplicaLoc) -> SegmentRef<'_> {
    SegmentRef {
        uuid: &l.segment_uuid,
        endpoint: &l.endpoint,
        host_id: &l.host_id,
        socket_name: &l.socket_name,
        size: l.segment_size,
        ticket: l.ticket.as_ref(),
    }
}

/// INVALID_PARAMS for an empty key.
pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        Err(Error::invalid("empty key"))
    } else {
        Ok(())
    }
}

/// The first failure of a batch, with the key it belongs to.
fn first_failure(keys: &[String], results: Vec<Result<()>>) -> Result<()> {
    match keys
        .iter()
        .zip(results)
        .find_map(|(k, r)| r.err().map(|e| (k, e)))
    {
        Some((k, e)) => Err(e.context(format!("first failing key {k:?}"))),
        None => Ok(()),
    }
}

impl Client {
    /// Counts one engine write of `n` bytes (one request when over TCP).
    pub(crate) fn count_write(&self, path: Path, n: u64) {
        self.stats.written.count(path, n);
    }

    /// PutStart + writes + PutEnd/PutRevoke for a batch; one result per
    /// key. With `report_existing`, a key that already existed is
    /// OBJECT_ALREADY_EXISTS instead of a success. A key whose replica
    /// write fails is revoked and placed again, away from every segment
    /// that failed in this call, up to [`PLACEMENT_RETRIES`] times.
    ///
    /// # Safety
    /// Every piece of `values` must be readable for the duration of the call.
    pub(crate) unsafe fn put_items(
        &self,
        keys: &[String],
        values: &[Pieces],
        cfg: &WriteConfig,
        upsert: bool,
        report_existing: bool,
    ) -> Vec<Result<()>> {
        if upsert {
            self.bump_mutations();
        }
        let sizes: Vec<u64> = values.iter().map(|v| v.iter().map(|p| p.1).sum()).collect();
        let mut cfg = cfg.clone();
        self.describe_writer(&mut cfg);
        let mut results: Vec<Result<()>> = vec![Ok(()); keys.len()];
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        let mut exclude: Vec<String> = Vec::new();
        for attempt in 0..=PLACEMENT_RETRIES {
            let items = match self.rpc(MasterRequest::PutStart {
                keys: pending.iter().map(|&i| keys[i].clone()).collect(),
                sizes: pending.iter().map(|&i| sizes[i]).collect(),
                config: cfg.clone(),
                upsert,
                exclude: exclude.clone(),
            }) {
                Ok(MasterResponse::PutStart(items)) if items.len() == pending.len() => items,
                Ok(MasterResponse::Err(e)) | Err(e) => {
                    for &i in &pending {
                        results[i] = Err(e.into());
                    }
                    return results;
                }
                Ok(_) => {
                    let e = Error::internal("unexpected PutStart response");
                    for &i in &pending {
                        results[i] = Err(e.clone());
                    }
                    return results;
                }
            };
            let mut done = Vec::new();
            let mut failed = Vec::new();
            let mut failed_versions = Vec::new();
            let mut retry = Vec::new();
            let mut jobs: Vec<(usize, Vec<ReplicaLoc>)> = Vec::new();
            // The version each key's write creates (it names the write).
            let mut versions: Vec<u64> = vec![0; keys.len()];
            // Segments the replicas of `done` live in.
            let mut segments: Vec<Arc<str>> = Vec::new();
            for (&i, item) in pending.iter().zip(items) {
                match item {
                    PutStartItem::AlreadyExists => {
                        results[i] = if report_existing {
                            Err(ErrorCode::ObjectAlreadyExists.into())
                        } else {
                            Ok(())
                        };
                    }
                    PutStartItem::Err(e) => results[i] = Err(e.into()),
                    PutStartItem::Write { replicas, version } => {
                        versions[i] = version;
                        jobs.push((i, replicas));
                    }
                }
            }
            if upsert {
                // The master may hand an unread key's own replica back for an
                // in-place rewrite: its ledger entry goes first.
                for (_, locs) in &jobs {
                    crate::durability::ledger::vacate_own(locs);
                }
            }
            // All values of the batch in one pass: one request per owner,
            // large local groups over several threads.
            let located: Vec<(&Pieces, u64, &[ReplicaLoc])> = jobs
                .iter()
                .map(|(i, locs)| (&values[*i], 0, locs.as_slice()))
                .collect();
            // SAFETY: the caller vouches for the pieces.
            let written = unsafe { self.write_located(&located) };
            for ((i, locs), w) in jobs.iter().zip(written) {
                let i = *i;
                match w {
                    Ok(()) => {
                        results[i] = Ok(());
                        done.push(i);
                        for l in locs {
                            if !segments.contains(&l.segment_name) {
                                segments.push(l.segment_name.clone());
                            }
                        }
                    }
                    Err((e, seg)) => {
                        let on = seg.as_deref().unwrap_or("?");
                        results[i] = Err(Error::new(
                            ErrorCode::TransferFail,
                            format!("replica write to {on} failed ({e}); put revoked"),
                        ));
                        failed.push(keys[i].clone());
                        failed_versions.push(versions[i]);
                        if let Some(seg) = seg {
                            if !exclude.contains(&seg) {
                                exclude.push(seg);
                            }
                            retry.push(i);
                        }
                    }
                }
            }
            if !failed.is_empty() {
                let _ = self.rpc(MasterRequest::PutRevoke {
                    keys: failed,
                    versions: failed_versions,
                });
            }
            if !done.is_empty() {
                let keys_done = done.iter().map(|&i| keys[i].clone()).collect();
                let versions_done = done.iter().map(|&i| versions[i]).collect();
                if let Err(e) = self.end_puts(keys_done, versions_done, &segments) {
                    for &i in &done {
                        results[i] = Err(Error::from(e).context("PutEnd"));
                    }
                }
            }
            if retry.is_empty() || attempt == PLACEMENT_RETRIES {
                break;
            }
            tracing::info!(keys = retry.len(), avoiding = ?exclude, "placing failed writes again");
            pending = retry;
        }
        results
    }

    /// Staged write of `value` under `key` (`put`/`upsert`). An empty key or
    /// value is INVALID_PARAMS, as is a value the local buffer has no room for.
    pub fn put(&self, key: &str, value: &[u8], cfg: &ReplicateConfig, upsert: bool) -> Result<()> {
        check_key(key)?;
        if value.is_empty() {
            return Err(Error::invalid("empty value"));
        }
        self.put_parts(key, &[value], cfg, upsert).map(|_| ())
    }

    /// [`Client::put`] of `len` bytes at `ptr` that the caller already
    /// staged in memory of its own (a standalone daemon writing for a dummy
    /// client, whose local buffer holds the value): the same rules, without
    /// a reservation in this client's local buffer.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be readable for the duration of the call.
    pub unsafe fn put_prestaged(
        &self,
        key: &str,
        ptr: usize,
        len: u64,
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<()> {
        check_key(key)?;
        if len == 0 {
            return Err(Error::invalid("empty value"));
        }
        // SAFETY: the caller vouches for the range.
        unsafe { self.write_parts(key, &[(ptr, len)], cfg, upsert, false) }.map(|_| ())
    }

    /// Staged write of the concatenation of `parts`
    /// (`put_parts`/`upsert_parts`); the bytes stored. Zero bytes in all
    /// store nothing and return `Ok(0)` (upstream). An empty key, an
    /// invalid config, or a value the local buffer has no room for is
    /// INVALID_PARAMS.
    pub fn put_parts(
        &self,
        key: &str,
        parts: &[&[u8]],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<u64> {
        // SAFETY: the slices are borrowed for the duration of the call.
        unsafe { self.write_parts(key, &pieces_of_slices(parts), cfg, upsert, true) }
    }

    /// [`Client::put_parts`] of pieces the caller already staged in memory
    /// of its own (see [`Client::put_prestaged`]).
    ///
    /// # Safety
    /// Every piece must be readable for the duration of the call.
    pub unsafe fn put_parts_prestaged(
        &self,
        key: &str,
        pieces: &[(usize, u64)],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<u64> {
        // SAFETY: the caller vouches for every piece.
        unsafe { self.write_parts(key, pieces, cfg, upsert, false) }
    }

    /// Body of the `put_parts` forms; `reserve`: the bytes count against
    /// this client's local buffer.
    ///
    /// # Safety
    /// Every piece must be readable for the duration of the call.
    unsafe fn write_parts(
        &self,
        key: &str,
        pieces: &[(usize, u64)],
        cfg: &ReplicateConfig,
        upsert: bool,
        reserve: bool,
    ) -> Result<u64> {
        check_key(key)?;
        let total: u64 = pieces.iter().map(|p| p.1).sum();
        if total == 0 {
            return Ok(0);
        }
        let wire = cfg.write_config(WriteKind::Bytes, &[key])?;
        let _room = if reserve {
            Some(self.staging.reserve(total).ok_or_else(|| no_room(total))?)
        } else {
            None
        };
        let pieces: Pieces = pieces.iter().filter(|p| p.1 > 0).copied().collect();
        // SAFETY: the caller vouches for every piece.
        only(unsafe { self.put_items(&[key.to_string()], &[pieces], &wire, upsert, false) })
            .map(|()| total)
    }

    /// Staged batch write (`put_batch`/`upsert_batch`): `Ok` when every item
    /// succeeded, else the first failure (items that succeeded stay). No
    /// items is `Ok`. Lists of different lengths, an empty key or value,
    /// an invalid config, or values the local buffer has no room for fail
    /// the whole batch with INVALID_PARAMS before anything is written. A
    /// key given twice is written once, with its first value.
    pub fn put_batch(
        &self,
        keys: &[String],
        values: &[&[u8]],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<()> {
        // SAFETY: the slices are borrowed for the duration of the call.
        unsafe { self.write_batch(keys, &pieces_of_slices(values), cfg, upsert, true) }
    }

    /// [`Client::put_batch`] of values the caller already staged in memory
    /// of its own (see [`Client::put_prestaged`]).
    ///
    /// # Safety
    /// Every value must be readable for the duration of the call.
    pub unsafe fn put_batch_prestaged(
        &self,
        keys: &[String],
        values: &[(usize, u64)],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<()> {
        // SAFETY: the caller vouches for every value.
        unsafe { self.write_batch(keys, values, cfg, upsert, false) }
    }

    /// Body of the `put_batch` forms; `reserve` as for `write_parts`.
    ///
    /// # Safety
    /// Every value must be readable for the duration of the call.
    unsafe fn write_batch(
        &self,
        keys: &[String],
        values: &[(usize, u64)],
        cfg: &ReplicateConfig,
        upsert: bool,
        reserve: bool,
    ) -> Result<()> {
        if keys.len() != values.len() {
            return Err(Error::invalid("keys and values differ in length"));
        }
        if keys.is_empty() {
            return Ok(());
        }
        if keys.iter().any(String::is_empty) {
            return Err(Error::invalid("empty key"));
        }
        if values.iter().any(|v| v.1 == 0) {
            return Err(Error::invalid("empty value"));
        }
        let wire = cfg.write_config(WriteKind::Bytes, keys)?;
        let mut seen = HashSet::with_capacity(keys.len());
        let mut batch_keys = Vec::with_capacity(keys.len());
        let mut pieces: Vec<Pieces> = Vec::with_capacity(keys.len());
        for (k, v) in keys.iter().zip(values) {
            if seen.insert(k.as_str()) {
                batch_keys.push(k.clone());
                pieces.push(vec![*v]);
            }
        }
        let total: u64 = pieces.iter().map(|p| p[0].1).sum();
        let _room = if reserve {
            Some(self.staging.reserve(total).ok_or_else(|| no_room(total))?)
        } else {
            None
        };
        // SAFETY: the caller vouches for every value.
        let results = unsafe { self.put_items(&batch_keys, &pieces, &wire, upsert, false) };
        first_failure(&batch_keys, results)
    }

    /// Direct write of the bytes of `src` (`put_from`/`upsert_from`; no
    /// staging). An empty key or an invalid config is INVALID_PARAMS; then
    /// a length of 0 stores nothing and succeeds (upstream), and a null
    /// address is INVALID_PARAMS.
    ///
    /// # Safety
    /// `src` must be readable for the duration of the call.
    pub unsafe fn put_from(
        &self,
        key: &str,
        src: Src,
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<()> {
        let Mem { ptr, len: size } = src;
        check_key(key)?;
        let wire = cfg.write_config(WriteKind::Bytes, &[key])?;
        if size == 0 {
            return Ok(());
        }
        if ptr == 0 {
            return Err(Error::invalid("null buffer pointer"));
        }
        let pieces = vec![(ptr, size as u64)];
        // SAFETY: the caller vouches for `ptr..ptr+size`.
        only(unsafe { self.put_items(&[key.to_string()], &[pieces], &wire, upsert, false) })
    }

    /// `put_from_with_metadata`: one object made of the bytes of
    /// `metadata` followed by those of `src` (no staging). An empty key or
    /// an invalid config is INVALID_PARAMS; then an empty `src` stores
    /// nothing and succeeds (upstream, which warns), and a null address
    /// under a non-zero length is INVALID_PARAMS.
    ///
    /// # Safety
    /// `src` and `metadata` must be readable for the duration of the call.
    pub unsafe fn put_from_with_metadata(
        &self,
        key: &str,
        src: Src,
        metadata: Src,
        cfg: &ReplicateConfig,
    ) -> Result<()> {
        let (
            Mem { ptr, len: size },
            Mem {
                ptr: metadata_ptr,
                len: metadata_size,
            },
        ) = (src, metadata);
        check_key(key)?;
        let wire = cfg.write_config(WriteKind::Bytes, &[key])?;
        if size == 0 {
            return Ok(());
        }
        if ptr == 0 || (metadata_size > 0 && metadata_ptr == 0) {
            return Err(Error::invalid("null buffer pointer"));
        }
        let mut pieces: Pieces = Vec::with_capacity(2);
        if metadata_size > 0 {
            pieces.push((metadata_ptr, metadata_size as u64));
        }
        pieces.push((ptr, size as u64));
        // SAFETY: the caller vouches for both ranges.
        only(unsafe { self.put_items(&[key.to_string()], &[pieces], &wire, false, false) })
    }

    /// Direct batch write (`batch_put_from`/`batch_upsert_from`): one result
    /// per item. Lists of different lengths or an invalid config fail the
    /// whole call; an empty key, a size of 0 or a null pointer fail that
    /// item with INVALID_PARAMS.
    ///
    /// # Safety
    /// Every buffer of `srcs` must be readable for the duration of the call.
    pub unsafe fn batch_put_from(
        &self,
        keys: &[String],
        srcs: Srcs<'_>,
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<Vec<Result<()>>> {
        let MemList { ptrs, sizes } = srcs;
        if keys.len() != ptrs.len() || keys.len() != sizes.len() {
            return Err(Error::invalid(
                "keys, buffer_ptrs and sizes differ in length",
            ));
        }
        let wire = cfg.write_config(WriteKind::Bytes, keys)?;
        let (mut results, idx) = screen(keys.len(), |i| {
            check_key(&keys[i])?;
            match (sizes[i], ptrs[i]) {
                (0, _) => Err(Error::invalid("size 0")),
                (_, 0) => Err(Error::invalid("null buffer pointer")),
                _ => Ok(()),
            }
        });
        if idx.is_empty() {
            return Ok(results);
        }
        let ks: Vec<String> = idx.iter().map(|&i| keys[i].clone()).collect();
        let vs: Vec<Pieces> = idx
            .iter()
            .map(|&i| vec![(ptrs[i], sizes[i] as u64)])
            .collect();
        // SAFETY: the caller vouches for every range.
        let sent = unsafe { self.put_items(&ks, &vs, &wire, upsert, false) };
        for (i, r) in idx.into_iter().zip(sent) {
            results[i] = r;
        }
        Ok(results)
    }

    /// Create-only direct batch write (Engram `populate`): like
    /// [`Client::batch_put_from`] without upsert, but a key that already
    /// exists is OBJECT_ALREADY_EXISTS and left untouched, and any empty
    /// key, size of 0 or null pointer fails the whole call.
    ///
    /// # Safety
    /// Every `ptrs[i]..+sizes[i]` must be readable for the duration of the call.
    pub unsafe fn batch_create_from(
        &self,
        keys: &[String],
        ptrs: &[usize],
        sizes: &[usize],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        if keys.len() != ptrs.len() || keys.len() != sizes.len() {
            return Err(Error::invalid(
                "keys, buffer_ptrs and sizes differ in length",
            ));
        }
        if keys.iter().any(String::is_empty) {
            return Err(Error::invalid("empty key"));
        }
        if sizes.iter().zip(ptrs).any(|(s, p)| *s == 0 || *p == 0) {
            return Err(Error::invalid("a value is empty or has a null pointer"));
        }
        let wire = cfg.write_config(WriteKind::Bytes, keys)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let vs: Vec<Pieces> = ptrs
            .iter()
            .zip(sizes)
            .map(|(&p, &s)| vec![(p, s as u64)])
            .collect();
        // SAFETY: the caller vouches for every range.
        Ok(unsafe { self.put_items(keys, &vs, &wire, false, true) })
    }
}

/// INVALID_PARAMS for a staged value the local buffer has no room for.
impl Client {
    /// Tell the master where this writer stands: its host (for `local_first`
    /// placement) and which segments it copies into through memory (the
    /// master may then let an upsert of an unread key write in place).
    pub(crate) fn describe_writer(&self, cfg: &mut WriteConfig) {
        cfg.writer_host_id = self.data_path.host_id().to_string();
        cfg.writer_maps_host = self.data_path.maps_same_host();
        cfg.writer_own_segments = crate::durability::ledger::local_names();
        cfg.writer_client_id = self.client_id.clone();
    }

    /// Commit written keys (PutEnd). The master acknowledges once the owners
    /// of the replicas recorded the commit in their ledgers; for replicas in
    /// `segments` owned by this process, it hands the entries back and they
    /// are recorded here, which saves the round trip through the owner's
    /// ledger stream (see `ledger`).
    pub(crate) fn end_puts(
        &self,
        keys: Vec<String>,
        versions: Vec<u64>,
        segments: &[Arc<str>],
    ) -> std::result::Result<(), ErrorCode> {
        let local_segments: Vec<String> = segments
            .iter()
            .filter(|s| crate::durability::ledger::local(s).is_some())
            .map(|s| s.to_string())
            .collect();
        match self.rpc(MasterRequest::CommitEnd {
            keys,
            versions,
            local_segments,
        }) {
            Ok(MasterResponse::Committed { ops }) => {
                record_local(ops);
                Ok(())
            }
            Ok(MasterResponse::Err(e)) | Err(e) => Err(e),
            Ok(_) => Err(ErrorCode::InternalError),
        }
    }
}

/// Record commits the master handed back for segments of this process.
fn record_local(ops: Vec<(String, LedgerOp)>) {
    let mut by_segment: Vec<(String, Vec<LedgerOp>)> = Vec::new();
    for (seg, op) in ops {
        match by_segment.iter_mut().find(|(s, _)| *s == seg) {
            Some((_, v)) => v.push(op),
            None => by_segment.push((seg, vec![op])),
        }
    }
    for (seg, ops) in by_segment {
        if let Some(l) = crate::durability::ledger::local(&seg) {
            l.apply(ops);
        }
    }
}

fn no_room(bytes: u64) -> Error {
    Error::invalid(format!(
        "the local buffer has no room for {bytes} bytes (local_buffer_size)"
    ))
}

impl Client {
    /// Write values into the replicas PutStart allocated: `jobs[i]` is one
    /// value's pieces (or one range of it: the pieces land contiguously from
    /// that offset inside the object; 0 for a whole value) and its replicas. Ops are grouped per owner segment
    /// (one request per TCP owner), owners run in parallel, and big local or
    /// same-host groups are spread over several threads. Returns per job
    /// `Ok`, or an error of one of its replicas with the name of the segment
    /// that could not be written (none for a job without replicas).
    ///
    /// # Safety
    /// Every piece of every job must be readable for the duration of the call.
    pub(crate) unsafe fn write_located(
        &self,
        jobs: &[(&Pieces, u64, &[ReplicaLoc])],
    ) -> Vec<std::result::Result<(), (ErrorCode, Option<String>)>> {
        let mut out: Vec<std::result::Result<(), (ErrorCode, Option<String>)>> =
            vec![Ok(()); jobs.len()];
        struct Group<'a> {
            rep: &'a ReplicaLoc,
            ops: Vec<Op>,
            jobs: Vec<usize>,
        }
        let mut groups: Vec<Group> = Vec::new();
        // With a cluster token every replica carries its own write ticket,
        // which covers only that replica's range: such replicas get a request
        // each; without tickets, all ops for one segment go in one request.
        let mut by_seg: HashMap<(&str, Option<u64>), usize> = HashMap::new();
        for (ji, (pieces, start, locs)) in jobs.iter().enumerate() {
            if locs.is_empty() {
                out[ji] = Err((ErrorCode::InvalidReplica, None));
                continue;
            }
            for l in locs.iter() {
                let ticket_at = l.ticket.as_ref().map(|t| t.offset);
                let g = *by_seg
                    .entry((&*l.segment_uuid, ticket_at))
                    .or_insert_with(|| {
                        groups.push(Group {
                            rep: l,
                            ops: Vec::new(),
                            jobs: Vec::new(),
                        });
                        groups.len() - 1
                    });
                let mut at = l.offset.saturating_add(*start);
                for &(ptr, n) in pieces.iter().filter(|p| p.1 > 0) {
                    groups[g].ops.push(Op {
                        seg_offset: at,
                        local_ptr: ptr,
                        len: n,
                    });
                    // The engine refuses a range that does not fit.
                    at = at.saturating_add(n);
                }
                groups[g].jobs.push(ji);
            }
        }
        let (tasks, workers) = group_tasks(groups.iter().map(|g| {
            let local = self.data_path.preferred_path(&seg_ref(g.rep)) != Path::Tcp;
            (g.ops.as_slice(), local)
        }));
        let results = run_all(&tasks, workers, |t| -> std::result::Result<(), ErrorCode> {
            let g = &groups[t.group];
            // SAFETY: sources vouched for by our caller; the master allocated
            // the destination ranges for these objects.
            let path = unsafe { self.data_path.write(&seg_ref(g.rep), &t.ops, t.stores) }?;
            self.count_write(path, t.ops.iter().map(|o| o.len).sum());
            Ok(())
        });
        for (t, r) in tasks.iter().zip(results) {
            if let Err(e) = r {
                let g = &groups[t.group];
                for &ji in &g.jobs {
                    out[ji] = Err((e, Some(g.rep.segment_name.to_string())));
                }
            }
        }
        out
    }
}
