//! Multi-buffer batches (upstream's `batch_put_from_multi_buffers` and
//! `batch_get_into_multi_buffers`, used for layer-first KV layouts): each
//! key's value is the concatenation of its buffers, in order.
//!
//! Both lower onto the store's batched data paths, so a call moves every
//! buffer of every key with one request (or one mapped copy pass) per owner
//! segment and no staging copy: writes onto `Client::put_items` (one
//! PutStart, the located writes, one PutEnd), reads onto
//! `Client::read_ranges` (one lookup, ranged copies out of each object).
//!
//! The argument rules live here, with upstream's codes: lists of different lengths fail the whole call with
//! INVALID_PARAMS, and so does, for a write, a key whose pointer and size
//! lists differ in length (upstream writes nothing then); for a read that
//! fails only its key. Per key, an empty key, a null pointer under a
//! non-empty buffer, or (for a write) no bytes at all fail that key with
//! INVALID_PARAMS. Empty buffers are skipped. A write of a key that already exists succeeds and leaves it
//! unchanged; a key given twice is written once, from its first buffers. A
//! read needs buffers that add up to the stored length exactly: fewer bytes
//! are INVALID_PARAMS and leave the buffers untouched, more are
//! TRANSFER_FAIL (upstream's answer); a read returns the object's size.

use crate::caller_mem::{DstLists, SrcLists};
use crate::client::Client;
use crate::config::{ReplicateConfig, WriteKind};
use crate::error::{Error, Result};
use crate::ops::ranges::RangeOp;
use crate::ops::writes::Pieces;
use mooncake_common::proto::ObjectInfo;
use mooncake_common::ErrorCode;
use std::collections::HashMap;
use std::time::Instant;

/// One key's buffers as `(pointer, length)` pieces, empty buffers dropped,
/// or why they are unusable.
fn pieces_of(ptrs: &[usize], sizes: &[usize]) -> Result<Pieces> {
    if ptrs.len() != sizes.len() {
        return Err(Error::invalid(format!(
            "{} buffer pointers but {} sizes",
            ptrs.len(),
            sizes.len()
        )));
    }
    let mut pieces = Pieces::with_capacity(ptrs.len());
    for (&p, &n) in ptrs.iter().zip(sizes) {
        if n == 0 {
            continue;
        }
        if p == 0 {
            return Err(Error::invalid("null buffer pointer"));
        }
        pieces.push((p, n as u64));
    }
    Ok(pieces)
}

/// INVALID_PARAMS unless the three lists have one entry per key.
fn check_lists(keys: usize, ptrs: usize, sizes: usize) -> Result<()> {
    if keys != ptrs || keys != sizes {
        return Err(Error::invalid(format!(
            "keys ({keys}), all_buffer_ptrs ({ptrs}) and all_sizes ({sizes}) differ in length"
        )));
    }
    Ok(())
}

