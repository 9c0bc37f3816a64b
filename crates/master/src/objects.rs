//! Object operations on the master: put/upsert start-end-revoke, replica
//! lookup with leases, existence checks and removal.

use crate::durable::{soft_pin_until_ms, Handed, TaggedWaits};
use crate::ledger_push::{AckWait, ACK_TIMEOUT};
use crate::placement;
use crate::read_tickets::ReadTicket;
use crate::state::{
    flag_eviction, is_non_ecmascript, pending_pin, Inner, MasterState, ObjStatus, Object,
    PendingPin, PendingWrite, Replica, Replicas,
};
use crate::tenants::Scope;
use mooncake_common::auth::unix_ms;
use mooncake_common::ledger::LedgerOp;
use mooncake_common::proto::{ObjectInfo, PutStartItem, ReplicaLoc, SoftPin, WriteConfig};
use mooncake_common::{ErrorCode, WriteTicket};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A bulk removal of at least this many objects gives the freed memory back
/// to the system; a smaller one leaves it to the allocator for the next
/// writes (a trim costs a `madvise` over every free page, which a loop of
/// small removals would pay on every call).
const TRIM_AFTER_REMOVING: usize = 4096;
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

    /// Begin writes. A put of an existing key keeps the old value
    /// (AlreadyExists); an upsert of a committed key writes a new version
    /// into fresh replicas while readers keep the committed one (see the
    /// `versions` module).
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
    ///
    /// A key that finds no room while evicted space is on its way back
    /// waits for it (see `eviction`), at most `put_space_wait_ms` for the
    /// whole call, and is placed again, from the start, each time space is
    /// freed (another writer may have written the key meanwhile). Keys
    /// still without room then fail with NO_AVAILABLE_HANDLE.
    pub fn put_start_excluding(
        &self,
        keys: &[String],
        sizes: &[u64],
        cfg: &WriteConfig,
        upsert: bool,
        exclude: &[String],
    ) -> Vec<PutStartItem> {
        let deadline = Instant::now() + Duration::from_millis(self.cfg.put_space_wait_ms);
        let (mut out, mut short) = self.put_start_once(keys, sizes, cfg, upsert, exclude, None);
        // This call's place among the puts waiting for room, once it waits.
        let mut ticket = None;
        while let Some(seen) = short {
            let again: Vec<usize> = out
                .iter()
                .enumerate()
                .filter(|(_, it)| matches!(it, PutStartItem::Err(ErrorCode::NoAvailableHandle)))
                .map(|(i, _)| i)
                .collect();
            if again.is_empty() || Instant::now() >= deadline {
                break;
            }
            let t = *ticket.get_or_insert_with(|| self.queue_for_space());
            if !self.wait_for_space(seen, deadline, t) {
                break;
            }
            let ks: Vec<String> = again.iter().map(|&i| keys[i].clone()).collect();
            let ss: Vec<u64> = again.iter().map(|&i| sizes[i]).collect();
            let (items, next) = self.put_start_once(&ks, &ss, cfg, upsert, exclude, Some(t));
            for (i, item) in again.into_iter().zip(items) {
                if let Some(slot) = out.get_mut(i) {
                    *slot = item;
                }
            }
            short = next;
        }
        if let Some(t) = ticket {
            self.leave_space_queue(t);
        }
        // Counted once per key, after any wait.
        let failed = out
            .iter()
            .filter(|it| matches!(it, PutStartItem::Err(ErrorCode::NoAvailableHandle)))
            .count() as u64;
        if failed > 0 {
            self.metrics.put_start_failures.inc_by(failed);
            self.metrics.put_start_alloc_failures.inc_by(failed);
        }
        out
    }

    /// One pass of [`MasterState::put_start_excluding`] over `keys`; also
    /// returns, when a key found no room that a segment could hold,
    /// `space_gen` as it was then (`None`: it waited behind another put
    /// and did not look). `ticket`: the call's place among the
    /// puts waiting for room (none on its first pass, which is counted as
    /// requests); while any put waits, only the first one takes room.
    fn put_start_once(
        &self,
        keys: &[String],
        sizes: &[u64],
        cfg: &WriteConfig,
        upsert: bool,
        exclude: &[String],
        ticket: Option<u64>,
    ) -> (Vec<PutStartItem>, Option<Option<u64>>) {
        let first = ticket.is_none();
        let mut out = Vec::with_capacity(keys.len());
        let mut short = None;
        if keys.len() != sizes.len() {
            let out = keys
                .iter()
                .map(|_| PutStartItem::Err(ErrorCode::InvalidParams))
                .collect();
            return (out, None);
        }
        let discard = Duration::from_secs(self.cfg.put_start_discard_timeout_sec);
        let release = Duration::from_secs(self.cfg.put_start_release_timeout_sec);
        let limit = self.cfg.max_pending_versions_per_key.max(1) as usize;
        let pin = pending_pin(
            cfg.soft_pin,
            cfg.soft_pin_ttl_ms,
            self.cfg.default_kv_soft_pin_ttl_ms,
        );
        let groups: HashMap<&str, &str> = cfg
            .groups
            .iter()
            .map(|(k, g)| (k.as_str(), g.as_str()))
            .collect();
        let mut g = self.inner.lock();
        if upsert {
            // Until neither wait released the lock: a rewrite may have
            // started while the slots were awaited.
            loop {
                g = self.wait_rewrites(g, keys);
                let (guard, waited) = self.wait_for_version_slots(g, keys);
                g = guard;
                if !waited || !self.rewrite_held(&g, keys) {
                    break;
                }
            }
        }
        let now = self.clock.now();
        let capacity = g.objects.capacity();
        let mut seen = HashSet::new();
        // Forgets of versions being rewritten in place, acked before any
        // writer gets their replicas.
        let mut rewrite_waits = Vec::new();
        for (key, &size) in keys.iter().zip(sizes) {
            if first {
                self.metrics.put_start_requests.inc();
            }
            if let Err(e) = self.validate_write(key, size, cfg) {
                self.metrics.put_start_failures.inc();
                out.push(PutStartItem::Err(e));
                continue;
            }
            if !seen.insert(key.as_str()) {
                out.push(PutStartItem::AlreadyExists);
                continue;
            }
            let group = groups.get(key.as_str()).copied();
            let mut hard_pin = cfg.hard_pin;
            // An upsert over the committed version of an existing object.
            let mut over_committed = false;
            // ... that may write into the committed replicas.
            let mut in_place = false;
            if let Some(o) = g.objects.get(key.as_str()) {
                // Group membership is fixed while the object exists.
                if group.is_some_and(|name| g.groups.number(name) != Some(o.group)) {
                    self.metrics.put_start_failures.inc();
                    tracing::warn!(key = %key, "write refused: the key belongs to another group (or none) while it exists");
                    out.push(PutStartItem::Err(ErrorCode::InvalidParams));
                    continue;
                }
                let young = o
                    .put_start()
                    .is_some_and(|t| now.saturating_duration_since(t) <= discard);
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
                        // The key's first write is still in flight: there
                        // is no committed version to replace yet.
                        self.metrics.put_start_failures.inc();
                        out.push(PutStartItem::Err(ErrorCode::ObjectReplicaBusy));
                        continue;
                    }
                    (ObjStatus::Processing, _) => {
                        g.discard_processing(key, release);
                    }
                    (ObjStatus::Complete, true) => {
                        if g.retired.count(key) >= limit {
                            self.metrics.put_start_failures.inc();
                            tracing::warn!(key = %key, pending = limit, "upsert refused: the key's replaced versions are all still being read");
                            out.push(PutStartItem::Err(ErrorCode::ObjectReplicaBusy));
                            continue;
                        }
                        hard_pin |= o.hard_pin;
                        over_committed = true;
                        in_place = g.rewritable(o, size, cfg, exclude, now);
                    }
                }
            }
            // The tenant's quota (multi-tenancy): a rewrite in place takes
            // no new memory.
            let need = if in_place {
                0
            } else {
                size.saturating_mul(u64::from(cfg.replica_num.max(1)))
            };
            if let Err(e) = g.admit_write(key, need) {
                self.metrics.put_start_failures.inc();
                out.push(PutStartItem::Err(e));
                continue;
            }
            if in_place {
                let version = g.next_version();
                let Some(o) = g.objects.get_mut(key.as_str()) else {
                    continue;
                };
                let old = o.version;
                let replicas = o.replicas.to_vec();
                o.begin_rewrite(version, now, hard_pin, pin);
                // The owners forget the old version before the writer gets
                // the bytes; the writer drops its own segments' entries
                // itself before it copies.
                rewrite_waits.extend(g.forget_entries(old, &replicas, &cfg.writer_own_segments));
                let mut locs: Vec<_> = replicas
                    .iter()
                    .filter_map(|r| g.replica_loc(r, size))
                    .collect();
                self.grant(&mut locs);
                self.metrics.upsert_in_place.inc();
                out.push(PutStartItem::Write {
                    replicas: locs,
                    version,
                });
                continue;
            }
            // Room freed while puts wait goes to the first of them.
            let behind = g.space_queue.behind(ticket);
            let replicas = if behind {
                Replicas::new()
            } else {
                placement::allocate(
                    &mut g,
                    size,
                    cfg,
                    self.cfg.allocation_strategy,
                    exclude,
                    now,
                )
            };
            if replicas.is_empty() {
                // With no segment mounted (a restarted master or a new
                // leader before the remounts) space is not the reason:
                // flagging then would evict just-recovered objects as soon
                // as the first segment comes back.
                if g.usage().1 > 0 {
                    flag_eviction(self);
                }
                if g.segments.values().any(|s| s.alloc.capacity() >= size) {
                    // Behind another waiting put, this one did not look at
                    // the room: it looks once it is first, freed or not.
                    short = Some((!behind).then(|| self.space_gen.load(Ordering::Acquire)));
                }
                out.push(PutStartItem::Err(ErrorCode::NoAvailableHandle));
                continue;
            }
            g.charge_replicas(key, &replicas, size);
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
            if over_committed {
                if let Some(o) = g.objects.get_mut(key.as_str()) {
                    o.push_upsert(PendingWrite {
                        version,
                        size,
                        replicas: replicas.to_vec(),
                        put_start: now,
                        hard_pin,
                        pending_pin: pin,
                    });
                }
            } else {
                let mut o = Object::processing(size, version, replicas, now, hard_pin, pin);
                o.writer = g.writer_id(&cfg.writer_client_id);
                if let Some(name) = group {
                    o.group = g.groups.join(name, key);
                }
                g.objects.insert(key.as_str().into(), o);
            }
            out.push(PutStartItem::Write {
                replicas: locs,
                version,
            });
        }
        let grew = g.objects.capacity() != capacity;
        drop(g);
        if grew {
            // The index moved to a larger table and freed the old one: give
            // that memory back now rather than when the allocator next
            // looks (the old table may belong to another thread's heap).
            crate::memory::return_free_memory();
        }
        self.await_owners(&rewrite_waits);
        (out, short)
    }

    /// Commit writes: each key's write of `versions[i]` (0: its first
    /// write) becomes the object's COMPLETE version, soft-pin actions
    /// apply. See [`MasterState::commit_end`].
    pub fn put_end(&self, keys: &[String], versions: &[u64]) -> Result<(), ErrorCode> {
        self.commit_end(keys, versions, &[]).map(|_| ())
    }

    /// Commit writes. The owners of the new replicas record the commit
    /// first (and any forget of an earlier incarnation of the key is
    /// acknowledged), so a write is visible only once it survives the
    /// master; a version replaced by an upsert is forgotten by its owners
    /// before this returns, so no read that starts afterwards sees it. The
    /// ledger ops of replicas in `local` (the writer's own process's
    /// segments) are returned for the writer to record instead of being
    /// pushed and awaited.
    ///
    /// A write whose key got a newer version meanwhile (a concurrent
    /// upsert that started later committed first) is discarded and still
    /// succeeds: it is ordered before the newer one.
    ///
    /// In a master that writes through (offload on, `--offload_on_evict`
    /// off), each committed version is also queued for a copy to the disk
    /// tier of one of its replicas' owners (not awaited).
    pub fn commit_end(
        &self,
        keys: &[String],
        versions: &[u64],
        local: &[String],
    ) -> Result<Handed, ErrorCode> {
        let now = self.clock.now();
        let mut g = self.inner.lock();
        let mut forgets = Vec::new();
        let mut handed = Vec::new();
        let mut commits: Vec<Commit<'_>> = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            let want = versions.get(i).copied().unwrap_or(0);
            let Some(o) = g.objects.get_mut(k.as_str()) else {
                // Its object went away while it was written (removed,
                // evicted, or discarded as stale): nothing to commit, and
                // the writer is done with the space kept for it.
                g.release_discarded(want);
                continue;
            };
            // The version to commit: the object's own pending write, or one
            // of its pending upserts.
            let (version, size, hard_pin, replicas, until, own) =
                if o.status == ObjStatus::Processing && (want == 0 || want == o.version) {
                    let until = soft_pin_until_ms(o.pending_pin(), o.soft_pin_deadline, now);
                    (
                        o.version,
                        o.size,
                        o.hard_pin,
                        o.replicas.to_vec(),
                        until,
                        true,
                    )
                } else {
                    let Some(p) = o.upserts().iter().find(|p| p.version == want && want != 0)
                    else {
                        // Dropped with an earlier incarnation of the key,
                        // or discarded as stale (see above).
                        g.release_discarded(want);
                        continue;
                    };
                    if p.version < o.version {
                        // Superseded before it committed: nobody recorded it.
                        if let Some(p) = o.take_upsert(want) {
                            g.free_replicas(&p.replicas, p.size);
                        }
                        continue;
                    }
                    let until = soft_pin_until_ms(p.pending_pin, o.soft_pin_deadline, now);
                    (
                        p.version,
                        p.size,
                        p.hard_pin,
                        p.replicas.clone(),
                        until,
                        false,
                    )
                };
            let (w, h) = g.commit_replicas(k, version, size, &replicas, hard_pin, until, local);
            handed.extend(h);
            commits.push(Commit {
                key: k,
                version,
                replicas,
                waits: w,
            });
            if own {
                forgets.extend(g.forgets.take(k));
            }
        }
        drop(g);
        // Wait for the owners; a replica whose owner did not confirm in time
        // is dropped, so no acknowledged write relies on an unrecorded copy.
        let deadline = Instant::now() + ACK_TIMEOUT;
        let mut unconfirmed: Vec<Vec<String>> = Vec::with_capacity(commits.len());
        for c in &commits {
            let mut missing = Vec::new();
            for (seg, q, seq) in &c.waits {
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
        let now = self.clock.now();
        let write_through = self.cfg.writes_through();
        let (file_cap, queue_limit) = (
            self.cfg.global_file_segment_size,
            self.cfg.offloading_queue_limit,
        );
        let mut g = self.inner.lock();
        let mut lost = 0usize;
        let mut retire_waits = Vec::new();
        let mut freed = 0u64;
        for (c, missing) in commits.into_iter().zip(unconfirmed) {
            let k = c.key;
            let first = g
                .objects
                .get(k)
                .is_some_and(|o| o.status == ObjStatus::Processing && o.version == c.version);
            if first {
                if !missing.is_empty() {
                    self.metrics.ledger_unconfirmed.inc_by(missing.len() as u64);
                    tracing::warn!(key = %k, segments = ?missing, "owners did not confirm the commit; dropping those replicas");
                    g.drop_unconfirmed(k, &missing);
                }
                let Some(o) = g.objects.get_mut(k) else {
                    lost += 1;
                    continue;
                };
                let pin = o.pending_pin();
                o.mark_complete();
                apply_pin(o, pin, now);
                if write_through {
                    let _ = g.persist_object(k, file_cap, queue_limit);
                }
                continue;
            }
            let pending = g.objects.get_mut(k).and_then(|o| o.take_upsert(c.version));
            let Some(p) = pending else {
                // The object went away while the owners recorded the
                // commit (removed, evicted, or its first write discarded):
                // the owners forget the entries again, and the space kept
                // for the writer returns on their acks (the writer is
                // done); without such space (the discard delay passed)
                // they only forget.
                unhand(&mut handed, k, c.version);
                if !g.release_discarded(c.version) {
                    let _ = g.forget_entries(c.version, &c.replicas, local);
                }
                continue;
            };
            let (gone, keep): (Vec<Replica>, Vec<Replica>) =
                p.replicas.iter().partition(|r| g.in_segments(r, &missing));
            if !gone.is_empty() {
                self.metrics.ledger_unconfirmed.inc_by(gone.len() as u64);
                tracing::warn!(key = %k, segments = ?missing, "owners did not confirm the commit; dropping those replicas");
                g.forget_committed(c.version, p.size, &gone);
            }
            let newer = g
                .objects
                .get(k)
                .is_none_or(|o| o.status != ObjStatus::Complete || o.version > c.version);
            if keep.is_empty() {
                lost += 1;
                continue;
            }
            if newer {
                // A later upsert committed first: this one is ordered
                // before it, and its bytes are dropped.
                unhand(&mut handed, k, c.version);
                let (handed_local, remote): (Vec<Replica>, Vec<Replica>) =
                    keep.iter().partition(|r| g.in_segments(r, local));
                g.free_replicas(&handed_local, p.size);
                g.forget_committed(c.version, p.size, &remote);
                continue;
            }
            // The old version's disk copy goes before the size changes.
            let old_disk = g.objects.take_disk(k);
            let Some(o) = g.objects.get_mut(k) else {
                continue;
            };
            let old_version = std::mem::replace(&mut o.version, c.version);
            let old_size = std::mem::replace(&mut o.size, p.size);
            let old_replicas = std::mem::replace(&mut o.replicas, keep.into_iter().collect());
            let readers = o.take_readers();
            o.hard_pin |= p.hard_pin;
            apply_pin(o, p.pending_pin, now);
            self.metrics.upsert_versions.inc();
            g.forget_disk_copy(k, old_version, old_disk);
            if g.retire(
                k,
                old_version,
                old_size,
                &old_replicas,
                readers,
                local,
                now,
                &mut retire_waits,
                &mut handed,
            ) {
                freed += 1;
            }
            if write_through {
                let _ = g.persist_object(k, file_cap, queue_limit);
            }
        }
        drop(g);
        if freed > 0 {
            self.metrics.retired_versions_freed.inc_by(freed);
        }
        self.await_owners(&retire_waits);
        // Lookups held by an in-place rewrite of these keys look again.
        self.rewrite_done.notify_all();
        if lost > 0 {
            // No owner of any replica confirmed: the write is not durable
            // and was revoked.
            return Err(ErrorCode::RpcTimeout);
        }
        Ok(handed)
    }

    /// Revoke failed writes (`versions[i]` as in [`MasterState::put_end`]):
    /// free their replicas; a first write's metadata is erased, an upsert
    /// leaves the committed version as it was. A write that was discarded
    /// while it was written (its object removed or evicted, or the write
    /// gone stale) gets back the space kept for it.
    pub fn put_revoke(&self, keys: &[String], versions: &[u64]) {
        let mut g = self.inner.lock();
        for (i, k) in keys.iter().enumerate() {
            let want = versions.get(i).copied().unwrap_or(0);
            let Some(o) = g.objects.get_mut(k.as_str()) else {
                g.release_discarded(want);
                continue;
            };
            if o.status == ObjStatus::Processing && (want == 0 || want == o.version) {
                // A revoked in-place rewrite leaves no whole version: the
                // key goes with it.
                if let Some(o) = g.objects.remove(k.as_str()) {
                    g.free_replicas(&o.replicas, o.size);
                }
                continue;
            }
            if want == 0 {
                continue;
            }
            if let Some(p) = o.take_upsert(want) {
                g.free_replicas(&p.replicas, p.size);
            } else {
                g.release_discarded(want);
            }
        }
        self.note_space_freed();
        drop(g);
        self.rewrite_done.notify_all();
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
        let ticket = if track {
            self.next_ticket.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        self.metrics
            .get_replica_list_requests
            .inc_by(keys.len() as u64);
        let mut g = self.inner.lock();
        loop {
            match self.replica_pass(&mut g, &keys, ticket) {
                Ok((out, Some(expiry), at)) => {
                    g.tickets.open(ticket, ReadTicket { keys, at, expiry });
                    return out;
                }
                Ok((out, None, _)) => return out,
                Err(held) => {
                    // A key is being rewritten in place: wait for its new
                    // version, then look at every key again (the reads
                    // marked so far are unmarked first).
                    for k in &keys[..held] {
                        if let Some(o) = g.objects.get_mut(k.as_str()) {
                            o.remove_reader(ticket);
                        }
                    }
                    g = self.wait_rewrites(g, &keys[held..=held]);
                }
            }
        }
    }

    /// One look at `keys` for [`MasterState::get_replica_list_owned`]:
    /// the infos, and the ticket's expiry when a read was marked under
    /// `ticket` (0: none is). Err(i): `keys[i]` is being rewritten in
    /// place (not yet past the discard delay) and the look must wait.
    #[allow(clippy::type_complexity)]
    fn replica_pass(
        &self,
        g: &mut Inner,
        keys: &[String],
        ticket: u64,
    ) -> Result<
        (
            Vec<Result<ObjectInfo, ErrorCode>>,
            Option<Instant>,
            Vec<usize>,
        ),
        usize,
    > {
        let ttl = self.cfg.default_kv_lease_ttl_ms;
        let discard = Duration::from_secs(self.cfg.put_start_discard_timeout_sec);
        let now = self.clock.now();
        let d = now + Duration::from_millis(ttl);
        let mut out = Vec::with_capacity(keys.len());
        let mut at = Vec::with_capacity(if ticket != 0 { keys.len() } else { 0 });
        let mut any = false;
        let promotes = self.cfg.promotes();
        let mut disk_reads = Vec::new();
        let mut leased_groups: Vec<u32> = Vec::new();
        // Every key is looked up first, in a loop of lookups alone: their
        // cache misses (the index's table, the entry, the key's bytes) do
        // not depend on each other, so the processor overlaps them across
        // keys; the pass below then finds each entry in cache.
        let found_at: Vec<Option<usize>> = keys
            .iter()
            .map(|k| g.objects.get_index_of(k.as_str()))
            .collect();
        for (i, (k, pos)) in keys.iter().zip(found_at).enumerate() {
            let found = pos.and_then(|p| g.objects.get_index_mut(p).map(|(_, o)| (p, o)));
            if ticket != 0 {
                at.push(found.as_ref().map_or(usize::MAX, |f| f.0));
            }
            let info = match found.map(|f| f.1) {
                None => Err(ErrorCode::ObjectNotFound),
                Some(o) if o.status != ObjStatus::Complete => {
                    let young = o
                        .rewrite_start()
                        .is_some_and(|t| now.saturating_duration_since(t) <= discard);
                    if young {
                        o.note_waiting_reader();
                        return Err(i);
                    }
                    Err(ErrorCode::ReplicaIsNotReady)
                }
                Some(o) => {
                    if d > o.lease_deadline {
                        o.lease_deadline = d;
                    }
                    if o.group != 0 {
                        leased_groups.push(o.group);
                    }
                    if ticket != 0 {
                        o.add_reader(ticket, d, now);
                        any = true;
                    }
                    Ok((o.size, o.replicas.clone(), o.version, o.disk()))
                }
            };
            if promotes && matches!(&info, Ok((_, reps, _, Some(_))) if reps.is_empty()) {
                disk_reads.push(i);
            }
            out.push(info.map(|(size, reps, version, disk)| ObjectInfo {
                size,
                replicas: reps.iter().filter_map(|r| g.replica_loc(r, size)).collect(),
                disk: match reps.is_empty() {
                    true => disk.and_then(|d| g.disk_loc(k, version, d)),
                    false => None,
                },
                lease_ttl_ms: ttl,
                read_ticket: ticket,
            }));
        }
        for i in disk_reads {
            g.note_disk_read(&keys[i], &self.cfg);
        }
        g.lease_groups(leased_groups, d);
        Ok((out, any.then_some(d), at))
    }

    /// The reads of `tickets` finished: their objects are no longer being
    /// read by them. Unknown (expired, repeated) tickets are ignored.
    pub fn reads_done(&self, tickets: &[u64]) {
        if tickets.is_empty() {
            return;
        }
        let now = self.clock.now();
        let mut g = self.inner.lock();
        let mut freed = 0;
        for t in tickets {
            let Some(rt) = g.tickets.close(*t) else {
                continue;
            };
            for (i, k) in rt.keys.iter().enumerate() {
                // Where the lookup found the key, unless the index moved
                // since (a removal swaps the last entry into its place).
                let at = rt.at.get(i).copied().unwrap_or(usize::MAX);
                let o = match g.objects.get_index_mut(at) {
                    Some((key, o)) if key == k.as_str() => Some(o),
                    _ => g.objects.get_mut(k.as_str()),
                };
                if let Some(o) = o {
                    o.remove_reader(*t);
                }
                if g.retired.holds(k) {
                    freed += g.release_retired(k, now, Some(*t));
                }
            }
        }
        if freed > 0 {
            self.metrics.retired_versions_freed.inc_by(freed);
            self.version_freed.notify_all();
            self.note_space_freed();
        }
    }

    /// 1 when a COMPLETE replica exists (and grant a lease), else 0.
    pub fn exist(&self, keys: &[String]) -> Vec<i32> {
        let ttl = Duration::from_millis(self.cfg.default_kv_lease_ttl_ms);
        let now = self.clock.now();
        let mut g = self.inner.lock();
        let mut leased_groups = Vec::new();
        let codes = keys
            .iter()
            .map(|k| match g.objects.get_mut(k.as_str()) {
                // A key rewritten in place exists throughout.
                Some(o) if o.status == ObjStatus::Complete || o.rewrite_start().is_some() => {
                    if now + ttl > o.lease_deadline {
                        o.lease_deadline = now + ttl;
                    }
                    if o.group != 0 {
                        leased_groups.push(o.group);
                    }
                    1
                }
                _ => 0,
            })
            .collect();
        g.lease_groups(leased_groups, now + ttl);
        codes
    }

    /// Remove keys: OBJECT_NOT_FOUND when missing, REPLICA_IS_NOT_READY
    /// while the first write is in flight, OBJECT_HAS_LEASE while a lease
    /// is active and not `force`. A key being rewritten in place is
    /// removed once that write ended. Answers once the owners forgot the
    /// removed replicas (a removed object never comes back with a master);
    /// replicas that reads are still copying stay allocated until those
    /// reads end.
    pub fn remove(&self, keys: &[String], force: bool) -> Vec<i32> {
        let release = Duration::from_secs(self.cfg.put_start_release_timeout_sec);
        let mut g = self.wait_rewrites(self.inner.lock(), keys);
        let now = self.clock.now();
        let mut waits = Vec::new();
        let codes = keys
            .iter()
            .map(|k| {
                self.metrics.remove_requests.inc();
                let code = match g.objects.get(k.as_str()) {
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
                        waits.extend(g.remove_object(k, now, release));
                        0
                    }
                }
            })
            .collect();
        drop(g);
        self.await_owners(&waits);
        codes
    }

    /// `batch_replica_clear`: of `keys`, those that the client `client_id`
    /// created and no lease protects lose their replicas: every one (the
    /// object is removed, as `remove`) when `segment_name` is empty, else
    /// the memory replica and the disk copy on that segment (the object is
    /// removed when nothing else is left). Keys that are unknown, still
    /// being written, another client's, leased, or with nothing on
    /// `segment_name` are skipped. Returns the keys cleared.
    pub fn batch_replica_clear(
        &self,
        client_id: &str,
        keys: &[String],
        segment_name: &str,
    ) -> Vec<String> {
        let now = self.clock.now();
        let mut whole = Vec::new();
        let mut cleared = Vec::new();
        {
            let mut g = self.inner.lock();
            let writer = match g.writer_ids.get(client_id) {
                Some(w) => *w,
                None => return Vec::new(),
            };
            let seg = if segment_name.is_empty() {
                None
            } else {
                match g.segments.id_of(segment_name) {
                    Some(s) => Some(s),
                    None => return Vec::new(),
                }
            };
            for key in keys {
                let Some(o) = g.objects.get(key.as_str()) else {
                    continue;
                };
                if o.writer != writer || o.lease_deadline > now || o.status != ObjStatus::Complete {
                    continue;
                }
                let Some(seg) = seg else {
                    whole.push(key.clone());
                    continue;
                };
                let in_memory = o.replicas.iter().any(|r| r.seg == seg);
                let on_disk = o.disk() == Some(seg);
                if !in_memory && !on_disk {
                    continue;
                }
                let others = o.replicas.iter().filter(|r| r.seg != seg).count();
                let disk_elsewhere = o.disk().is_some() && !on_disk;
                if others == 0 && !disk_elsewhere {
                    whole.push(key.clone());
                    continue;
                }
                g.clear_on_segment(key, seg, now);
                cleared.push(key.clone());
            }
        }
        if !whole.is_empty() {
            let codes = self.remove(&whole, false);
            cleared.extend(
                whole
                    .into_iter()
                    .zip(codes)
                    .filter(|(_, c)| *c == 0)
                    .map(|(k, _)| k),
            );
        }
        cleared
    }

    /// Remove every key of `scope` the pattern matches (search semantics,
    /// on the key as its tenant wrote it); count, or -600.
    pub(crate) fn remove_by_regex(&self, pattern: &str, force: bool, scope: &Scope) -> i64 {
        if is_non_ecmascript(pattern) {
            return ErrorCode::InvalidParams.code() as i64;
        }
        let Ok(re) = regex::Regex::new(pattern) else {
            return ErrorCode::InvalidParams.code() as i64;
        };
        self.remove_matching(|k| scope.user_key(k).is_some_and(|u| re.is_match(u)), force)
    }

    /// Remove every removable key of `scope`; count.
    pub(crate) fn remove_all(&self, force: bool, scope: &Scope) -> i64 {
        match scope {
            Scope::Shared => self.remove_matching(|_| true, force),
            _ => self.remove_matching(|k| scope.user_key(k).is_some(), force),
        }
    }

    fn remove_matching(&self, pred: impl Fn(&str) -> bool, force: bool) -> i64 {
        let now = self.clock.now();
        let release = Duration::from_secs(self.cfg.put_start_release_timeout_sec);
        let mut g = self.inner.lock();
        let removable = |k: &str, o: &Object| {
            pred(k) && o.status == ObjStatus::Complete && (force || o.lease_deadline <= now)
        };
        let count = g.objects.iter().filter(|(k, o)| removable(k, o)).count();
        if count == 0 {
            return 0;
        }
        // One pass that moves entries out (no key is copied); the survivors
        // go into a map sized for them.
        let all = g.objects.take_all();
        let mut keep = indexmap::IndexMap::with_capacity(all.len() - count);
        let mut waits = Vec::new();
        for (k, o) in all {
            if removable(&k, &o) {
                waits.extend(g.drop_object(k, o, now, release, true));
            } else {
                keep.insert(k, o);
            }
        }
        g.objects.restore(keep);
        g.forgets.remember_bulk(&waits);
        waits.extend(g.forgets.bulk_pending().iter().cloned());
        g.shrink_after_removals();
        drop(g);
        self.await_owners(&waits);
        drop(waits);
        // The owners acknowledged: what was remembered for them can go.
        let mut g = self.inner.lock();
        g.forgets.prune_bulk();
        g.forgets.sweep();
        drop(g);
        if count >= TRIM_AFTER_REMOVING {
            crate::memory::return_free_memory();
        }
        count as i64
    }
}

