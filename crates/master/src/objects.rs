//! Object operations on the master: put/upsert start-end-revoke, replica
//! lookup with leases, existence checks and removal.

use crate::ledger_push::{AckWait, ACK_TIMEOUT};
use crate::placement;
use crate::state::{
    flag_eviction, is_non_ecmascript, pending_pin, MasterState, ObjStatus, Object, PendingPin,
};
use mooncake_common::auth::unix_ms;
use mooncake_common::ledger::LedgerOp;
use mooncake_common::proto::{ObjectInfo, PutStartItem, ReplicaLoc, SoftPin, WriteConfig};
use mooncake_common::{ErrorCode, WriteTicket};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
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

    /// With a cluster token, sign each replica's range for the writer (a
    /// [`WriteTicket`] the owner's data server checks). The grant lasts as
    /// long as the put may stay in progress (`put_start_discard_timeout_sec`,
    /// at least 10 s).
    fn grant(&self, locs: &mut [ReplicaLoc]) {
        let Some(key) = &self.cfg.auth else {
            return;
        };
        let life_ms = self
            .cfg
            .put_start_discard_timeout_sec
            .max(10)
            .saturating_mul(1000);
        let expires = unix_ms().saturating_add(life_ms);
        for l in locs {
            l.ticket = Some(WriteTicket::sign(
                key,
                &l.segment_uuid,
                l.offset,
                l.size,
                expires,
            ));
        }
    }

    /// Begin writes; see spec §3.1 (put) and §3.3 (upsert).
    pub fn put_start(
        &self,
        keys: &[String],
        sizes: &[u64],
        cfg: &WriteConfig,
        upsert: bool,
    ) -> Vec<PutStartItem> {
        self.put_start_excluding(keys, sizes, cfg, upsert, &[])
    }

    /// [`MasterState::put_start`], never placing a new replica on a
    /// segment named in `exclude` (the writer failed to reach it).
    pub fn put_start_excluding(
        &self,
        keys: &[String],
        sizes: &[u64],
        cfg: &WriteConfig,
        upsert: bool,
        exclude: &[String],
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
        // Owners must forget replicas rewritten in place or discarded before
        // the writer gets the new locations.
        let mut waits = Vec::new();
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
                    (ObjStatus::Complete, true) if o.being_read(now) => {
                        // Overwriting (or freeing) replicas a reader is
                        // copying from would tear its read.
                        self.metrics.put_start_failures.inc();
                        out.push(PutStartItem::Err(ErrorCode::ObjectReplicaBusy));
                        continue;
                    }
                    (ObjStatus::Complete, true) => {
                        hard_pin |= o.hard_pin;
                        soft_deadline = o.soft_pin_deadline;
                        if o.size == size {
                            // Case B: in place.
                            let mut locs: Vec<_> = o
                                .replicas
                                .iter()
                                .filter_map(|r| g.replica_loc(r, size))
                                .collect();
                            self.grant(&mut locs);
                            waits.extend(g.forget_in_place(o));
                            let version = g.next_version();
                            if let Some(o) = g.objects.get_mut(key) {
                                o.status = ObjStatus::Processing;
                                o.put_start = now;
                                o.hard_pin = hard_pin;
                                o.pending_pin = pin;
                                o.version = version;
                            }
                            out.push(PutStartItem::Write(locs));
                            continue;
                        }
                        // Case C: different size, discard old replicas
                        // (their space returns once their owners forgot them).
                        if let Some(old) = g.objects.remove(key) {
                            waits.extend(g.forget_replicas(key, &old));
                        }
                    }
                }
            }
            let replicas =
                placement::allocate(&mut g, size, cfg, self.cfg.allocation_strategy, exclude);
            if replicas.is_empty() {
                self.metrics.put_start_failures.inc();
                self.metrics.put_start_alloc_failures.inc();
                // With no segment mounted (a restarted master or a new
                // leader before the remounts) space is not the reason:
                // flagging then would evict just-recovered objects as soon
                // as the first segment comes back.
                if g.usage().1 > 0 {
                    flag_eviction(self);
                }
                out.push(PutStartItem::Err(ErrorCode::NoAvailableHandle));
                continue;
            }
            if replicas.len() < cfg.replica_num as usize {
                self.metrics.put_start_partial_allocations.inc();
                tracing::warn!(key = %key, wanted = cfg.replica_num, got = replicas.len(), "partial replica allocation");
            }
            let mut locs: Vec<_> = replicas
                .iter()
                .filter_map(|r| g.replica_loc(r, size))
                .collect();
            self.grant(&mut locs);
            let version = g.next_version();
            g.objects.insert(
                key.clone(),
                Object {
                    size,
                    version,
                    replicas,
                    status: ObjStatus::Processing,
                    lease_deadline: now,
                    soft_pin_deadline: soft_deadline,
                    hard_pin,
                    put_start: now,
                    pending_pin: pin,
                    readers: Vec::new(),
                },
            );
            out.push(PutStartItem::Write(locs));
        }
        drop(g);
        self.await_owners(&waits);
        out
    }

    /// Commit writes: replicas become COMPLETE, soft-pin actions apply.
    /// The owners of the replicas record the commit first (and any forget of
    /// an earlier incarnation of the key is acknowledged), so a write is
    /// visible only once it survives the master.
    pub fn put_end(&self, keys: &[String]) -> Result<(), ErrorCode> {
        self.commit_end(keys, &[]).map(|_| ())
    }

    /// [`MasterState::put_end`], except that the ledger commits of replicas
    /// in `local` (the writer's own process's segments) are returned for the
    /// writer to record instead of being pushed and awaited.
    pub fn commit_end(
        &self,
        keys: &[String],
        local: &[String],
    ) -> Result<Vec<(String, LedgerOp)>, ErrorCode> {
        let now = Instant::now();
        let mut g = self.inner.lock();
        let mut forgets = Vec::new();
        let mut handed = Vec::new();
        // (key, version, commit waits tagged with their segment)
        let mut commits = Vec::with_capacity(keys.len());
        for k in keys {
            let Some(o) = g.objects.get(k) else { continue };
            if o.status != ObjStatus::Processing {
                continue;
            }
            let (w, h) = g.commit_replicas(k, o, now, local);
            handed.extend(h);
            commits.push((k, o.version, w));
            forgets.extend(g.take_key_forgets(k));
        }
        drop(g);
        // Wait for the owners; a replica whose owner did not confirm in time
        // is dropped, so no acknowledged write relies on an unrecorded copy.
        let deadline = Instant::now() + ACK_TIMEOUT;
        let mut unconfirmed: Vec<Vec<String>> = Vec::with_capacity(commits.len());
        for (_, _, waits) in &commits {
            let mut missing = Vec::new();
            for (seg, q, seq) in waits {
                if q.wait(*seq, deadline) == AckWait::Unconfirmed {
                    missing.push(seg.clone());
                }
            }
            unconfirmed.push(missing);
        }
        self.await_owners(&forgets);
        if self.is_stopped() {
            // The term ended while the owners were being told: this master
            // may no longer acknowledge writes.
            return Err(ErrorCode::UnavailableInCurrentStatus);
        }
        let now = Instant::now();
        let mut g = self.inner.lock();
        let mut lost = 0usize;
        for ((k, version, _), missing) in commits.into_iter().zip(unconfirmed) {
            let current = g
                .objects
                .get(k)
                .is_some_and(|o| o.status == ObjStatus::Processing && o.version == version);
            if !current {
                continue;
            }
            if !missing.is_empty() {
                self.metrics.ledger_unconfirmed.inc_by(missing.len() as u64);
                tracing::warn!(key = %k, segments = ?missing, "owners did not confirm the commit; dropping those replicas");
                g.drop_unconfirmed(k, &missing);
            }
            let Some(o) = g.objects.get_mut(k) else {
                lost += 1;
                continue;
            };
            o.status = ObjStatus::Complete;
            match o.pending_pin {
                PendingPin::Keep => {}
                PendingPin::Clear => o.soft_pin_deadline = None,
                PendingPin::Set(ms) => o.soft_pin_deadline = Some(now + Duration::from_millis(ms)),
            }
            o.pending_pin = PendingPin::Keep;
        }
        if lost > 0 {
            // No owner of any replica confirmed: the write is not durable
            // and was revoked.
            return Err(ErrorCode::RpcTimeout);
        }
        Ok(handed)
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

    /// COMPLETE replicas per key, granting a lease to each found key. With
    /// `track`, the found objects are marked as being read under one new
    /// read ticket (returned in every found [`ObjectInfo`]).
    pub fn get_replica_list(
        &self,
        keys: &[String],
        track: bool,
    ) -> Vec<Result<ObjectInfo, ErrorCode>> {
        self.get_replica_list_owned(keys.to_vec(), track)
    }

    /// [`MasterState::get_replica_list`] taking the keys by value (they
    /// become the ticket's key list without another copy).
    pub fn get_replica_list_owned(
        &self,
        keys: Vec<String>,
        track: bool,
    ) -> Vec<Result<ObjectInfo, ErrorCode>> {
        let ttl = self.cfg.default_kv_lease_ttl_ms;
        let now = Instant::now();
        let d = now + Duration::from_millis(ttl);
        let ticket = if track {
            self.next_ticket.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        let mut g = self.inner.lock();
        let mut out = Vec::with_capacity(keys.len());
        let mut any = false;
        for k in &keys {
            self.metrics.get_replica_list_requests.inc();
            let info = match g.objects.get_mut(k) {
                None => Err(ErrorCode::ObjectNotFound),
                Some(o) if o.status != ObjStatus::Complete => Err(ErrorCode::ReplicaIsNotReady),
                Some(o) => {
                    if d > o.lease_deadline {
                        o.lease_deadline = d;
                    }
                    if track {
                        o.readers.retain(|(_, exp)| *exp > now);
                        o.readers.push((ticket, d));
                        any = true;
                    }
                    Ok((o.size, o.replicas.clone()))
                }
            };
            out.push(info.map(|(size, reps)| ObjectInfo {
                size,
                replicas: reps.iter().filter_map(|r| g.replica_loc(r, size)).collect(),
                lease_ttl_ms: ttl,
                read_ticket: ticket,
            }));
        }
        if any {
            g.tickets.insert(ticket, (keys, d));
        }
        out
    }

    /// The reads of `tickets` finished: their objects are no longer being
    /// read by them. Unknown (expired, repeated) tickets are ignored.
    pub fn reads_done(&self, tickets: &[u64]) {
        if tickets.is_empty() {
            return;
        }
        let mut g = self.inner.lock();
        for t in tickets {
            let Some((keys, _)) = g.tickets.remove(t) else {
                continue;
            };
            for k in &keys {
                if let Some(o) = g.objects.get_mut(k) {
                    o.readers.retain(|(x, _)| x != t);
                }
            }
        }
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

    /// Remove keys; see spec §2.6. Answers once the owners forgot the
    /// removed replicas (a removed object never comes back with a master).
    pub fn remove(&self, keys: &[String], force: bool) -> Vec<i32> {
        let now = Instant::now();
        let mut g = self.inner.lock();
        let mut waits = Vec::new();
        let codes = keys
            .iter()
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
                            waits.extend(g.forget_replicas(k, &o));
                        }
                        0
                    }
                }
            })
            .collect();
        drop(g);
        self.await_owners(&waits);
        codes
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
        let mut waits = Vec::new();
        for k in &victims {
            if let Some(o) = g.objects.remove(k) {
                waits.extend(g.forget_replicas(k, &o));
            }
        }
        drop(g);
        self.await_owners(&waits);
        victims.len() as i64
    }
}

