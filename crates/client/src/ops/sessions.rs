//! Put and get sessions with ranged multi-buffer transfers (upstream's
//! `batch_put_session_*`, `batch_get_session_*`,
//! `batch_put_from_multi_buffer_ranges` and
//! `batch_get_into_multi_buffer_ranges`), which layer-wise KV pools drive
//! as: start a session for a batch of keys, move one layer's ranges of
//! every key per call, end the session.
//!
//! A put session is one PutStart (the objects are reserved, invisible to
//! readers), any number of ranged writes into the reserved replicas, then
//! one PutEnd (readable) or PutRevoke (gone, space freed). A get session is
//! one replica lookup whose locations and lease are cached here, then
//! ranged reads from the cached replica until the session ends or the lease
//! runs out. Both tables (`session_table`) are per client and behind a
//! lock; transfers run outside it, one batched request per owner segment
//! and no staging copy (`Client::write_located`, `Client::read_ranges`).
//!
//! The rules are upstream's observable ones (its 0.3.13 wheel, probed):
//! - lists of different lengths (keys vs. the outer lists, or keys vs.
//!   sizes at put-session start) fail every key with INVALID_PARAMS;
//! - a ranged call on a key without a session, a second put-session start
//!   of a key this client has a session for, and end/revoke without a
//!   session are INVALID_PARAMS for that key;
//! - put-session start of a key that exists (or that another client is
//!   writing), or of a key given earlier in the same call, is
//!   OBJECT_ALREADY_EXISTS; a size of 0 is INVALID_PARAMS;
//! - per key, pointer/size/offset lists of different lengths, a null
//!   pointer under a non-empty range, or a range ending past the object is
//!   INVALID_PARAMS; empty ranges are skipped; a ranged write with no
//!   ranges at all is INVALID_REPLICA (a ranged read with none reads 0
//!   bytes); a ranged call returns the bytes it moved for the key;
//! - a get session on a missing (or still being written) key fails it with
//!   OBJECT_NOT_FOUND (REPLICA_IS_NOT_READY); a ranged read after the
//!   lease ran out is LEASE_EXPIRED and ends that key's session;
//! - ending a put session does not check which bytes were written (upstream
//!   does not either); `batch_get_session_end` always succeeds.
//!
//! Sessions still open when the client closes are revoked (put) or dropped
//! (get). While a get session holds a key, the key counts as being read
//! (the master refuses an upsert of it and a non-forced remove answers
//! OBJECT_HAS_LEASE until the lease runs out).

use crate::caller_mem::{DstLists, SrcLists};
use crate::client::Client;
use crate::config::{ReplicateConfig, WriteKind};
use crate::error::{Error, Result};
use crate::ops::ranges::RangeOp;
use crate::ops::screen;
use crate::ops::writes::{check_key, Pieces};
use crate::session_table::{GetSession, PutSession};
use mooncake_common::proto::{MasterRequest, MasterResponse, ObjectInfo, PutStartItem, ReplicaLoc};
use mooncake_common::ErrorCode;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// One key's ranges as `(pointer, size, offset in the object)`, empty ones
/// dropped, or why they are unusable.
fn ranges_of(
    ptrs: &[usize],
    sizes: &[usize],
    offsets: &[usize],
    object_size: u64,
) -> Result<Vec<(usize, u64, u64)>> {
    if ptrs.len() != sizes.len() || ptrs.len() != offsets.len() {
        return Err(Error::invalid(format!(
            "{} buffer pointers, {} sizes and {} offsets",
            ptrs.len(),
            sizes.len(),
            offsets.len()
        )));
    }
    let mut out = Vec::with_capacity(ptrs.len());
    for ((&p, &n), &off) in ptrs.iter().zip(sizes).zip(offsets) {
        if n == 0 {
            continue;
        }
        if p == 0 {
            return Err(Error::invalid("null buffer pointer"));
        }
        let (n, off) = (n as u64, off as u64);
        if off.checked_add(n).is_none_or(|end| end > object_size) {
            return Err(Error::invalid(format!(
                "range [{off}, {off}+{n}) ends past the object ({object_size} bytes)"
            )));
        }
        out.push((p, n, off));
    }
    Ok(out)
}