/// A commit in flight: what `commit_end` told the owners.
struct Commit<'a> {
    key: &'a str,
    version: u64,
    replicas: Vec<Replica>,
    waits: TaggedWaits,
}

/// Apply a committed write's soft-pin change to its object.
fn apply_pin(o: &mut Object, pin: PendingPin, now: Instant) {
    match pin {
        PendingPin::Keep => {}
        PendingPin::Clear => o.soft_pin_deadline = None,
        PendingPin::Set(ms) => o.soft_pin_deadline = Some(now + Duration::from_millis(ms)),
    }
}

/// Take back the ledger commits of `key` at `version` that were to be
/// handed to the writer (the write lost before it became visible).
fn unhand(handed: &mut Handed, key: &str, version: u64) {
    handed.retain(
        |(_, op)| !matches!(op, LedgerOp::Commit(e) if e.key == key && e.version == version),
    );
}

#[cfg(test)]
mod tests {
    use crate::config::MasterConfig;
    use crate::metrics::MasterMetrics;
    use crate::state::MasterState;
    use mooncake_common::proto::{ObjectInfo, PutStartItem, SegmentDesc, WriteConfig};
    use mooncake_common::ErrorCode;
    use std::sync::Arc;

    fn desc(name: &str, uuid: &str, pid: u32) -> SegmentDesc {
        SegmentDesc {
            name: name.into(),
            uuid: uuid.into(),
            size: 1 << 20,
            base_addr: 0,
            host_id: "host".into(),
            pid,
            endpoint: name.into(),
            socket_name: String::new(),
        }
    }