impl Client {
    /// Store each key's buffers, concatenated, as its value
    /// (`batch_put_from_multi_buffers`); one result per key. See the module
    /// doc for the rules. `cfg.prefer_alloc_in_same_node` places the values
    /// on this client's own segment first and needs `replica_num` 1.
    ///
    /// # Safety
    /// Every buffer of `bufs` must be readable for the duration of the call.
    pub unsafe fn batch_put_from_multi_buffers(
        &self,
        keys: &[String],
        bufs: SrcLists<'_>,
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        let (all_ptrs, all_sizes) = (bufs.ptrs, bufs.sizes);
        check_lists(keys.len(), all_ptrs.len(), all_sizes.len())?;
        if let Some(i) = (0..keys.len()).find(|&i| all_ptrs[i].len() != all_sizes[i].len()) {
            return Err(Error::invalid(format!(
                "key {:?} has {} buffer pointers but {} sizes",
                keys[i],
                all_ptrs[i].len(),
                all_sizes[i].len()
            )));
        }
        let mut wire = cfg.write_config(WriteKind::MultiBuffers, keys)?;
        if cfg.prefer_alloc_in_same_node {
            wire.writer_segment = Some(self.desc.name.clone());
        }
        let mut results: Vec<Result<()>> = Vec::with_capacity(keys.len());
        // Keys sent, their pieces, and for each key the slot it shares.
        let mut sent: Vec<String> = Vec::new();
        let mut values: Vec<Pieces> = Vec::new();
        let mut first: HashMap<&str, usize> = HashMap::new();
        let mut slot: Vec<Option<usize>> = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let checked = if key.is_empty() {
                Err(Error::invalid("empty key"))
            } else {
                pieces_of(&all_ptrs[i], &all_sizes[i]).and_then(|p| {
                    if p.is_empty() {
                        Err(Error::invalid("the buffers hold no bytes"))
                    } else {
                        Ok(p)
                    }
                })
            };
            match checked {
                Err(e) => {
                    results.push(Err(e));
                    slot.push(None);
                }
                Ok(pieces) => {
                    results.push(Ok(()));
                    let s = *first.entry(key.as_str()).or_insert_with(|| {
                        sent.push(key.clone());
                        values.push(pieces);
                        sent.len() - 1
                    });
                    slot.push(Some(s));
                }
            }
        }
        if sent.is_empty() {
            return Ok(results);
        }
        // SAFETY: the caller vouches for every buffer.
        let written = unsafe { self.put_items(&sent, &values, &wire, false, false) };
        for (r, s) in results.iter_mut().zip(slot) {
            if let Some(s) = s {
                *r = written[s].clone();
            }
        }
        Ok(results)
    }

    /// Read each key's value into its buffers, in order
    /// (`batch_get_into_multi_buffers`); per key the object's size or the
    /// failure. See the module doc for the rules. `prefer_same_node` is
    /// accepted for upstream's signature: replicas are always tried in
    /// path order (own process, same host, remote), one request per owner.
    ///
    /// # Safety
    /// Every buffer of `bufs` must be writable for the duration of the call.
    pub unsafe fn batch_get_into_multi_buffers(
        &self,
        keys: &[String],
        bufs: DstLists<'_>,
        prefer_same_node: bool,
    ) -> Result<Vec<Result<u64>>> {
        let (all_ptrs, all_sizes) = (bufs.ptrs, bufs.sizes);
        let _ = prefer_same_node;
        check_lists(keys.len(), all_ptrs.len(), all_sizes.len())?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // Buffers are checked before the lookup: a bad key is never sent.
        let mut out: Vec<Result<u64>> = Vec::with_capacity(keys.len());
        let mut pieces: Vec<Pieces> = Vec::with_capacity(keys.len());
        let mut ask: Vec<String> = Vec::new();
        let mut asked: Vec<Option<usize>> = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            match pieces_of(&all_ptrs[i], &all_sizes[i]) {
                Ok(p) => {
                    out.push(Ok(0));
                    pieces.push(p);
                    asked.push(Some(ask.len()));
                    // An empty key is answered by the lookup (INVALID_PARAMS).
                    ask.push(key.clone());
                }
                Err(e) => {
                    out.push(Err(e));
                    pieces.push(Pieces::new());
                    asked.push(None);
                }
            }
        }
        if ask.is_empty() {
            return Ok(out);
        }
        let lk = self.lookup(&ask, true);
        let mut infos: Vec<&ObjectInfo> = Vec::new();
        let mut ops: Vec<RangeOp> = Vec::new();
        let mut op_key: Vec<usize> = Vec::new();
        for (i, a) in asked.iter().enumerate() {
            let Some(a) = *a else { continue };
            let info = match &lk.infos[a] {
                Ok(info) => info,
                Err(e) => {
                    out[i] = Err(e.clone());
                    continue;
                }
            };
            let room: u64 = pieces[i].iter().map(|p| p.1).sum();
            if room < info.size {
                out[i] = Err(Error::invalid(format!(
                    "the buffers hold {room} bytes, less than the object ({} bytes)",
                    info.size
                )));
                continue;
            }
            if room > info.size {
                out[i] = Err(Error::new(
                    ErrorCode::TransferFail,
                    format!(
                        "the buffers hold {room} bytes but the object has {}: \
                         they must add up to the stored length",
                        info.size
                    ),
                ));
                continue;
            }
            let k = infos.len();
            infos.push(info);
            let mut at = 0u64;
            for &(dst, len) in &pieces[i] {
                ops.push(RangeOp {
                    key: k,
                    src: at,
                    dst,
                    len,
                    ..RangeOp::ONE_ROW
                });
                op_key.push(i);
                at += len;
            }
            out[i] = Ok(info.size);
        }
        // SAFETY: the caller vouches for every buffer; each range lies in
        // its object (the buffers add up to the object's size).
        let errs = unsafe { self.read_ranges(&infos, &ops) };
        let expired = Instant::now() > lk.deadline;
        self.read_finished(lk.ticket);
        for (e, &i) in errs.iter().zip(&op_key) {
            if let Some(e) = e {
                out[i] = Err(e.clone());
            }
        }
        if expired {
            for &i in &op_key {
                if out[i].is_ok() {
                    out[i] = Err(ErrorCode::LeaseExpired.into());
                }
            }
        }
        Ok(out)
    }
}