/// INVALID_PARAMS unless the four lists have one entry per key.
fn check_lists(
    keys: &[String],
    ptrs: &[Vec<usize>],
    sizes: &[Vec<usize>],
    offsets: &[Vec<usize>],
    what: &str,
) -> Result<()> {
    let (keys, ptrs, sizes, offsets) = (keys.len(), ptrs.len(), sizes.len(), offsets.len());
    if keys != ptrs || keys != sizes || keys != offsets {
        return Err(Error::invalid(format!(
            "keys ({keys}), all_buffer_ptrs ({ptrs}), all_sizes ({sizes}) and {what} \
             ({offsets}) differ in length"
        )));
    }
    Ok(())
}

fn no_put_session() -> Error {
    Error::invalid("no put session for this key (batch_put_session_start first)")
}

fn no_get_session() -> Error {
    Error::invalid("no get session for this key (batch_get_session_start first)")
}

/// One result per key for a call on a list that may repeat keys: each key
/// is handled once, by `f` on the distinct keys, and a repeat gets the
/// result of its first occurrence.
fn per_distinct<T: Clone>(
    keys: &[String],
    f: impl FnOnce(&[String]) -> Vec<Result<T>>,
) -> Vec<Result<T>> {
    let mut first: HashMap<&str, usize> = HashMap::with_capacity(keys.len());
    let mut distinct: Vec<String> = Vec::with_capacity(keys.len());
    let slots: Vec<usize> = keys
        .iter()
        .map(|k| {
            *first.entry(k.as_str()).or_insert_with(|| {
                distinct.push(k.clone());
                distinct.len() - 1
            })
        })
        .collect();
    let answers = f(&distinct);
    slots
        .into_iter()
        .map(|s| {
            answers
                .get(s)
                .cloned()
                .unwrap_or_else(|| Err(Error::internal("missing answer")))
        })
        .collect()
}

