//! Read paths: replica lookup (one RPC per call, granting leases), replica
//! choice (own segment, same host, remote), staged and direct reads, and
//! the lease-deadline check after each copy; existence queries and removal.
//!
//! Per-key rules of the store's read and remove methods live here: an empty key fails
//! its item with INVALID_PARAMS and is never sent to the master; a
//! destination smaller than the object fails with INVALID_PARAMS and stays
//! untouched; a copy that ends after the lease ran out is LEASE_EXPIRED.

use crate::caller_mem::{Dst, Dsts, MemList};
use crate::client::{Client, StagedValue};
use crate::error::{Error, Result};
use crate::ops::only;
use crate::ops::ranges::RangeOp;
use crate::ops::writes::{check_key, seg_ref};
use mooncake_common::proto::{MasterRequest, MasterResponse, ObjectInfo, ReplicaLoc};
use mooncake_common::ErrorCode;
use mooncake_transfer::Path;
use std::time::{Duration, Instant};

/// Replica lookups with the instant the lease runs out.
pub(crate) struct Lookup {
    /// One entry per key asked for.
    pub(crate) infos: Vec<Result<ObjectInfo>>,
    /// When the granted leases run out.
    pub(crate) deadline: Instant,
    /// Read ticket to report when the copies are done (0 = none).
    pub(crate) ticket: u64,
}

/// Run `f` on the non-empty keys of `keys` only, and answer an empty key
/// with INVALID_PARAMS in its place (no RPC at all when none is left).
pub(crate) fn per_key<T>(
    keys: &[String],
    f: impl FnOnce(&[String]) -> Vec<Result<T>>,
) -> Vec<Result<T>> {
    if !keys.iter().any(String::is_empty) {
        return f(keys);
    }
    let sent: Vec<String> = keys.iter().filter(|k| !k.is_empty()).cloned().collect();
    let mut answers = if sent.is_empty() {
        Vec::new()
    } else {
        f(&sent)
    }
    .into_iter();
    keys.iter()
        .map(|k| match k.is_empty() {
            true => Err(Error::invalid("empty key")),
            false => answers
                .next()
                .unwrap_or_else(|| Err(Error::internal("missing answer"))),
        })
        .collect()
}

/// One result per key from the per-key codes of an Exist/Remove answer.
fn from_codes<T>(codes: Vec<i32>, ok: impl Fn(i32) -> T) -> Vec<Result<T>> {
    codes
        .into_iter()
        .map(|c| {
            if c >= 0 {
                Ok(ok(c))
            } else {
                Err(ErrorCode::from_code(c).into())
            }
        })
        .collect()
}

impl Client {
    /// Counts one engine read of `n` bytes (one request when over TCP).
    pub(crate) fn count_read(&self, path: Path, n: u64) {
        self.stats.read.count(path, n);
    }

    /// One GetReplicaList RPC for the non-empty `keys` (an empty key is
    /// INVALID_PARAMS in its place). With `track`, the found objects count
    /// as being read until [`Client::read_finished`] gets the ticket.
    pub(crate) fn lookup(&self, keys: &[String], track: bool) -> Lookup {
        let t0 = Instant::now();
        let infos = per_key(keys, |keys| {
            match self.rpc(MasterRequest::GetReplicaList {
                keys: keys.to_vec(),
                track,
            }) {
                Ok(MasterResponse::Objects(v)) if v.len() == keys.len() => {
                    v.into_iter().map(|i| i.map_err(Error::from)).collect()
                }
                Ok(MasterResponse::Err(e)) | Err(e) => vec![Err(e.into()); keys.len()],
                Ok(_) => vec![Err(Error::internal("unexpected replica list")); keys.len()],
            }
        });
        let ttl = infos
            .iter()
            .find_map(|i| i.as_ref().ok().map(|o| o.lease_ttl_ms))
            .unwrap_or(0);
        let ticket = infos
            .iter()
            .find_map(|i| i.as_ref().ok().map(|o| o.read_ticket))
            .unwrap_or(0);
        Lookup {
            infos,
            deadline: t0 + Duration::from_millis(ttl),
            ticket,
        }
    }

