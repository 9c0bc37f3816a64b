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

    /// One GetReplicaList RPC for `keys`.
    pub(crate) fn lookup(&self, keys: &[String]) -> Lookup {
        let t0 = Instant::now();
        let infos = match self.rpc(&MasterRequest::GetReplicaList {
            keys: keys.to_vec(),
        }) {
            Ok(MasterResponse::Objects(v)) if v.len() == keys.len() => v,
            Ok(MasterResponse::Err(e)) | Err(e) => keys.iter().map(|_| Err(e)).collect(),
            Ok(_) => keys.iter().map(|_| Err(ErrorCode::InternalError)).collect(),
        };
        let ttl = infos
            .iter()
            .find_map(|i| i.as_ref().ok().map(|o| o.lease_ttl_ms))
            .unwrap_or(0);
        Lookup {
            infos,
            deadline: t0 + Duration::from_millis(ttl),
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

    /// Read a whole object into `dst`, trying replicas in order.
    pub(crate) unsafe fn read_object(
        &self,
        info: &ObjectInfo,
        dst: usize,
    ) -> Result<(), ErrorCode> {
        let mut last = ErrorCode::InvalidReplica;
        for r in self.ordered(info) {
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

    fn check_lease(deadline: Instant) -> Result<(), ErrorCode> {
        if Instant::now() > deadline {
            Err(ErrorCode::LeaseExpired)
        } else {
            Ok(())
        }
    }

    fn staged_read(&self, info: &ObjectInfo, deadline: Instant) -> Result<StagedValue, ErrorCode> {
        let r = self
            .staging
            .reserve(info.size)
            .ok_or(ErrorCode::InvalidParams)?;
        let mut data: Vec<u8> = Vec::with_capacity(info.size as usize);
        // SAFETY: capacity reserved; length set only after a full copy.
        unsafe {
            self.read_object(info, data.as_mut_ptr() as usize)?;
            data.set_len(info.size as usize);
        }
        Self::check_lease(deadline)?;
        Ok(StagedValue {
            data,
            _reservation: Some(r),
        })
    }

    /// Staged read (get/get_buffer): needs local-buffer space for the value.
    pub fn get(&self, key: &str) -> Result<StagedValue, ErrorCode> {
        self.get_batch(&[key.to_string()])
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError))
    }

    /// Staged batch read.
    pub fn get_batch(&self, keys: &[String]) -> Vec<Result<StagedValue, ErrorCode>> {
        let lk = self.lookup(keys);
        lk.infos
            .into_iter()
            .map(|i| i.and_then(|info| self.staged_read(&info, lk.deadline)))
            .collect()
    }

    /// Read into caller memory; returns the object size or a negative code
    /// (-600 when `size` is smaller than the object, buffer untouched).
    ///
    /// # Safety
    /// `ptr..ptr+size` must be writable for the duration of the call.
    pub unsafe fn get_into(&self, key: &str, ptr: usize, size: usize) -> i64 {
        self.batch_get_into(&[key.to_string()], &[ptr], &[size])[0]
    }

    /// Batch read into caller memory; per item as `get_into`.
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
        let lk = self.lookup(keys);
        lk.infos
            .iter()
            .enumerate()
            .map(|(i, info)| {
                let info = match info {
                    Ok(x) => x,
                    Err(e) => return e.code() as i64,
                };
                if (sizes[i] as u64) < info.size || ptrs[i] == 0 {
                    return ErrorCode::InvalidParams.code() as i64;
                }
                match self
                    .read_object(info, ptrs[i])
                    .and_then(|_| Self::check_lease(lk.deadline))
                {
                    Ok(()) => info.size as i64,
                    Err(e) => e.code() as i64,
                }
            })
            .collect()
    }

    /// Object size (grants a lease) or a negative code.
    pub fn get_size(&self, key: &str) -> i64 {
        match self.lookup(&[key.to_string()]).infos.pop() {
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
        match self.rpc(&req) {
            Ok(MasterResponse::Codes(c)) if c.len() == n => c,
            Ok(MasterResponse::Err(e)) | Err(e) => vec![e.code(); n],
            Ok(_) => vec![ErrorCode::InternalError.code(); n],
        }
    }

    fn count_rpc(&self, req: MasterRequest) -> i64 {
        match self.rpc(&req) {
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