#[cfg(test)]
mod tests {
    use crate::config::MasterConfig;
    use crate::metrics::MasterMetrics;
    use crate::state::MasterState;
    use mooncake_common::proto::{PutStartItem, SegmentDesc, WriteConfig};
    use mooncake_common::ErrorCode;
    use std::sync::Arc;

    fn state_with_segment() -> Arc<MasterState> {
        let st = MasterState::new(
            MasterConfig::default(),
            Arc::new(MasterMetrics::default()),
            None,
        );
        let desc = SegmentDesc {
            name: "h:1".into(),
            uuid: "u1".into(),
            size: 1 << 20,
            base_addr: 0,
            host_id: "host".into(),
            pid: 1,
            endpoint: "h:1".into(),
            socket_name: String::new(),
        };
        st.mount_segment("c1", desc).unwrap();
        st
    }

    fn put(st: &MasterState, key: &str, size: u64, upsert: bool) -> PutStartItem {
        let keys = vec![key.to_string()];
        let mut items = st.put_start(&keys, &[size], &WriteConfig::default(), upsert);
        if matches!(items[0], PutStartItem::Write(_)) {
            // The test plays the owner of "h:1": its commits come back here.
            st.commit_end(&keys, &["h:1".to_string()]).unwrap();
        }
        items.remove(0)
    }