impl Client {
    /// Reserve each key's object without writing it
    /// (`batch_put_session_start`): one PutStart for the batch. The objects
    /// stay invisible to readers until [`Client::batch_put_session_end`].
    /// See the module doc for the per-key rules. `cfg` is the write config
    /// of a multi-buffer write, except that `prefer_alloc_in_same_node`
    /// (placing on this client's own segment first) is accepted with any
    /// `replica_num`, as upstream does.
    pub fn batch_put_session_start(
        &self,
        keys: &[String],
        sizes: &[u64],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        if keys.len() != sizes.len() {
            return Err(Error::invalid(format!(
                "keys ({}) and sizes ({}) differ in length",
                keys.len(),
                sizes.len()
            )));
        }
        let mut wire = cfg.write_config(WriteKind::Tensor, keys)?;
        if cfg.prefer_alloc_in_same_node {
            wire.writer_segment = Some(self.desc.name.clone());
        }
        self.describe_writer(&mut wire);
        let (mut results, send) = {
            let puts = self.sessions.puts.lock();
            let mut seen: HashSet<&str> = HashSet::new();
            screen(keys.len(), |i| {
                let k = &keys[i];
                check_key(k)?;
                if sizes[i] == 0 {
                    Err(Error::invalid("size 0"))
                } else if puts.contains_key(k) {
                    Err(Error::invalid("a put session for this key already exists"))
                } else if !seen.insert(k.as_str()) {
                    Err(Error::new(
                        ErrorCode::ObjectAlreadyExists,
                        "key given twice in one batch_put_session_start",
                    ))
                } else {
                    Ok(())
                }
            })
        };
        if send.is_empty() {
            return Ok(results);
        }
        let items = match self.rpc(MasterRequest::PutStart {
            keys: send.iter().map(|&i| keys[i].clone()).collect(),
            sizes: send.iter().map(|&i| sizes[i]).collect(),
            config: wire,
            upsert: false,
            exclude: Vec::new(),
        }) {
            Ok(MasterResponse::PutStart(items)) if items.len() == send.len() => items,
            Ok(MasterResponse::Err(e)) | Err(e) => {
                for &i in &send {
                    results[i] = Err(Error::from(e).context("PutStart"));
                }
                return Ok(results);
            }
            Ok(_) => return Err(Error::internal("unexpected PutStart response")),
        };
        let mut puts = self.sessions.puts.lock();
        let mut lost: Vec<String> = Vec::new();
        let mut lost_versions: Vec<u64> = Vec::new();
        for (&i, item) in send.iter().zip(items) {
            results[i] = match item {
                PutStartItem::AlreadyExists => Err(ErrorCode::ObjectAlreadyExists.into()),
                PutStartItem::Err(e) => Err(e.into()),
                PutStartItem::Write { replicas, version } if replicas.is_empty() => {
                    lost.push(keys[i].clone());
                    lost_versions.push(version);
                    Err(Error::new(
                        ErrorCode::InvalidReplica,
                        "no replica allocated",
                    ))
                }
                PutStartItem::Write { replicas, version } => {
                    let s = PutSession {
                        size: sizes[i],
                        locs: replicas,
                        version,
                    };
                    if puts.insert(keys[i].clone(), Arc::new(s)).is_some() {
                        // Another thread started the same key meanwhile; the
                        // master gave it OBJECT_ALREADY_EXISTS, so this one
                        // is the session (nothing to undo).
                        tracing::debug!(key = %keys[i], "put session replaced");
                    }
                    Ok(())
                }
            };
        }
        drop(puts);
        if !lost.is_empty() {
            let _ = self.rpc(MasterRequest::PutRevoke {
                keys: lost,
                versions: lost_versions,
            });
        }
        Ok(results)
    }