    fn state_with(cfg: MasterConfig) -> Arc<MasterState> {
        let st = MasterState::new(cfg, Arc::new(MasterMetrics::default()), None);
        st.mount_segment("c1", desc("h:1", "u1", 1)).unwrap();
        st
    }

    fn state_with_segment() -> Arc<MasterState> {
        state_with(MasterConfig::default())
    }

    fn keys(k: &str) -> Vec<String> {
        vec![k.to_string()]
    }

    /// A state whose upserts keep at most `max` replaced versions of a key
    /// for their readers and wait up to `wait_ms` for one to be freed.
    fn state_with_pending_versions(max: u32, wait_ms: u64) -> Arc<MasterState> {
        state_with(MasterConfig {
            max_pending_versions_per_key: max,
            pending_version_wait_ms: wait_ms,
            ..MasterConfig::default()
        })
    }

    /// The item `put_start` answers for one write of `key` under `cfg`.
    fn start_item(
        st: &MasterState,
        key: &str,
        size: u64,
        cfg: &WriteConfig,
        upsert: bool,
    ) -> PutStartItem {
        st.put_start(&keys(key), &[size], cfg, upsert).remove(0)
    }

    /// Start a write of `key` under `cfg`: its version and replica offset,
    /// or the item.
    fn start_cfg(
        st: &MasterState,
        key: &str,
        size: u64,
        cfg: &WriteConfig,
        upsert: bool,
    ) -> Result<(u64, u64), PutStartItem> {
        match start_item(st, key, size, cfg, upsert) {
            PutStartItem::Write { replicas, version } => Ok((version, replicas[0].offset)),
            other => Err(other),
        }
    }