    #[test]
    fn upsert_of_an_object_being_read_is_busy() {
        let st = state_with_segment();
        assert!(matches!(put(&st, "k", 100, false), PutStartItem::Write(_)));
        let keys = vec!["k".to_string()];
        // An untracked lookup (get_size, is_exist-like) marks nothing.
        let info = st.get_replica_list(&keys, false).remove(0).unwrap();
        assert_eq!(info.read_ticket, 0);
        assert!(matches!(put(&st, "k", 100, true), PutStartItem::Write(_)));
        // A tracked lookup holds the object until its ticket is done.
        let t = st
            .get_replica_list(&keys, true)
            .remove(0)
            .unwrap()
            .read_ticket;
        assert_ne!(t, 0);
        for size in [100, 200] {
            assert_eq!(
                put(&st, "k", size, true),
                PutStartItem::Err(ErrorCode::ObjectReplicaBusy)
            );
        }
        // Plain puts of an existing key are unaffected (write-once).
        assert_eq!(put(&st, "k", 100, false), PutStartItem::AlreadyExists);
        st.reads_done(&[t]);
        st.reads_done(&[t]); // repeated reports are harmless
        assert!(matches!(put(&st, "k", 200, true), PutStartItem::Write(_)));
        // Tickets are per object: one of a removed and re-created key is inert.
        let t2 = st
            .get_replica_list(&keys, true)
            .remove(0)
            .unwrap()
            .read_ticket;
        assert_eq!(st.remove(&keys, true), vec![0]);
        assert!(matches!(put(&st, "k", 100, false), PutStartItem::Write(_)));
        assert!(matches!(put(&st, "k", 100, true), PutStartItem::Write(_)));
        st.reads_done(&[t2]);
    }

