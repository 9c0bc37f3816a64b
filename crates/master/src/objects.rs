//! Object operations on the master: put/upsert start-end-revoke, replica
//! lookup with leases, existence checks and removal.

use crate::placement;
use crate::state::{
    flag_eviction, is_non_ecmascript, pending_pin, MasterState, ObjStatus, Object, PendingPin,
};
use mooncake_common::proto::{ObjectInfo, PutStartItem, SoftPin, WriteConfig};
use mooncake_common::ErrorCode;
use std::collections::HashSet;
use std::time::{Duration, Instant};

impl MasterState {
    fn validate_write(&self, key: &str, size: u64, cfg: &WriteConfig) -> Result<(), ErrorCode> {
        if key.is_empty() || size == 0 || cfg.replica_num == 0 {
            return Err(ErrorCode::InvalidParams);
        }
        if let Some(ttl) = cfg.soft_pin_ttl_ms {
            if cfg.soft_pin != SoftPin::Enable || ttl > self.cfg.max_kv_soft_pin_ttl_ms {
                return Err(ErrorCode::InvalidParams);
            }
        }
        Ok(())
    }

    /// Begin writes; see spec §3.1 (put) and §3.3 (upsert).
    pub fn put_start(
        &self,
        keys: &[String],
        sizes: &[u64],
        cfg: &WriteConfig,
        upsert: bool,
    ) -> Vec<PutStartItem> {
        let mut out = Vec::with_capacity(keys.len());
        if keys.len() != sizes.len() {
            return keys
                .iter()
                .map(|_| PutStartItem::Err(ErrorCode::InvalidParams))
                .collect();
        }
        let now = Instant::now();
        let discard = Duration::from_secs(self.cfg.put_start_discard_timeout_sec);
        let release = Duration::from_secs(self.cfg.put_start_release_timeout_sec);
        let pin = pending_pin(
            cfg.soft_pin,
            cfg.soft_pin_ttl_ms,
            self.cfg.default_kv_soft_pin_ttl_ms,
        );
        let mut g = self.inner.lock();
        let mut seen = HashSet::new();
        for (key, &size) in keys.iter().zip(sizes) {
            self.metrics.put_start_requests.inc();
            if let Err(e) = self.validate_write(key, size, cfg) {
                self.metrics.put_start_failures.inc();
                out.push(PutStartItem::Err(e));
                continue;
            }
            if !seen.insert(key.as_str()) {
                out.push(PutStartItem::AlreadyExists);
                continue;
            }
            let mut hard_pin = cfg.hard_pin;
            let mut soft_deadline = None;
            if let Some(o) = g.objects.get(key) {
                let young = now.duration_since(o.put_start) <= discard;
                match (o.status, upsert) {
                    (ObjStatus::Complete, false) => {
                        out.push(PutStartItem::AlreadyExists);
                        continue;
                    }
                    (ObjStatus::Processing, false) if young => {
                        out.push(PutStartItem::AlreadyExists);
                        continue;
                    }
                    (ObjStatus::Processing, true) if young => {
                        self.metrics.put_start_failures.inc();
                        out.push(PutStartItem::Err(ErrorCode::ObjectReplicaBusy));
                        continue;
                    }
                    (ObjStatus::Processing, _) => {
                        g.discard_processing(key, release);
                    }
                    (ObjStatus::Complete, true) => {
                        hard_pin |= o.hard_pin;
                        soft_deadline = o.soft_pin_deadline;
                        if o.size == size {
                            // Case B: in place.
                            let locs: Vec<_> = o
                                .replicas
                                .iter()
                                .filter_map(|r| g.replica_loc(r, size))
                                .collect();
                            if let Some(o) = g.objects.get_mut(key) {
                                o.status = ObjStatus::Processing;
                                o.put_start = now;
                                o.hard_pin = hard_pin;
                                o.pending_pin = pin;
                            }
                            out.push(PutStartItem::Write(locs));
                            continue;
                        }
                        // Case C: different size, discard old replicas.
                        if let Some(old) = g.objects.remove(key) {
                            g.free_replicas(&old.replicas, old.size);
                        }
                    }
                }
            }
            let replicas = placement::allocate(&mut g, size, cfg, self.cfg.allocation_strategy);
            if replicas.is_empty() {
                self.metrics.put_start_failures.inc();
                self.metrics.put_start_alloc_failures.inc();
                flag_eviction(self);
                out.push(PutStartItem::Err(ErrorCode::NoAvailableHandle));
                continue;
            }
            if replicas.len() < cfg.replica_num as usize {
                self.metrics.put_start_partial_allocations.inc();
                tracing::warn!(key = %key, wanted = cfg.replica_num, got = replicas.len(), "partial replica allocation");
            }
            let locs: Vec<_> = replicas
                .iter()
                .filter_map(|r| g.replica_loc(r, size))
                .collect();
            g.objects.insert(
                key.clone(),
                Object {
                    size,
                    replicas,
                    status: ObjStatus::Processing,
                    lease_deadline: now,
                    soft_pin_deadline: soft_deadline,
                    hard_pin,
                    put_start: now,
                    pending_pin: pin,
                },
            );
            out.push(PutStartItem::Write(locs));
        }
        out
    }