    /// Replicas in preference order: own process, same host, remote.
    pub(crate) fn ordered<'a>(&self, info: &'a ObjectInfo) -> Vec<&'a ReplicaLoc> {
        let mut v: Vec<&ReplicaLoc> = info.replicas.iter().collect();
        v.sort_by_key(|r| match self.data_path.preferred_path(&seg_ref(r)) {
            Path::Local => 0,
            Path::SameHost => 1,
            Path::Tcp => 2,
        });
        v
    }

    /// Read whole objects: `items[i] = (info, dst)`, through
    /// [`Client::read_ranges`]: one replica per object by path preference,
    /// one request (or one mapped copy pass) per owner segment, owners in
    /// parallel and large local groups over several threads; a failed owner
    /// falls back to each object's other replicas.
    ///
    /// # Safety
    /// Every `dst..dst+info.size` must be writable for the duration of the call.
    pub(crate) unsafe fn read_objects(&self, items: &[(&ObjectInfo, usize)]) -> Vec<Result<()>> {
        let infos: Vec<&ObjectInfo> = items.iter().map(|(info, _)| *info).collect();
        let ops: Vec<RangeOp> = items
            .iter()
            .enumerate()
            .map(|(key, (info, dst))| RangeOp {
                key,
                src: 0,
                dst: *dst,
                len: info.size,
                ..RangeOp::ONE_ROW
            })
            .collect();
        // SAFETY: the caller vouches for every destination.
        let errs = unsafe { self.read_ranges(&infos, &ops) };
        errs.into_iter().map(|e| e.map_or(Ok(()), Err)).collect()
    }

    /// [`Client::read_objects`] of objects `lk` found, then the end of
    /// `lk`'s lease: item `j`'s read failure, or the lease having run out
    /// meanwhile, replaces `out[slot[j]]`.
    ///
    /// # Safety
    /// As [`Client::read_objects`].
    unsafe fn read_leased(
        &self,
        lk: &Lookup,
        items: &[(&ObjectInfo, usize)],
        slot: Vec<usize>,
        out: &mut [Result<u64>],
    ) {
        // SAFETY: forwarded from the caller.
        let res = unsafe { self.read_objects(items) };
        let lease = Self::check_lease(lk.deadline);
        self.read_finished(lk.ticket);
        for (r, i) in res.into_iter().zip(slot) {
            if let Err(e) = r.and(lease.clone()) {
                out[i] = Err(e);
            }
        }
    }

    fn check_lease(deadline: Instant) -> Result<()> {
        if Instant::now() > deadline {
            Err(ErrorCode::LeaseExpired.into())
        } else {
            Ok(())
        }
    }

    /// Staged read (`get`/`get_buffer`): needs local-buffer room for the value.
    pub fn get(&self, key: &str) -> Result<StagedValue> {
        check_key(key)?;
        only(self.get_batch(&[key.to_string()]))
    }

    /// Staged batch read into owned vectors; one result per key.
    pub fn get_batch(&self, keys: &[String]) -> Vec<Result<StagedValue>> {
        let mut vals = OwnedValues::default();
        let (res, reservations) = self.staged_with(keys, true, |sizes| vals.alloc(sizes));
        vals.finish(res)
            .zip(reservations)
            .map(|(r, resv)| {
                r.map(|data| StagedValue {
                    data,
                    _reservation: resv,
                })
            })
            .collect()
    }

    /// Staged batch read into memory the caller allocates once the sizes
    /// are known: `alloc` gets one size (or error) per key and returns one
    /// destination per key (None = skip that key; it fails with
    /// INVALID_PARAMS). Each value reserves local-buffer space for the
    /// duration of the call. Returns per key the size read or the failure.
    ///
    /// The destinations returned by `alloc` must be writable for their
    /// key's size until this call returns.
    pub fn get_batch_with<A>(&self, keys: &[String], alloc: A) -> Vec<Result<u64>>
    where
        A: FnOnce(&[Result<u64>]) -> Vec<Option<usize>>,
    {
        self.staged_with(keys, true, alloc).0
    }

    /// [`Client::get_batch_with`] into destinations the caller stages in
    /// memory of its own (a standalone daemon reading for a dummy client,
    /// whose local buffer takes the values): the same rules, without a
    /// reservation in this client's local buffer.
    ///
    /// The destinations returned by `alloc` must be writable for their
    /// key's size until this call returns.
    pub fn get_batch_prestaged_with<A>(&self, keys: &[String], alloc: A) -> Vec<Result<u64>>
    where
        A: FnOnce(&[Result<u64>]) -> Vec<Option<usize>>,
    {
        self.staged_with(keys, false, alloc).0
    }

    #[allow(clippy::type_complexity)]
    fn staged_with<A>(
        &self,
        keys: &[String],
        reserve: bool,
        alloc: A,
    ) -> (Vec<Result<u64>>, Vec<Option<crate::staging::Reservation>>)
    where
        A: FnOnce(&[Result<u64>]) -> Vec<Option<usize>>,
    {
        let lk = self.lookup(keys, true);
        let mut reservations: Vec<Option<crate::staging::Reservation>> =
            Vec::with_capacity(keys.len());
        let sizes: Vec<Result<u64>> = lk
            .infos
            .iter()
            .map(|i| match i {
                Err(e) => {
                    reservations.push(None);
                    Err(e.clone())
                }
                Ok(info) if !reserve => {
                    reservations.push(None);
                    Ok(info.size)
                }
                Ok(info) => match self.staging.reserve(info.size) {
                    Some(r) => {
                        reservations.push(Some(r));
                        Ok(info.size)
                    }
                    None => {
                        reservations.push(None);
                        Err(Error::invalid(format!(
                            "the local buffer has no room for {} bytes (local_buffer_size)",
                            info.size
                        )))
                    }
                },
            })
            .collect();
        let mut dsts = alloc(&sizes);
        dsts.resize(keys.len(), None);
        let mut items: Vec<(&ObjectInfo, usize)> = Vec::new();
        let mut slot: Vec<usize> = Vec::new();
        let mut out: Vec<Result<u64>> = Vec::with_capacity(keys.len());
        for (i, s) in sizes.into_iter().enumerate() {
            match (s, &lk.infos[i], dsts[i]) {
                (Ok(n), Ok(info), Some(d)) => {
                    out.push(Ok(n));
                    items.push((info, d));
                    slot.push(i);
                }
                (Err(e), _, _) => out.push(Err(e)),
                _ => out.push(Err(Error::invalid("no destination for the value"))),
            }
        }
        // SAFETY: `alloc` vouches for each destination.
        unsafe { self.read_leased(&lk, &items, slot, &mut out) };
        for (o, r) in out.iter().zip(reservations.iter_mut()) {
            if o.is_err() {
                *r = None;
            }
        }
        (out, reservations)
    }

    /// Read `key` into caller memory; the object size. A `dst` shorter
    /// than the object is INVALID_PARAMS (the buffer stays untouched).
    ///
    /// # Safety
    /// `dst` must be writable for the duration of the call.
    pub unsafe fn get_into(&self, key: &str, dst: Dst) -> Result<u64> {
        check_key(key)?;
        let dsts = Dsts {
            ptrs: &[dst.ptr],
            sizes: &[dst.len],
        };
        // SAFETY: forwarded from the caller.
        only(unsafe { self.batch_get_into(&[key.to_string()], dsts)? })
    }

    /// Batch read into caller memory; per item as [`Client::get_into`].
    /// Lists of different lengths fail the whole call. Objects on the same
    /// TCP owner travel in one request.
    ///
    /// # Safety
    /// Every buffer of `dsts` must be writable for the duration of the call.
    pub unsafe fn batch_get_into(
        &self,
        keys: &[String],
        dsts: Dsts<'_>,
    ) -> Result<Vec<Result<u64>>> {
        let MemList { ptrs, sizes } = dsts;
        if keys.len() != ptrs.len() || keys.len() != sizes.len() {
            return Err(Error::invalid(
                "keys, buffer_ptrs and sizes differ in length",
            ));
        }
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let lk = self.lookup(keys, true);
        let mut out: Vec<Result<u64>> = Vec::with_capacity(keys.len());
        let mut items: Vec<(&ObjectInfo, usize)> = Vec::new();
        let mut slot: Vec<usize> = Vec::new();
        for (i, info) in lk.infos.iter().enumerate() {
            match info {
                Err(e) => out.push(Err(e.clone())),
                Ok(x) if (sizes[i] as u64) < x.size => out.push(Err(Error::invalid(format!(
                    "buffer of {} bytes is smaller than the object ({} bytes)",
                    sizes[i], x.size
                )))),
                Ok(_) if ptrs[i] == 0 => out.push(Err(Error::invalid("null buffer pointer"))),
                Ok(x) => {
                    out.push(Ok(x.size));
                    items.push((x, ptrs[i]));
                    slot.push(i);
                }
            }
        }
        // SAFETY: the caller vouches for every destination.
        unsafe { self.read_leased(&lk, &items, slot, &mut out) };
        Ok(out)
    }

    /// Object size (grants a lease).
    pub fn get_size(&self, key: &str) -> Result<u64> {
        check_key(key)?;
        only(self.lookup(&[key.to_string()], false).infos).map(|i| i.size)
    }

    /// Whether `key` has a complete replica (grants a lease when it has).
    pub fn is_exist(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        only(self.batch_is_exist(&[key.to_string()]))
    }

    /// [`Client::is_exist`] per key.
    pub fn batch_is_exist(&self, keys: &[String]) -> Vec<Result<bool>> {
        per_key(keys, |keys| {
            let req = MasterRequest::Exist {
                keys: keys.to_vec(),
            };
            from_codes(self.codes_rpc(req, keys.len()), |c| c == 1)
        })
    }

    /// Remove `key`: OBJECT_NOT_FOUND if missing, OBJECT_HAS_LEASE while a
    /// lease is active and not `force`, REPLICA_IS_NOT_READY if a replica
    /// is not complete (even with `force`).
    pub fn remove(&self, key: &str, force: bool) -> Result<()> {
        check_key(key)?;
        only(self.batch_remove(&[key.to_string()], force))
    }

    /// [`Client::remove`] per key (one RPC).
    pub fn batch_remove(&self, keys: &[String], force: bool) -> Vec<Result<()>> {
        per_key(keys, |keys| {
            self.bump_mutations();
            let req = MasterRequest::Remove {
                keys: keys.to_vec(),
                force,
            };
            from_codes(self.codes_rpc(req, keys.len()), |_| ())
        })
    }

    /// An RPC answered with one code per key; errors fill every slot.
    fn codes_rpc(&self, req: MasterRequest, n: usize) -> Vec<i32> {
        match self.rpc(req) {
            Ok(MasterResponse::Codes(c)) if c.len() == n => c,
            Ok(MasterResponse::Err(e)) | Err(e) => vec![e.code(); n],
            Ok(_) => vec![ErrorCode::InternalError.code(); n],
        }
    }

    fn count_rpc(&self, req: MasterRequest) -> Result<u64> {
        match self.rpc(req) {
            Ok(MasterResponse::Count(n)) => {
                u64::try_from(n).map_err(|_| ErrorCode::from_code(n as i32).into())
            }
            Ok(MasterResponse::Err(e)) | Err(e) => Err(e.into()),
            Ok(_) => Err(Error::internal("unexpected master response")),
        }
    }

    /// `batch_replica_clear`: clear the replicas of those of `keys` this
    /// client wrote and no lease protects, on `segment_name` only or on
    /// every segment (empty); the keys cleared.
    pub fn batch_replica_clear(&self, keys: &[String], segment_name: &str) -> Result<Vec<String>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        match self.rpc(MasterRequest::BatchReplicaClear {
            client_id: self.client_id.clone(),
            keys: keys.to_vec(),
            segment_name: segment_name.to_string(),
        })? {
            MasterResponse::Keys(k) => Ok(k),
            MasterResponse::Err(e) => Err(e.into()),
            _ => Err(Error::internal(
                "batch replica clear: unexpected master response",
            )),
        }
    }

    /// Remove the keys matching `pattern` (ECMAScript syntax, search
    /// semantics); the count removed. An invalid pattern is INVALID_PARAMS.
    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64> {
        self.bump_mutations();
        self.count_rpc(MasterRequest::RemoveByRegex {
            pattern: pattern.to_string(),
            force,
        })
        .map_err(|e| e.context(format!("pattern {pattern:?}")))
    }

    /// Remove every removable object; the count removed.
    pub fn remove_all(&self, force: bool) -> Result<u64> {
        self.bump_mutations();
        self.count_rpc(MasterRequest::RemoveAll { force })
    }
}