    /// Start a write of `key`: its version and replica offset, or the item.
    fn start(
        st: &MasterState,
        key: &str,
        size: u64,
        upsert: bool,
    ) -> Result<(u64, u64), PutStartItem> {
        start_cfg(st, key, size, &WriteConfig::default(), upsert)
    }

    /// End a write as the owner of "h:1" (its ledger ops come back here).
    fn commit(st: &MasterState, key: &str, version: u64) {
        st.commit_end(&keys(key), &[version], &["h:1".to_string()])
            .unwrap();
    }

    fn put(st: &MasterState, key: &str, size: u64, upsert: bool) -> PutStartItem {
        let item = start_item(st, key, size, &WriteConfig::default(), upsert);
        if let PutStartItem::Write { version, .. } = item {
            commit(st, key, version);
        }
        item
    }

    /// `put`, which must be granted a write.
    fn put_ok(st: &MasterState, key: &str, size: u64, upsert: bool) {
        let item = put(st, key, size, upsert);
        assert!(
            matches!(item, PutStartItem::Write { .. }),
            "{key}: {item:?}"
        );
    }

    fn lookup(st: &MasterState, key: &str, track: bool) -> ObjectInfo {
        st.get_replica_list(&keys(key), track).remove(0).unwrap()
    }

    fn used(st: &MasterState) -> u64 {
        st.inner.lock().segments["h:1"].alloc.used()
    }