    /// Commit writes: replicas become COMPLETE, soft-pin actions apply.
    pub fn put_end(&self, keys: &[String]) {
        let now = Instant::now();
        let mut g = self.inner.lock();
        for k in keys {
            if let Some(o) = g.objects.get_mut(k) {
                if o.status == ObjStatus::Processing {
                    o.status = ObjStatus::Complete;
                    match o.pending_pin {
                        PendingPin::Keep => {}
                        PendingPin::Clear => o.soft_pin_deadline = None,
                        PendingPin::Set(ms) => {
                            o.soft_pin_deadline = Some(now + Duration::from_millis(ms))
                        }
                    }
                    o.pending_pin = PendingPin::Keep;
                }
            }
        }
    }

    /// Revoke failed writes: free their replicas and erase the metadata.
    pub fn put_revoke(&self, keys: &[String]) {
        let mut g = self.inner.lock();
        for k in keys {
            let processing = g
                .objects
                .get(k)
                .is_some_and(|o| o.status == ObjStatus::Processing);
            if processing {
                if let Some(o) = g.objects.remove(k) {
                    g.free_replicas(&o.replicas, o.size);
                }
            }
        }
    }

    /// COMPLETE replicas per key, granting a lease to each found key.
    pub fn get_replica_list(&self, keys: &[String]) -> Vec<Result<ObjectInfo, ErrorCode>> {
        let ttl = self.cfg.default_kv_lease_ttl_ms;
        let now = Instant::now();
        let mut g = self.inner.lock();
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            self.metrics.get_replica_list_requests.inc();
            let info = match g.objects.get_mut(k) {
                None => Err(ErrorCode::ObjectNotFound),
                Some(o) if o.status != ObjStatus::Complete => Err(ErrorCode::ReplicaIsNotReady),
                Some(o) => {
                    let d = now + Duration::from_millis(ttl);
                    if d > o.lease_deadline {
                        o.lease_deadline = d;
                    }
                    Ok((o.size, o.replicas.clone()))
                }
            };
            out.push(info.map(|(size, reps)| ObjectInfo {
                size,
                replicas: reps.iter().filter_map(|r| g.replica_loc(r, size)).collect(),
                lease_ttl_ms: ttl,
            }));
        }
        out
    }

    /// 1 when a COMPLETE replica exists (and grant a lease), else 0.
    pub fn exist(&self, keys: &[String]) -> Vec<i32> {
        let ttl = Duration::from_millis(self.cfg.default_kv_lease_ttl_ms);
        let now = Instant::now();
        let mut g = self.inner.lock();
        keys.iter()
            .map(|k| match g.objects.get_mut(k) {
                Some(o) if o.status == ObjStatus::Complete => {
                    if now + ttl > o.lease_deadline {
                        o.lease_deadline = now + ttl;
                    }
                    1
                }
                _ => 0,
            })
            .collect()
    }

    /// Remove keys; see spec §2.6.
    pub fn remove(&self, keys: &[String], force: bool) -> Vec<i32> {
        let now = Instant::now();
        let mut g = self.inner.lock();
        keys.iter()
            .map(|k| {
                self.metrics.remove_requests.inc();
                let code = match g.objects.get(k) {
                    None => Some(ErrorCode::ObjectNotFound),
                    Some(o) if o.status != ObjStatus::Complete => {
                        Some(ErrorCode::ReplicaIsNotReady)
                    }
                    Some(o) if !force && o.lease_deadline > now => Some(ErrorCode::ObjectHasLease),
                    Some(_) => None,
                };
                match code {
                    Some(e) => e.code(),
                    None => {
                        if let Some(o) = g.objects.remove(k) {
                            g.free_replicas(&o.replicas, o.size);
                        }
                        0
                    }
                }
            })
            .collect()
    }

    /// Remove every key the pattern matches (search semantics); count, or -600.
    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> i64 {
        if is_non_ecmascript(pattern) {
            return ErrorCode::InvalidParams.code() as i64;
        }
        let Ok(re) = regex::Regex::new(pattern) else {
            return ErrorCode::InvalidParams.code() as i64;
        };
        self.remove_matching(|k| re.is_match(k), force)
    }

    /// Remove every removable key; count.
    pub fn remove_all(&self, force: bool) -> i64 {
        self.remove_matching(|_| true, force)
    }

    fn remove_matching(&self, pred: impl Fn(&str) -> bool, force: bool) -> i64 {
        let now = Instant::now();
        let mut g = self.inner.lock();
        let victims: Vec<String> = g
            .objects
            .iter()
            .filter(|(k, o)| {
                pred(k) && o.status == ObjStatus::Complete && (force || o.lease_deadline <= now)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &victims {
            if let Some(o) = g.objects.remove(k) {
                g.free_replicas(&o.replicas, o.size);
            }
        }
        victims.len() as i64
    }
}