/// Whole values read into vectors allocated once their sizes are known:
/// [`OwnedValues::alloc`] is the `alloc` of a `get_batch_with`-style read,
/// [`OwnedValues::finish`] turns its per-key results into the values.
#[derive(Default)]
pub struct OwnedValues {
    bufs: Vec<Option<Vec<u8>>>,
}

impl OwnedValues {
    /// One destination per size: a vector with that capacity, or `None`
    /// for a failed key or an allocation that failed.
    pub fn alloc(&mut self, sizes: &[Result<u64>]) -> Vec<Option<usize>> {
        sizes
            .iter()
            .map(|s| {
                let mut v: Vec<u8> = Vec::new();
                let p = match s {
                    Ok(n) => v
                        .try_reserve_exact(*n as usize)
                        .ok()
                        .map(|_| v.as_mut_ptr() as usize),
                    Err(_) => None,
                };
                self.bufs.push(p.map(|_| v));
                p
            })
            .collect()
    }

    /// Per key the value holding the bytes the read reported, or the
    /// read's failure.
    ///
    /// `read` must be the results of the read `alloc` gave destinations to:
    /// each `Ok(n)` says `n` bytes (at most the size `alloc` got) were
    /// written into that key's vector.
    pub fn finish(self, read: Vec<Result<u64>>) -> impl Iterator<Item = Result<Vec<u8>>> {
        read.into_iter()
            .zip(self.bufs.into_iter().chain(std::iter::repeat_with(|| None)))
            .map(|(r, buf)| {
                let n = r?;
                let mut data = buf.ok_or_else(|| Error::internal("no destination"))?;
                if n as usize > data.capacity() {
                    return Err(Error::internal("read past its destination"));
                }
                // SAFETY: the read wrote `n` bytes into the reserved capacity
                // (`n` is within it, checked above).
                unsafe { data.set_len(n as usize) };
                Ok(data)
            })
    }
}
