//! Read paths: replica lookup (one RPC per call, granting leases), replica
//! choice (own segment, same host, remote), staged and direct reads, and
//! the lease-deadline check after each copy.

use crate::client::{Client, StagedValue};
use crate::writes::seg_ref;
use mooncake_common::proto::{MasterRequest, MasterResponse, ObjectInfo, ReplicaLoc};
use mooncake_common::ErrorCode;
use mooncake_transfer::{Op, Path};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Replica lookups with the instant the lease runs out.
pub(crate) struct Lookup {
    pub infos: Vec<Result<ObjectInfo, ErrorCode>>,
    pub deadline: Instant,
    /// Read ticket to report when the copies are done (0 = none).
    pub ticket: u64,
}

impl Client {
    pub(crate) fn count_read(&self, path: Path, n: u64) {
        let c = match path {
            Path::Local => &self.stats.bytes_read_local,
            Path::SameHost => &self.stats.bytes_read_same_host,
            Path::Tcp => &self.stats.bytes_read_tcp,
        };
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// One GetReplicaList RPC for `keys`. With `track`, the found objects
    /// count as being read until [`Client::read_finished`] gets the ticket.
    pub(crate) fn lookup(&self, keys: &[String], track: bool) -> Lookup {
        let t0 = Instant::now();
        let infos = match self.rpc(MasterRequest::GetReplicaList {
            keys: keys.to_vec(),
            track,
        }) {
            Ok(MasterResponse::Objects(v)) if v.len() == keys.len() => v,
            Ok(MasterResponse::Err(e)) | Err(e) => keys.iter().map(|_| Err(e)).collect(),
            Ok(_) => keys.iter().map(|_| Err(ErrorCode::InternalError)).collect(),
        };
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
        v.sort_by_key(|r| match self.engine.preferred_path(&seg_ref(r)) {
            Path::Local => 0,
            Path::SameHost => 1,
            Path::Tcp => 2,
        });
        v
    }

    /// Read a whole object into `dst`, trying replicas in order (skipping
    /// the segment `skip`, which already failed).
    pub(crate) unsafe fn read_object_skip(
        &self,
        info: &ObjectInfo,
        dst: usize,
        skip: Option<&str>,
    ) -> Result<(), ErrorCode> {
        let mut last = ErrorCode::InvalidReplica;
        for r in self.ordered(info) {
            if skip == Some(r.segment_uuid.as_str()) {
                last = ErrorCode::TransferFail;
                continue;
            }
            let ops = [Op {
                seg_offset: r.offset,
                local_ptr: dst,
                len: info.size,
            }];
            match self.engine.read(&seg_ref(r), &ops) {
                Ok(path) => {
                    self.count_read(path, info.size);
                    return Ok(());
                }
                Err(e) => {
                    tracing::info!(segment = %r.segment_name, error = %e, "replica read failed; trying next");
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// Read a whole object into `dst`, trying replicas in order.
    pub(crate) unsafe fn read_object(
        &self,
        info: &ObjectInfo,
        dst: usize,
    ) -> Result<(), ErrorCode> {
        self.read_object_skip(info, dst, None)
    }

    /// Read whole objects: `items[i] = (info, dst)`. Objects whose preferred
    /// replica is on a TCP owner are batched, one scatter/gather request per
    /// owner, owners in parallel; the rest are copied directly. A failed
    /// owner request falls back to each object's other replicas.
    pub(crate) unsafe fn read_objects(
        &self,
        items: &[(&ObjectInfo, usize)],
    ) -> Vec<Result<(), ErrorCode>> {
        let mut out: Vec<Result<(), ErrorCode>> = vec![Ok(()); items.len()];
        struct Group<'a> {
            rep: &'a ReplicaLoc,
            ops: Vec<Op>,
            idx: Vec<usize>,
        }
        let mut groups: Vec<Group> = Vec::new();
        for (i, (info, dst)) in items.iter().enumerate() {
            let first = self.ordered(info).first().copied();
            match first {
                Some(r) if self.engine.preferred_path(&seg_ref(r)) == Path::Tcp => {
                    let op = Op {
                        seg_offset: r.offset,
                        local_ptr: *dst,
                        len: info.size,
                    };
                    match groups
                        .iter_mut()
                        .find(|g| g.rep.segment_uuid == r.segment_uuid)
                    {
                        Some(g) => {
                            g.ops.push(op);
                            g.idx.push(i);
                        }
                        None => groups.push(Group {
                            rep: r,
                            ops: vec![op],
                            idx: vec![i],
                        }),
                    }
                }
                _ => out[i] = self.read_object(info, *dst),
            }
        }
        let run = |g: &Group| -> Result<(), ErrorCode> {
            let path = self.engine.read(&seg_ref(g.rep), &g.ops)?;
            self.count_read(path, g.ops.iter().map(|o| o.len).sum());
            Ok(())
        };
        let results: Vec<Result<(), ErrorCode>> = if groups.len() <= 1 {
            groups.iter().map(run).collect()
        } else {
            std::thread::scope(|sc| {
                let hs: Vec<_> = groups.iter().map(|g| sc.spawn(move || run(g))).collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or(Err(ErrorCode::InternalError)))
                    .collect()
            })
        };
        for (g, r) in groups.iter().zip(results) {
            if let Err(e) = r {
                tracing::info!(segment = %g.rep.segment_name, error = %e, "batched read failed; trying other replicas");
                for &i in &g.idx {
                    let (info, dst) = items[i];
                    out[i] = self.read_object_skip(info, dst, Some(&g.rep.segment_uuid));
                }
            }
        }
        out
    }

    fn check_lease(deadline: Instant) -> Result<(), ErrorCode> {
        if Instant::now() > deadline {
            Err(ErrorCode::LeaseExpired)
        } else {
            Ok(())
        }
    }

    /// Staged read (get/get_buffer): needs local-buffer space for the value.
    pub fn get(&self, key: &str) -> Result<StagedValue, ErrorCode> {
        self.get_batch(&[key.to_string()])
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError))
    }

    /// Staged batch read into owned vectors.
    pub fn get_batch(&self, keys: &[String]) -> Vec<Result<StagedValue, ErrorCode>> {
        let mut bufs: Vec<Option<Vec<u8>>> = Vec::new();
        let (res, reservations) = self.staged_with(keys, |sizes| {
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
                    bufs.push(p.map(|_| v));
                    p
                })
                .collect()
        });
        res.into_iter()
            .zip(reservations)
            .zip(bufs)
            .map(|((r, resv), buf)| {
                let n = r?;
                let mut data = buf.ok_or(ErrorCode::InternalError)?;
                // SAFETY: `n` bytes were written into the reserved capacity.
                unsafe { data.set_len(n as usize) };
                Ok(StagedValue {
                    data,
                    _reservation: resv,
                })
            })
            .collect()
    }

    /// Staged batch read into memory the caller allocates once the sizes
    /// are known: `alloc` gets one size (or error) per key and returns one
    /// destination per key (None = skip that key; it reports -600). Each
    /// value reserves local-buffer space for the duration of the call.
    /// Returns per key the size read or a code.
    ///
    /// The destinations returned by `alloc` must be writable for their
    /// key's size until this call returns.
    pub fn get_batch_with<A>(&self, keys: &[String], alloc: A) -> Vec<Result<u64, ErrorCode>>
    where
        A: FnOnce(&[Result<u64, ErrorCode>]) -> Vec<Option<usize>>,
    {
        self.staged_with(keys, alloc).0
    }

    #[allow(clippy::type_complexity)]
    fn staged_with<A>(
        &self,
        keys: &[String],
        alloc: A,
    ) -> (
        Vec<Result<u64, ErrorCode>>,
        Vec<Option<crate::staging::Reservation>>,
    )
    where
        A: FnOnce(&[Result<u64, ErrorCode>]) -> Vec<Option<usize>>,
    {
        let lk = self.lookup(keys, true);
        let mut reservations: Vec<Option<crate::staging::Reservation>> =
            Vec::with_capacity(keys.len());
        let sizes: Vec<Result<u64, ErrorCode>> = lk
            .infos
            .iter()
            .map(|i| match i {
                Err(e) => {
                    reservations.push(None);
                    Err(*e)
                }
                Ok(info) => match self.staging.reserve(info.size) {
                    Some(r) => {
                        reservations.push(Some(r));
                        Ok(info.size)
                    }
                    None => {
                        reservations.push(None);
                        Err(ErrorCode::InvalidParams)
                    }
                },
            })
            .collect();
        let mut dsts = alloc(&sizes);
        dsts.resize(keys.len(), None);
        let mut items: Vec<(&ObjectInfo, usize)> = Vec::new();
        let mut slot: Vec<usize> = Vec::new();
        let mut out: Vec<Result<u64, ErrorCode>> = Vec::with_capacity(keys.len());
        for (i, s) in sizes.iter().enumerate() {
            match (s, &lk.infos[i], dsts[i]) {
                (Ok(n), Ok(info), Some(d)) => {
                    out.push(Ok(*n));
                    items.push((info, d));
                    slot.push(i);
                }
                (Err(e), _, _) => out.push(Err(*e)),
                _ => out.push(Err(ErrorCode::InvalidParams)),
            }
        }
        // SAFETY: `alloc` vouches for each destination.
        let res = unsafe { self.read_objects(&items) };
        let lease = Self::check_lease(lk.deadline);
        self.read_finished(lk.ticket);
        for (r, i) in res.into_iter().zip(slot) {
            if let Err(e) = r.and(lease) {
                out[i] = Err(e);
            }
        }
        for (o, r) in out.iter().zip(reservations.iter_mut()) {
            if o.is_err() {
                *r = None;
            }
        }
        (out, reservations)
    }

    /// Read into caller memory; returns the object size or a negative code
    /// (-600 when `size` is smaller than the object, buffer untouched).
    ///
    /// # Safety
    /// `ptr..ptr+size` must be writable for the duration of the call.
    pub unsafe fn get_into(&self, key: &str, ptr: usize, size: usize) -> i64 {
        self.batch_get_into(&[key.to_string()], &[ptr], &[size])[0]
    }

    /// Batch read into caller memory; per item as `get_into`. Objects on
    /// the same TCP owner travel in one request.
    ///
    /// # Safety
    /// Every `ptrs[i]..+sizes[i]` must be writable for the duration of the call.
    pub unsafe fn batch_get_into(
        &self,
        keys: &[String],
        ptrs: &[usize],
        sizes: &[usize],
    ) -> Vec<i64> {
        if keys.len() != ptrs.len() || keys.len() != sizes.len() {
            return vec![ErrorCode::InvalidParams.code() as i64; keys.len()];
        }
        if keys.is_empty() {
            return Vec::new();
        }
        let lk = self.lookup(keys, true);
        let mut out: Vec<i64> = Vec::with_capacity(keys.len());
        let mut items: Vec<(&ObjectInfo, usize)> = Vec::new();
        let mut slot: Vec<usize> = Vec::new();
        for (i, info) in lk.infos.iter().enumerate() {
            match info {
                Err(e) => out.push(e.code() as i64),
                Ok(x) if (sizes[i] as u64) < x.size || ptrs[i] == 0 => {
                    out.push(ErrorCode::InvalidParams.code() as i64)
                }
                Ok(x) => {
                    out.push(x.size as i64);
                    items.push((x, ptrs[i]));
                    slot.push(i);
                }
            }
        }
        let res = self.read_objects(&items);
        let lease = Self::check_lease(lk.deadline);
        self.read_finished(lk.ticket);
        for (r, i) in res.into_iter().zip(slot) {
            if let Err(e) = r.and(lease) {
                out[i] = e.code() as i64;
            }
        }
        out
    }

    /// Object size (grants a lease) or a negative code.
    pub fn get_size(&self, key: &str) -> i64 {
        match self.lookup(&[key.to_string()], false).infos.pop() {
            Some(Ok(i)) => i.size as i64,
            Some(Err(e)) => e.code() as i64,
            None => ErrorCode::InternalError.code() as i64,
        }
    }

    /// 1/0 per key, negative on error (grants a lease on 1).
    pub fn is_exist(&self, keys: &[String]) -> Vec<i32> {
        if keys.is_empty() {
            return Vec::new();
        }
        self.codes_rpc(
            MasterRequest::Exist {
                keys: keys.to_vec(),
            },
            keys.len(),
        )
    }

    /// Remove per key (0, -704, -706, -703).
    pub fn remove(&self, keys: &[String], force: bool) -> Vec<i32> {
        if keys.is_empty() {
            return Vec::new();
        }
        self.bump_mutations();
        self.codes_rpc(
            MasterRequest::Remove {
                keys: keys.to_vec(),
                force,
            },
            keys.len(),
        )
    }

    /// An RPC answered with one code per key; errors fill every slot.
    fn codes_rpc(&self, req: MasterRequest, n: usize) -> Vec<i32> {
        match self.rpc(req) {
            Ok(MasterResponse::Codes(c)) if c.len() == n => c,
            Ok(MasterResponse::Err(e)) | Err(e) => vec![e.code(); n],
            Ok(_) => vec![ErrorCode::InternalError.code(); n],
        }
    }

    fn count_rpc(&self, req: MasterRequest) -> i64 {
        match self.rpc(req) {
            Ok(MasterResponse::Count(n)) => n,
            Ok(MasterResponse::Err(e)) | Err(e) => e.code() as i64,
            Ok(_) => ErrorCode::InternalError.code() as i64,
        }
    }

    /// Count removed, or -600 for an invalid pattern.
    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> i64 {
        self.bump_mutations();
        self.count_rpc(MasterRequest::RemoveByRegex {
            pattern: pattern.to_string(),
            force,
        })
    }

    /// Count removed.
    pub fn remove_all(&self, force: bool) -> i64 {
        self.bump_mutations();
        self.count_rpc(MasterRequest::RemoveAll { force })
    }
}