    /// Write ranges of each key's reserved object
    /// (`batch_put_from_multi_buffer_ranges`): key `i`'s buffer `j`
    /// (`all_ptrs[i][j]`, `all_sizes[i][j]` bytes) lands at offset
    /// `all_offsets[i][j]` of the object. Per key the bytes written or the
    /// failure; see the module doc for the rules.
    ///
    /// # Safety
    /// Every buffer of `bufs` must be readable for the duration of the call.
    pub unsafe fn batch_put_from_multi_buffer_ranges(
        &self,
        keys: &[String],
        bufs: SrcLists<'_>,
        all_offsets: &[Vec<usize>],
    ) -> Result<Vec<Result<u64>>> {
        let (all_ptrs, all_sizes) = (bufs.ptrs, bufs.sizes);
        check_lists(keys, all_ptrs, all_sizes, all_offsets, "all_dst_offsets")?;
        let mut out: Vec<Result<u64>> = Vec::with_capacity(keys.len());
        // Per range: its source piece, where it lands, the key's session.
        let mut pieces: Vec<Pieces> = Vec::new();
        let mut at: Vec<(u64, Arc<PutSession>, usize)> = Vec::new();
        {
            let puts = self.sessions.puts.lock();
            for (i, key) in keys.iter().enumerate() {
                let Some(s) = puts.get(key) else {
                    out.push(Err(no_put_session()));
                    continue;
                };
                let r = ranges_of(&all_ptrs[i], &all_sizes[i], &all_offsets[i], s.size);
                out.push(match r {
                    Err(e) => Err(e),
                    Ok(_) if all_ptrs[i].is_empty() => Err(Error::new(
                        ErrorCode::InvalidReplica,
                        "no ranges to write for this key",
                    )),
                    Ok(ranges) => {
                        let total = ranges.iter().map(|r| r.1).sum();
                        for (p, n, off) in ranges {
                            pieces.push(vec![(p, n)]);
                            at.push((off, Arc::clone(s), i));
                        }
                        Ok(total)
                    }
                });
            }
        }
        if pieces.is_empty() {
            return Ok(out);
        }
        let jobs: Vec<(&Pieces, u64, &[ReplicaLoc])> = pieces
            .iter()
            .zip(&at)
            .map(|(p, (off, s, _))| (p, *off, s.locs.as_slice()))
            .collect();
        // SAFETY: the caller vouches for every source range; each range lies
        // inside its reserved object (checked by `ranges_of`).
        let written = unsafe { self.write_located(&jobs) };
        for (w, (_, _, i)) in written.into_iter().zip(&at) {
            if let Err((e, seg)) = w {
                if out[*i].is_ok() {
                    let on = seg.as_deref().unwrap_or("?");
                    out[*i] = Err(Error::new(
                        ErrorCode::TransferFail,
                        format!("replica write to {on} failed ({e})"),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Make each key's object readable (`batch_put_session_end`): one
    /// PutEnd for the keys with a put session; INVALID_PARAMS for a key
    /// without one. A key given twice gets its first answer.
    pub fn batch_put_session_end(&self, keys: &[String]) -> Vec<Result<()>> {
        per_distinct(keys, |keys| {
            let taken = self.take_put_sessions(keys);
            let mut out: Vec<Result<()>> = Vec::with_capacity(keys.len());
            let mut ended: Vec<String> = Vec::new();
            let mut ended_versions: Vec<u64> = Vec::new();
            let mut segments: Vec<Arc<str>> = Vec::new();
            for (k, s) in keys.iter().zip(&taken) {
                match s {
                    None => out.push(Err(no_put_session())),
                    Some(s) => {
                        out.push(Ok(()));
                        ended.push(k.clone());
                        ended_versions.push(s.version);
                        for l in &s.locs {
                            if !segments.contains(&l.segment_name) {
                                segments.push(l.segment_name.clone());
                            }
                        }
                    }
                }
            }
            if !ended.is_empty() {
                if let Err(e) = self.end_puts(ended, ended_versions, &segments) {
                    for (r, s) in out.iter_mut().zip(&taken) {
                        if s.is_some() {
                            *r = Err(Error::from(e).context("PutEnd"));
                        }
                    }
                }
            }
            out
        })
    }

    /// Give up each key's reserved object (`batch_put_session_revoke`): one
    /// PutRevoke for the keys with a put session (their space is freed);
    /// INVALID_PARAMS for a key without one.
    pub fn batch_put_session_revoke(&self, keys: &[String]) -> Vec<Result<()>> {
        per_distinct(keys, |keys| {
            let taken = self.take_put_sessions(keys);
            let (revoked, versions): (Vec<String>, Vec<u64>) = keys
                .iter()
                .zip(&taken)
                .filter_map(|(k, s)| s.as_ref().map(|s| (k.clone(), s.version)))
                .unzip();
            let sent = if revoked.is_empty() {
                Ok(())
            } else {
                match self.rpc(MasterRequest::PutRevoke {
                    keys: revoked,
                    versions,
                }) {
                    Ok(MasterResponse::Err(e)) | Err(e) => Err(Error::from(e).context("PutRevoke")),
                    Ok(_) => Ok(()),
                }
            };
            taken
                .iter()
                .map(|s| match s {
                    None => Err(no_put_session()),
                    Some(_) => sent.clone(),
                })
                .collect()
        })
    }

    fn take_put_sessions(&self, keys: &[String]) -> Vec<Option<Arc<PutSession>>> {
        let mut puts = self.sessions.puts.lock();
        keys.iter().map(|k| puts.remove(k)).collect()
    }

    /// Look each key up once and cache its replicas and lease
    /// (`batch_get_session_start`): one lookup for the batch. A key that
    /// already has a get session gets a fresh one. An empty or missing key
    /// is OBJECT_NOT_FOUND, a key still being written REPLICA_IS_NOT_READY.
    pub fn batch_get_session_start(&self, keys: &[String]) -> Vec<Result<()>> {
        let lk = self.lookup(keys, true);
        let mut finished = Vec::new();
        let mut out = Vec::with_capacity(keys.len());
        {
            let mut gets = self.sessions.gets.lock();
            for (k, info) in keys.iter().zip(lk.infos) {
                out.push(match info {
                    Err(_) if k.is_empty() => {
                        Err(Error::new(ErrorCode::ObjectNotFound, "empty key"))
                    }
                    Err(e) => Err(e),
                    Ok(info) => {
                        let s = GetSession {
                            info,
                            deadline: lk.deadline,
                            ticket: lk.ticket,
                        };
                        finished.extend(gets.insert(k.clone(), s));
                        Ok(())
                    }
                });
            }
        }
        for t in finished {
            self.read_finished(t);
        }
        out
    }

    /// Read ranges of each key's object through its get session
    /// (`batch_get_into_multi_buffer_ranges`): key `i`'s bytes at offset
    /// `all_offsets[i][j]` land in buffer `all_ptrs[i][j]`
    /// (`all_sizes[i][j]` bytes). Per key the bytes read or the failure;
    /// see the module doc for the rules.
    ///
    /// # Safety
    /// Every buffer of `bufs` must be writable for the duration of the call.
    pub unsafe fn batch_get_into_multi_buffer_ranges(
        &self,
        keys: &[String],
        bufs: DstLists<'_>,
        all_offsets: &[Vec<usize>],
    ) -> Result<Vec<Result<u64>>> {
        let (all_ptrs, all_sizes) = (bufs.ptrs, bufs.sizes);
        check_lists(keys, all_ptrs, all_sizes, all_offsets, "all_src_offsets")?;
        let now = Instant::now();
        let mut out: Vec<Result<u64>> = Vec::with_capacity(keys.len());
        let mut sessions: Vec<Arc<GetSession>> = Vec::new();
        let mut ops: Vec<RangeOp> = Vec::new();
        let mut op_key: Vec<usize> = Vec::new();
        // Per key: its entry in `sessions` when it reads anything.
        let mut key_session: Vec<Option<usize>> = vec![None; keys.len()];
        let mut finished = Vec::new();
        {
            let mut gets = self.sessions.gets.lock();
            for (i, key) in keys.iter().enumerate() {
                let Some(s) = gets.keys.get(key).cloned() else {
                    out.push(Err(no_get_session()));
                    continue;
                };
                if now > s.deadline {
                    finished.extend(gets.remove(key));
                    out.push(Err(Error::new(
                        ErrorCode::LeaseExpired,
                        "the get session's lease ran out; session ended",
                    )));
                    continue;
                }
                match ranges_of(&all_ptrs[i], &all_sizes[i], &all_offsets[i], s.info.size) {
                    Err(e) => out.push(Err(e)),
                    Ok(ranges) => {
                        let k = sessions.len();
                        sessions.push(s);
                        key_session[i] = Some(k);
                        out.push(Ok(ranges.iter().map(|r| r.1).sum()));
                        for (dst, len, src) in ranges {
                            ops.push(RangeOp {
                                key: k,
                                src,
                                dst,
                                len,
                                ..RangeOp::ONE_ROW
                            });
                            op_key.push(i);
                        }
                    }
                }
            }
        }
        for t in finished.drain(..) {
            self.read_finished(t);
        }
        if ops.is_empty() {
            return Ok(out);
        }
        let infos: Vec<&ObjectInfo> = sessions.iter().map(|s| &s.info).collect();
        // SAFETY: the caller vouches for every destination; each range lies
        // inside its object (checked by `ranges_of`).
        let errs = unsafe { self.read_ranges(&infos, &ops) };
        for (e, &i) in errs.iter().zip(&op_key) {
            if let Some(e) = e {
                out[i] = Err(e.clone().context("ranged read"));
            }
        }
        // A copy that ended after the lease ran out may have read replaced
        // bytes: LEASE_EXPIRED, and the session ends (unless a fresh one
        // replaced it meanwhile).
        let end = Instant::now();
        let late: Vec<(usize, &Arc<GetSession>)> = key_session
            .iter()
            .enumerate()
            .filter_map(|(i, k)| k.map(|k| (i, &sessions[k])))
            .filter(|(i, s)| out[*i].is_ok() && end > s.deadline)
            .collect();
        if !late.is_empty() {
            let mut gets = self.sessions.gets.lock();
            for (i, s) in late {
                if gets.keys.get(&keys[i]).is_some_and(|c| Arc::ptr_eq(c, s)) {
                    finished.extend(gets.remove(&keys[i]));
                }
                out[i] = Err(Error::new(
                    ErrorCode::LeaseExpired,
                    "the lease ran out during the read; session ended",
                ));
            }
        }
        for t in finished {
            self.read_finished(t);
        }
        Ok(out)
    }

    /// Drop each key's get session (`batch_get_session_end`); keys without
    /// one are ignored (upstream answers 0 for them too).
    pub fn batch_get_session_end(&self, keys: &[String]) -> Result<()> {
        let finished: Vec<u64> = {
            let mut gets = self.sessions.gets.lock();
            keys.iter().filter_map(|k| gets.remove(k)).collect()
        };
        for t in finished {
            self.read_finished(t);
        }
        Ok(())
    }

    /// At close: revoke every open put session and drop every get session.
    pub(crate) fn close_sessions(&self) {
        let (puts, versions): (Vec<String>, Vec<u64>) = self
            .sessions
            .puts
            .lock()
            .drain()
            .map(|(k, s)| (k, s.version))
            .unzip();
        let tickets: Vec<u64> = {
            let mut gets = self.sessions.gets.lock();
            gets.keys.clear();
            gets.tickets
                .drain()
                .map(|(t, _)| t)
                .filter(|&t| t != 0)
                .collect()
        };
        for t in tickets {
            self.read_finished(t);
        }
        if !puts.is_empty() {
            tracing::info!(
                keys = puts.len(),
                "revoking put sessions left open at close"
            );
            let _ = self.master.call(&MasterRequest::PutRevoke {
                keys: puts,
                versions,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_against_the_object() {
        let r = ranges_of(&[8, 16, 24], &[4, 0, 4], &[0, 99, 12], 16).unwrap();
        assert_eq!(r, vec![(8, 4, 0), (24, 4, 12)]);
        let e = ranges_of(&[8], &[4], &[13], 16).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidParams);
        assert!(e.reason().contains("ends past the object"), "{e}");
        let e = ranges_of(&[8], &[4], &[usize::MAX], 16).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidParams);
        let e = ranges_of(&[0], &[4], &[0], 16).unwrap_err();
        assert!(e.reason().contains("null"), "{e}");
        let e = ranges_of(&[8, 9], &[4], &[0], 16).unwrap_err();
        assert!(e.reason().contains("2 buffer pointers, 1 sizes"), "{e}");
        assert!(ranges_of(&[], &[], &[], 16).unwrap().is_empty());
    }

    #[test]
    fn repeated_keys_get_their_first_answer() {
        let keys: Vec<String> = ["a", "b", "a"].iter().map(|s| s.to_string()).collect();
        let r = per_distinct(&keys, |d| {
            assert_eq!(d, ["a", "b"]);
            vec![Ok(1), Err(Error::invalid("x"))]
        });
        assert_eq!(r[0], Ok(1));
        assert!(r[1].is_err());
        assert_eq!(r[2], Ok(1));
    }
}