    /// The owner of "h:1" applies and acknowledges what is queued for it.
    fn owner_acks(st: &Arc<MasterState>) {
        let q = st.ledger_queue("c1", "h:1").expect("queue").0;
        q.ack_all(&|r, settle| st.release_forgotten("h:1", "u1", r, settle));
    }

    /// Put "k", start an upsert of it (written beside it), and remove "k"
    /// while the upsert is in flight: the upsert's version, once the
    /// removed replica's space is back and only the upsert's is allocated.
    fn upsert_dropped_with_its_object(st: &Arc<MasterState>) -> u64 {
        st.ledger_queue("c1", "h:1")
            .expect("queue")
            .0
            .mark_connected();
        put_ok(st, "k", 100, false);
        let (v2, _) = start(st, "k", 100, true).unwrap();
        assert_eq!(used(st), 256);
        assert_eq!(st.remove(&keys("k"), true), vec![0]);
        owner_acks(st);
        // The upsert's writer may still be copying: its space stays.
        assert_eq!(used(st), 128);
        assert_eq!(st.exist(&keys("k")), vec![0]);
        v2
    }

    #[test]
    fn an_upsert_dropped_with_its_object_frees_its_space_when_its_writer_ends_it() {
        let st = state_with_segment();
        let v2 = upsert_dropped_with_its_object(&st);
        // The writer ends the write: nothing is committed, the owner
        // forgets the version, and the space returns on that ack (not
        // after --put_start_release_timeout_sec).
        st.put_end(&keys("k"), &[v2]).unwrap();
        assert_eq!(st.exist(&keys("k")), vec![0]);
        owner_acks(&st);
        assert_eq!(used(&st), 0);
        assert!(st.inner.lock().deferred.take_due(far_future()).is_empty());
        // A repeated end frees nothing twice.
        st.put_end(&keys("k"), &[v2]).unwrap();
        owner_acks(&st);
        assert_eq!(used(&st), 0);
    }

    #[test]
    fn an_upsert_dropped_with_its_object_frees_its_space_when_its_writer_revokes_it() {
        let st = state_with_segment();
        let v2 = upsert_dropped_with_its_object(&st);
        st.put_revoke(&keys("k"), &[v2]);
        owner_acks(&st);
        assert_eq!(used(&st), 0);
        assert!(st.inner.lock().deferred.take_due(far_future()).is_empty());
    }