    #[test]
    fn unconfirmed_replicas_are_dropped_and_a_write_without_any_fails() {
        let st = state_with_segment();
        let desc = SegmentDesc {
            name: "h:2".into(),
            uuid: "u2".into(),
            size: 1 << 20,
            base_addr: 0,
            host_id: "host".into(),
            pid: 2,
            endpoint: "h:2".into(),
            socket_name: String::new(),
        };
        st.mount_segment("c2", desc).unwrap();
        for seg in ["h:1", "h:2"] {
            st.inner.lock().segments[seg].ledger.mark_unreachable();
        }
        let cfg = WriteConfig {
            replica_num: 2,
            ..WriteConfig::default()
        };
        // Two replicas; only h:1's owner (the caller) records its commit.
        let keys = vec!["two".to_string()];
        assert!(
            matches!(st.put_start(&keys, &[100], &cfg, false)[0], PutStartItem::Write(ref l) if l.len() == 2)
        );
        let ops = st.commit_end(&keys, &["h:1".to_string()]).unwrap();
        assert_eq!(ops.len(), 1);
        {
            let g = st.inner.lock();
            let o = &g.objects["two"];
            assert_eq!(o.replicas.len(), 1, "the unconfirmed replica is dropped");
            assert_eq!(o.replicas[0].segment, "h:1");
            // Its space returns only once its owner forgot it.
            assert_eq!(g.segments["h:2"].ledger.pending_free_bytes(), 100);
        }
        assert_eq!(st.metrics.ledger_unconfirmed.get(), 1);
        // No owner confirms: the write fails and nothing is left of it.
        let keys = vec!["none".to_string()];
        assert!(matches!(
            st.put_start(&keys, &[100], &WriteConfig::default(), false)[0],
            PutStartItem::Write(_)
        ));
        assert_eq!(st.commit_end(&keys, &[]), Err(ErrorCode::RpcTimeout));
        assert!(!st.inner.lock().objects.contains_key("none"));
        assert_eq!(
            st.get_replica_list(&keys, false)[0],
            Err(ErrorCode::ObjectNotFound)
        );
    }

    #[test]
    fn read_marks_expire_with_the_lease() {
        let st = state_with_segment();
        assert!(matches!(put(&st, "e", 64, false), PutStartItem::Write(_)));
        let keys = vec!["e".to_string()];
        let _t = st.get_replica_list(&keys, true);
        // Expire the mark (as if the lease had run out) without waiting.
        {
            let mut g = st.inner.lock();
            let o = g.objects.get_mut("e").unwrap();
            for r in o.readers.iter_mut() {
                r.1 = std::time::Instant::now();
            }
        }
        assert!(matches!(put(&st, "e", 64, true), PutStartItem::Write(_)));
    }
}