    #[test]
    fn an_upsert_of_a_key_written_again_after_a_removal_frees_only_its_own_space() {
        let st = state_with_segment();
        let v2 = upsert_dropped_with_its_object(&st);
        // Another writer puts the key again before the upsert ends.
        put_ok(&st, "k", 100, false);
        assert_eq!(used(&st), 256);
        st.put_end(&keys("k"), &[v2]).unwrap();
        owner_acks(&st);
        // The new object keeps its replica; only the upsert's space went.
        assert_eq!(used(&st), 128);
        assert_eq!(st.exist(&keys("k")), vec![1]);
        assert_eq!(lookup(&st, "k", false).size, 100);
    }

    #[test]
    fn an_upsert_whose_object_is_removed_while_its_commit_is_recorded_frees_its_space() {
        use mooncake_common::ledger::LedgerOp;
        let st = state_with_segment();
        let q = st.ledger_queue("c1", "h:1").expect("queue").0;
        q.mark_connected();
        put_ok(&st, "k", 100, false);
        owner_acks(&st);
        let (v2, _) = start(&st, "k", 100, true).unwrap();
        let queued = |pred: &dyn Fn(&LedgerOp) -> bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !q.pending_ops().iter().any(pred) {
                assert!(std::time::Instant::now() < deadline, "never queued");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        // The writer (not the owner) ends the upsert: the commit is pushed
        // to the owner and awaited...
        let ender = {
            let st = Arc::clone(&st);
            std::thread::spawn(move || st.commit_end(&keys("k"), &[v2], &[]).map(|_| ()))
        };
        queued(&|op| matches!(op, LedgerOp::Commit(e) if e.version == v2));
        // ...and a removal drops the object before the owner acknowledges.
        let remover = {
            let st = Arc::clone(&st);
            std::thread::spawn(move || st.remove(&keys("k"), true))
        };
        queued(&|op| matches!(op, LedgerOp::Forget { version, .. } if *version != v2));
        owner_acks(&st);
        assert_eq!(ender.join().unwrap(), Ok(()));
        assert_eq!(remover.join().unwrap(), vec![0]);
        // The owner forgets the upsert's commit, and its space returns on
        // that ack.
        let ops = q.ack_all(&|r, settle| st.release_forgotten("h:1", "u1", r, settle));
        assert!(
            ops.iter()
                .any(|op| matches!(op, LedgerOp::Forget { version, .. } if *version == v2)),
            "{ops:?}"
        );
        assert_eq!(used(&st), 0);
        assert_eq!(st.exist(&keys("k")), vec![0]);
    }

    /// A state whose one object of 100 bytes, "k", was removed: its space
    /// returns on the owner's ack of the forget still queued on `q`.
    fn removed_before_the_owner_acks() -> (Arc<MasterState>, Arc<crate::ledger_push::OwnerQueue>) {
        let st = state_with_segment();
        let q = st.ledger_queue("c1", "h:1").expect("queue").0;
        q.mark_connected();
        put_ok(&st, "k", 100, false);
        owner_acks(&st);
        let release = std::time::Duration::from_secs(600);
        let _ = st
            .inner
            .lock()
            .remove_object("k", std::time::Instant::now(), release);
        (st, q)
    }

    #[test]
    fn acknowledged_space_stops_counting_as_on_its_way_back_once_it_is_free() {
        let (st, q) = removed_before_the_owner_acks();
        assert_eq!(st.inner.lock().releasing_bytes(), 100);
        // What a put waiting for room sees right after the space is back
        // (it looks under the state lock): the space free, and nothing on
        // its way back any more. Were the bytes still counted, it would
        // wait for a wake-up that already happened, until its deadline.
        let seen = std::cell::Cell::new(None);
        q.ack_all(&|r, settle| {
            st.release_forgotten("h:1", "u1", r, settle);
            seen.set(Some((used(&st), st.inner.lock().releasing_bytes())));
        });
        assert_eq!(seen.get(), Some((0, 0)));
    }

    #[test]
    fn a_release_that_does_not_settle_is_settled_when_it_returns() {
        let (_st, q) = removed_before_the_owner_acks();
        q.ack_all(&|_, _| {});
        assert_eq!(q.releasing_bytes(), 0);
    }

    #[test]
    fn an_upsert_in_flight_keeps_no_space_once_its_object_went_with_another_segment() {
        let st = state_with_segment();
        st.mount_segment("c2", desc("h:2", "u2", 2)).unwrap();
        let on = |seg: &str| WriteConfig {
            preferred_segments: vec![seg.to_string()],
            ..WriteConfig::default()
        };
        let (v1, _) = start_cfg(&st, "k", 100, &on("h:1"), false).unwrap();
        commit(&st, "k", v1);
        // An upsert of "k" is being written into h:2 when h:1, which holds
        // the object's only replica, goes away: the object goes with it.
        let (v2, _) = start_cfg(&st, "k", 100, &on("h:2"), true).unwrap();
        let used2 = || st.inner.lock().segments["h:2"].alloc.used();
        assert_eq!(used2(), 128);
        st.unmount_segment("c1", "h:1").unwrap();
        assert_eq!(st.exist(&keys("k")), vec![0]);
        // The upsert's space on h:2 stays while its writer may copy, and
        // returns when the writer ends the write.
        assert_eq!(used2(), 128);
        st.put_end(&keys("k"), &[v2]).unwrap();
        let q = st.ledger_queue("c2", "h:2").expect("queue").0;
        q.ack_all(&|r, settle| st.release_forgotten("h:2", "u2", r, settle));
        assert_eq!(used2(), 0);
    }

    fn far_future() -> std::time::Instant {
        std::time::Instant::now() + std::time::Duration::from_secs(100_000)
    }

    #[test]
    fn an_upsert_of_a_read_object_writes_a_new_version_beside_it() {
        let st = state_with_segment();
        let (v1, a) = start(&st, "k", 100, false).unwrap();
        commit(&st, "k", v1);
        let t = lookup(&st, "k", true).read_ticket;
        assert_ne!(t, 0);
        // The upsert goes through, into fresh space.
        let (v2, b) = start(&st, "k", 100, true).unwrap();
        assert!(v2 > v1);
        assert_ne!(a, b);
        // Until it commits, readers keep getting the committed replica.
        assert_eq!(lookup(&st, "k", false).replicas[0].offset, a);
        assert_eq!(st.exist(&keys("k")), vec![1]);
        commit(&st, "k", v2);
        // A read that starts now gets the new version.
        assert_eq!(lookup(&st, "k", false).replicas[0].offset, b);
        // The old version stays allocated for the reader in flight...
        assert_eq!(used(&st), 256);
        assert_eq!(st.inner.lock().retired.count("k"), 1);
        // ...and is freed once its read is reported done.
        st.reads_done(&[t]);
        st.reads_done(&[t]); // repeated reports are harmless
        assert_eq!(used(&st), 128);
        assert_eq!(st.inner.lock().retired.count("k"), 0);
        assert_eq!(st.metrics.retired_versions_freed.get(), 1);
        assert_eq!(st.metrics.upsert_versions.get(), 1);
        // A different size is a new version like any other.
        put_ok(&st, "k", 200, true);
        let info = lookup(&st, "k", false);
        assert_eq!(info.size, 200);
        assert_eq!(used(&st), 256);
        // Plain puts of an existing key are unaffected (write-once).
        assert_eq!(put(&st, "k", 100, false), PutStartItem::AlreadyExists);
    }

    #[test]
    fn a_finished_read_is_unmarked_after_its_key_moved_in_the_index() {
        let st = state_with_segment();
        for k in ["a", "b", "k"] {
            put_ok(&st, k, 64, false);
        }
        let t = lookup(&st, "k", true).read_ticket;
        // Removing "a" moves the last entry, "k", into its place.
        assert_eq!(st.remove(&keys("a"), true), vec![0]);
        assert_eq!(st.inner.lock().objects.get_index_of("k"), Some(0));
        st.reads_done(&[t]);
        // No reader is left on "k": an upsert frees the replaced version
        // at once instead of keeping it for a read in flight.
        put_ok(&st, "k", 64, true);
        assert_eq!(st.inner.lock().retired.count("k"), 0);
    }

    #[test]
    fn a_finished_read_is_unmarked_where_its_lookup_found_the_key() {
        let st = state_with_segment();
        for k in ["a", "k"] {
            put_ok(&st, k, 64, false);
        }
        let t = lookup(&st, "k", true).read_ticket;
        st.reads_done(&[t]);
        put_ok(&st, "k", 64, true);
        assert_eq!(st.inner.lock().retired.count("k"), 0);
        // Without the report the replaced version waits for the read.
        let t = lookup(&st, "k", true).read_ticket;
        assert_ne!(t, 0);
        put_ok(&st, "k", 64, true);
        assert_eq!(st.inner.lock().retired.count("k"), 1);
    }

    #[test]
    fn an_unread_version_is_freed_when_replaced() {
        let st = state_with_segment();
        for _ in 0..10 {
            put_ok(&st, "k", 1000, true);
            assert_eq!(used(&st), 1024);
        }
        assert!(st.inner.lock().retired.is_empty());
    }

    #[test]
    fn pending_versions_per_key_are_bounded() {
        let st = state_with_pending_versions(2, 0);
        put_ok(&st, "k", 64, false);
        let mut tickets = Vec::new();
        for _ in 0..2 {
            tickets.push(lookup(&st, "k", true).read_ticket);
            put_ok(&st, "k", 64, true);
        }
        assert_eq!(st.inner.lock().retired.count("k"), 2);
        tickets.push(lookup(&st, "k", true).read_ticket);
        assert_eq!(
            put(&st, "k", 64, true),
            PutStartItem::Err(ErrorCode::ObjectReplicaBusy)
        );
        assert_eq!(st.metrics.upsert_version_waits.get(), 1);
        // Other keys are not affected.
        put_ok(&st, "other", 64, true);
        // One read ends: one slot frees.
        st.reads_done(&tickets[..1]);
        put_ok(&st, "k", 64, true);
    }

    #[test]
    fn a_waiting_upsert_proceeds_when_a_read_ends() {
        let st = state_with_pending_versions(1, 60_000);
        put_ok(&st, "k", 64, false);
        let t = lookup(&st, "k", true).read_ticket;
        put_ok(&st, "k", 64, true);
        let t2 = lookup(&st, "k", true).read_ticket;
        let st2 = Arc::clone(&st);
        let writer = std::thread::spawn(move || put(&st2, "k", 64, true));
        // The writer waits for the slot (the counter moves as it starts waiting).
        while st.metrics.upsert_version_waits.get() == 0 {
            std::thread::yield_now();
        }
        st.reads_done(&[t]);
        assert!(matches!(writer.join().unwrap(), PutStartItem::Write { .. }));
        st.reads_done(&[t2]);
        assert_eq!(st.inner.lock().retired.count("k"), 0);
    }

    #[test]
    fn concurrent_upserts_end_with_the_later_version_whole() {
        for later_commits_first in [false, true] {
            let st = state_with_segment();
            put_ok(&st, "k", 64, false);
            let (va, a) = start(&st, "k", 64, true).unwrap();
            let (vb, b) = start(&st, "k", 128, true).unwrap();
            assert!(vb > va);
            if later_commits_first {
                commit(&st, "k", vb);
                commit(&st, "k", va);
            } else {
                commit(&st, "k", va);
                assert_eq!(lookup(&st, "k", false).replicas[0].offset, a);
                commit(&st, "k", vb);
            }
            let info = lookup(&st, "k", false);
            assert_eq!((info.size, info.replicas[0].offset), (128, b));
            // Nothing of the losing or replaced versions stays allocated.
            assert_eq!(used(&st), 128, "later first: {later_commits_first}");
        }
    }

    #[test]
    fn a_revoked_upsert_leaves_the_committed_version() {
        let st = state_with_segment();
        let (v1, a) = start(&st, "k", 64, false).unwrap();
        commit(&st, "k", v1);
        let (v2, _) = start(&st, "k", 64, true).unwrap();
        st.put_revoke(&keys("k"), &[v2]);
        let info = lookup(&st, "k", false);
        assert_eq!(info.replicas[0].offset, a);
        assert_eq!(used(&st), 64);
        // A commit of the revoked write changes nothing.
        commit(&st, "k", v2);
        assert_eq!(lookup(&st, "k", false).replicas[0].offset, a);
    }

    #[test]
    fn the_first_write_in_flight_makes_an_upsert_busy() {
        let st = state_with_segment();
        let (v1, _) = start(&st, "k", 64, false).unwrap();
        assert_eq!(
            start(&st, "k", 64, true),
            Err(PutStartItem::Err(ErrorCode::ObjectReplicaBusy))
        );
        assert_eq!(
            st.get_replica_list(&keys("k"), false)[0],
            Err(ErrorCode::ReplicaIsNotReady)
        );
        commit(&st, "k", v1);
        assert!(start(&st, "k", 64, true).is_ok());
    }

    #[test]
    fn a_removed_object_being_read_keeps_its_bytes_until_the_read_ends() {
        let st = state_with_segment();
        put_ok(&st, "k", 64, false);
        let t = lookup(&st, "k", true).read_ticket;
        assert_eq!(st.remove(&keys("k"), true), vec![0]);
        assert_eq!(
            st.get_replica_list(&keys("k"), false)[0],
            Err(ErrorCode::ObjectNotFound)
        );
        // A new object cannot take the bytes the reader is copying.
        let (_, b) = start(&st, "k2", 64, false).unwrap();
        assert_ne!(b, 0);
        assert_eq!(used(&st), 128);
        st.reads_done(&[t]);
        // The retired space now waits only for its owner to forget it.
        let g = st.inner.lock();
        assert_eq!(g.retired.count("k"), 0);
        assert_eq!(g.segments["h:1"].ledger.pending_free_bytes(), 64);
    }

    #[test]
    fn a_dropped_segment_takes_its_versions_with_it() {
        let st = state_with_segment();
        put_ok(&st, "k", 64, false);
        let _t = lookup(&st, "k", true);
        put_ok(&st, "k", 64, true);
        let _ = start(&st, "k", 64, true).unwrap();
        st.disconnect("c1");
        let g = st.inner.lock();
        assert!(g.retired.is_empty());
        assert!(g.objects.is_empty());
    }

    #[test]
    fn unconfirmed_replicas_are_dropped_and_a_write_without_any_fails() {
        let st = state_with_segment();
        st.mount_segment("c2", desc("h:2", "u2", 2)).unwrap();
        for seg in ["h:1", "h:2"] {
            st.inner.lock().segments[seg].ledger.mark_unreachable();
        }
        let cfg = WriteConfig {
            replica_num: 2,
            ..WriteConfig::default()
        };
        // Two replicas; only h:1's owner (the caller) records its commit.
        let ks = keys("two");
        let v = match st.put_start(&ks, &[100], &cfg, false).remove(0) {
            PutStartItem::Write { replicas, version } if replicas.len() == 2 => version,
            other => panic!("{other:?}"),
        };
        let ops = st.commit_end(&ks, &[v], &["h:1".to_string()]).unwrap();
        assert_eq!(ops.len(), 1);
        {
            let g = st.inner.lock();
            let o = &g.objects["two"];
            assert_eq!(o.replicas.len(), 1, "the unconfirmed replica is dropped");
            assert_eq!(g.segments.name_of(o.replicas[0].seg), "h:1");
            // Its space returns only once its owner forgot it.
            assert_eq!(g.segments["h:2"].ledger.pending_free_bytes(), 100);
        }
        assert_eq!(st.metrics.ledger_unconfirmed.get(), 1);
        // No owner confirms: the write fails and nothing is left of it.
        let ks = keys("none");
        let v = match st
            .put_start(&ks, &[100], &WriteConfig::default(), false)
            .remove(0)
        {
            PutStartItem::Write { version, .. } => version,
            other => panic!("{other:?}"),
        };
        assert_eq!(st.commit_end(&ks, &[v], &[]), Err(ErrorCode::RpcTimeout));
        assert!(!st.inner.lock().objects.contains_key("none"));
        assert_eq!(
            st.get_replica_list(&ks, false)[0],
            Err(ErrorCode::ObjectNotFound)
        );
    }

    #[test]
    fn an_upsert_no_owner_confirms_fails_and_keeps_the_old_version() {
        let st = state_with_segment();
        let (v1, a) = start(&st, "k", 64, false).unwrap();
        commit(&st, "k", v1);
        st.inner.lock().segments["h:1"].ledger.mark_unreachable();
        let (v2, _) = start(&st, "k", 64, true).unwrap();
        assert_eq!(
            st.commit_end(&keys("k"), &[v2], &[]),
            Err(ErrorCode::RpcTimeout)
        );
        assert_eq!(lookup(&st, "k", false).replicas[0].offset, a);
    }

    /// A write from the segment's own host.
    fn same_host() -> WriteConfig {
        WriteConfig {
            writer_host_id: "host".into(),
            writer_maps_host: true,
            ..WriteConfig::default()
        }
    }

    /// A state whose segment owner "h:1" never connects its ledger stream
    /// (nothing waits for its acks).
    fn state_unreachable_owner() -> Arc<MasterState> {
        let st = state_with_segment();
        st.inner.lock().segments["h:1"].ledger.mark_unreachable();
        st
    }

    /// Start an upsert of `key` under `cfg`.
    fn start_with(
        st: &MasterState,
        key: &str,
        size: u64,
        cfg: &WriteConfig,
    ) -> Result<(u64, u64), PutStartItem> {
        start_cfg(st, key, size, cfg, true)
    }

    /// A same-host write of "k" (100 bytes), committed, then a same-host
    /// upsert of it started: the two versions and their offsets.
    fn rewrite_started(st: &MasterState) -> ((u64, u64), (u64, u64)) {
        let (v1, a) = start_with(st, "k", 100, &same_host()).unwrap();
        commit(st, "k", v1);
        ((v1, a), start_with(st, "k", 100, &same_host()).unwrap())
    }

    type Lookup = Vec<Result<ObjectInfo, ErrorCode>>;

    /// A tracked lookup of "k" on its own thread: its answer comes on the
    /// channel.
    fn spawn_lookup(
        st: &Arc<MasterState>,
    ) -> (
        std::sync::mpsc::Receiver<Lookup>,
        std::thread::JoinHandle<Result<(), std::sync::mpsc::SendError<Lookup>>>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let st = Arc::clone(st);
        let reader = std::thread::spawn(move || tx.send(st.get_replica_list(&keys("k"), true)));
        (rx, reader)
    }

    #[test]
    fn an_unread_key_is_rewritten_in_place_and_lookups_wait_for_the_new_version() {
        let st = state_unreachable_owner();
        // Nobody reads it: the upsert gets the committed replica itself.
        let ((v1, a), (v2, b)) = rewrite_started(&st);
        assert!(v2 > v1);
        assert_eq!(a, b);
        assert_eq!(used(&st), 128);
        assert_eq!(st.metrics.upsert_in_place.get(), 1);
        assert_eq!(st.metrics.upsert_versions.get(), 0);
        // The key exists throughout the rewrite.
        assert_eq!(st.exist(&keys("k")), vec![1]);
        // A lookup during the rewrite is held until the write commits.
        let (rx, reader) = spawn_lookup(&st);
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(50))
            .is_err());
        commit(&st, "k", v2);
        let got = rx.recv().unwrap().remove(0).unwrap();
        reader.join().unwrap().unwrap();
        assert_eq!((got.size, got.replicas[0].offset), (100, a));
        assert_ne!(got.read_ticket, 0);
        // Now it is being read: the next upsert writes a new version beside it.
        let (v3, c) = start_with(&st, "k", 100, &same_host()).unwrap();
        assert!(v3 > v2);
        assert_ne!(c, a);
        assert_eq!(st.metrics.upsert_in_place.get(), 1);
    }

    #[test]
    fn a_reader_held_by_a_rewrite_is_not_held_again_by_the_next_one() {
        let st = state_unreachable_owner();
        let ((_, a), (v2, _)) = rewrite_started(&st);
        let (rx, reader) = spawn_lookup(&st);
        // Once the lookup is waiting, the rewrite commits and the writer
        // starts again before the reader gets the lock: that upsert must
        // not rewrite in place a second time.
        while !st.inner.lock().objects["k"].reader_waiting() {
            std::thread::yield_now();
        }
        commit(&st, "k", v2);
        let (v3, c) = start_with(&st, "k", 100, &same_host()).unwrap();
        assert_ne!(c, a, "a waiting reader's key is not rewritten again");
        let got = rx.recv().unwrap().remove(0).unwrap();
        reader.join().unwrap().unwrap();
        // The reader got the committed version (v2, rewritten in place).
        assert_eq!(got.replicas[0].offset, a);
        commit(&st, "k", v3);
        assert_eq!(st.metrics.upsert_in_place.get(), 1);
    }

    #[test]
    fn only_a_writer_on_the_replicas_host_with_the_same_size_rewrites_in_place() {
        let st = state_unreachable_owner();
        let (v1, a) = start_with(&st, "k", 100, &same_host()).unwrap();
        commit(&st, "k", v1);
        let elsewhere = WriteConfig {
            writer_host_id: "other".into(),
            ..same_host()
        };
        let (v2, b) = start_with(&st, "k", 100, &elsewhere).unwrap();
        assert_ne!(a, b);
        commit(&st, "k", v2);
        let (v3, c) = start_with(&st, "k", 200, &same_host()).unwrap();
        assert_ne!(c, b);
        commit(&st, "k", v3);
        let two = WriteConfig {
            replica_num: 2,
            ..same_host()
        };
        let (v4, d) = start_with(&st, "k", 200, &two).unwrap();
        assert_ne!(d, c);
        commit(&st, "k", v4);
        // A writer that reaches the host's segments over TCP only.
        let tcp = WriteConfig {
            writer_maps_host: false,
            ..same_host()
        };
        let (v5, e) = start_with(&st, "k", 200, &tcp.clone()).unwrap();
        assert_ne!(e, d);
        commit(&st, "k", v5);
        assert_eq!(st.metrics.upsert_in_place.get(), 0);
        assert_eq!(st.metrics.upsert_versions.get(), 4);
        assert_eq!(lookup(&st, "k", false).size, 200);
        // ... unless the replica is in the writer's own segment.
        let own = WriteConfig {
            writer_own_segments: vec!["h:1".into()],
            ..tcp
        };
        let (v6, f) = start_with(&st, "k", 200, &own).unwrap();
        assert_eq!(f, e);
        commit(&st, "k", v6);
        assert_eq!(st.metrics.upsert_in_place.get(), 1);
    }

    #[test]
    fn a_revoked_rewrite_takes_the_key_with_it() {
        let st = state_unreachable_owner();
        let (_, (v2, _)) = rewrite_started(&st);
        st.put_revoke(&keys("k"), &[v2]);
        // Half-written bytes are never served: the key is gone.
        assert_eq!(
            st.get_replica_list(&keys("k"), true).remove(0).unwrap_err(),
            ErrorCode::ObjectNotFound
        );
        assert_eq!(used(&st), 0);
        assert_eq!(st.exist(&keys("k")), vec![0]);
    }
}
