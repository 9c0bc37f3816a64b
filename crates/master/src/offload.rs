//! Disk copies: objects kept on their owner's disk tier, written through
//! when they are committed or moved there when memory eviction selects
//! them.
//!
//! An owner announces its disk tier (and what it already holds) with
//! `DiskTier` after mounting. In a master that offloads (`--enable_offload`
//! or `--root_fs_dir`), by default every committed object with a replica on
//! such an owner's segment is also queued for a copy to disk: the owner
//! gets a [`LedgerOp::Persist`] and writes the bytes to its tier, and the
//! replica stays in memory. Eviction then only drops the memory replicas of
//! an object with a disk copy (their forgets come after the copy in the
//! owner's queue, so the space is reused only once the bytes are on disk).
//! With `--offload_on_evict`, nothing is copied at commit: when eviction
//! selects such an object and the disk copies fit
//! `--global_file_segment_size`, the owner gets a [`LedgerOp::Offload`]
//! for that replica: it copies the bytes to disk before acknowledging, and
//! the space is reused only after the ack. Either way, at most
//! `--offloading_queue_limit` copies are queued for one owner at a time.
//!
//! An object whose memory replicas are gone keeps its key and version with
//! [`Object::disk`] naming the owner's segment; reads go to the owner.
//! Removing or replacing the object sends the owner a
//! [`LedgerOp::DiskForget`]; copies the owner loses (its disk tier evicted
//! them, or a write failed) are reported with `DiskDropped` and forgotten
//! (an object with a memory replica stays). A segment that goes away takes
//! its disk copies with it. An object eviction cannot queue for disk stays
//! in memory (see `eviction` for when it is dropped instead).

use crate::config::MasterConfig;
use crate::segments::SegId;
use crate::state::{Inner, MasterState, ObjStatus, Object, Promotion, Replica, Replicas};
use mooncake_common::ledger::{LedgerOp, PromoteResult};
use mooncake_common::proto::{DiskLoc, DiskObject};
use mooncake_common::ErrorCode;
use std::sync::Arc;

impl Inner {
    /// Where the disk copy of `key` at `version` on segment `seg` is read.
    pub(crate) fn disk_loc(&self, key: &str, version: u64, seg: SegId) -> Option<DiskLoc> {
        let s = self.segments.by_id(seg)?;
        Some(DiskLoc {
            key: key.to_string(),
            version,
            segment_name: s.desc.name.clone(),
            endpoint: s.desc.endpoint.clone(),
        })
    }

    /// `o` (the object `key`, taken out of the table) is going away: its
    /// owner deletes the disk copy.
    pub(crate) fn forget_disk(&self, key: &str, o: &Object) {
        self.forget_disk_copy(key, o.version, o.disk());
    }

    /// The disk copy of `key` at `version` on `disk` is no longer wanted
    /// (the table no longer records it): its owner deletes it.
    pub(crate) fn forget_disk_copy(&self, key: &str, version: u64, disk: Option<SegId>) {
        let Some(seg) = disk else {
            return;
        };
        if let Some(s) = self.segments.by_id(seg) {
            s.ledger.push(LedgerOp::DiskForget {
                key: key.to_string(),
                version,
            });
        }
    }

    /// The replica of `o` whose owner has a disk tier, if any.
    fn tier_replica(&self, o: &Object) -> Option<Replica> {
        o.replicas
            .iter()
            .find(|r| self.segments.by_id(r.seg).is_some_and(|s| s.disk_tier))
            .copied()
    }

    /// Whether the owner of `seg` has `limit` copies to disk queued already.
    fn queue_full(&self, seg: SegId, limit: u64) -> bool {
        self.segments
            .by_id(seg)
            .is_none_or(|s| s.ledger.disk_writes() >= limit)
    }

    /// Write-through: queue a copy of the committed object `key` to the disk
    /// tier of the owner of one of its replicas; the replicas stay in
    /// memory, and a later eviction only drops them. Nothing is done unless
    /// the answer is [`Offload::Moved`].
    pub(crate) fn persist_object(&mut self, key: &str, cap: u64, queue_limit: u64) -> Offload {
        let (chosen, version, size) = match self.disk_target(key, cap, queue_limit, false) {
            Ok(t) => t,
            Err(why) => return why,
        };
        let Some(s) = self.segments.by_id(chosen.seg) else {
            return Offload::NoTier;
        };
        s.ledger.push(LedgerOp::Persist {
            offset: chosen.offset,
            version,
            key: key.to_string(),
            size,
        });
        // Its bytes now count against the tier's capacity.
        self.objects.set_disk(key, chosen.seg);
        Offload::Moved
    }

    /// The replica of `key` whose owner can copy it to disk now, with the
    /// object's version and size; otherwise why not: [`Offload::NoTier`]
    /// (no complete, memory-only object, or no owner with a disk tier),
    /// [`Offload::Busy`] (with `refuse_busy`: an upsert is in flight) or
    /// [`Offload::Full`] (the tier's bytes or that owner's queue).
    fn disk_target(
        &self,
        key: &str,
        cap: u64,
        queue_limit: u64,
        refuse_busy: bool,
    ) -> Result<(Replica, u64, u64), Offload> {
        let Some(o) = self.objects.get(key) else {
            return Err(Offload::NoTier);
        };
        if o.status != ObjStatus::Complete || o.disk().is_some() || o.replicas.is_empty() {
            return Err(Offload::NoTier);
        }
        let Some(chosen) = self.tier_replica(o) else {
            return Err(Offload::NoTier);
        };
        if refuse_busy && !o.upserts().is_empty() {
            return Err(Offload::Busy);
        }
        if !self.objects.disk().fits(o.size, cap) || self.queue_full(chosen.seg, queue_limit) {
            return Err(Offload::Full);
        }
        Ok((chosen, o.version, o.size))
    }

    /// Eviction selected `key`, which has a disk copy: its memory replicas
    /// go (their space returns on the owners' acks, which come after the
    /// copy to disk was made) and reads go to the disk copy.
    /// [`Offload::NoTier`] when it has no disk copy or no memory replica.
    pub(crate) fn evict_to_disk_copy(&mut self, key: &str) -> Offload {
        let Some(o) = self.objects.get(key) else {
            return Offload::NoTier;
        };
        if o.status != ObjStatus::Complete || o.disk().is_none() || o.replicas.is_empty() {
            return Offload::NoTier;
        }
        if !o.upserts().is_empty() {
            return Offload::Busy;
        }
        self.release_replicas(key, None);
        Offload::Moved
    }

    /// Move `key` (selected by eviction) to the disk tier of the owner of
    /// one of its replicas: that replica's owner copies it to disk before
    /// acknowledging, the other replicas are forgotten, and every replica's
    /// space returns on its owner's ack. Nothing is done unless the answer
    /// is [`Offload::Moved`].
    pub(crate) fn offload_object(&mut self, key: &str, cap: u64, queue_limit: u64) -> Offload {
        let (chosen, _, _) = match self.disk_target(key, cap, queue_limit, true) {
            Ok(t) => t,
            Err(why) => return why,
        };
        self.release_replicas(key, Some(chosen));
        // Its bytes now count against the tier's capacity.
        self.objects.set_disk(key, chosen.seg);
        Offload::Moved
    }

    /// Every memory replica of `key` goes, its space returning on its
    /// owner's ack; the owner of `copy` first copies its bytes to disk.
    fn release_replicas(&mut self, key: &str, copy: Option<Replica>) {
        let Some(o) = self.objects.get(key) else {
            return;
        };
        let (version, size) = (o.version, o.size);
        let replicas: Replicas = o.replicas.clone();
        let mut waits = Vec::new();
        for r in &replicas {
            let Some(seg) = self.segments.by_id(r.seg) else {
                continue;
            };
            let op = if Some(*r) == copy {
                LedgerOp::Offload {
                    offset: r.offset,
                    version,
                    key: key.to_string(),
                    size,
                }
            } else {
                LedgerOp::Forget {
                    offset: r.offset,
                    version,
                }
            };
            let q = Arc::clone(&seg.ledger);
            let seq = q.push_forget_then_free(op, r.offset, size);
            waits.push((q, seq));
        }
        self.forgets.remember(key, &waits);
        if let Some(o) = self.objects.get_mut(key) {
            o.replicas.clear();
        }
    }
}

impl Inner {
    /// A read found `key` with no memory replica but a disk copy, in a
    /// master that promotes: count the read, and once `key` was read
    /// `--promotion_admission_threshold` times, start its promotion unless
    /// one is in flight, `--promotion_queue_limit` are, puts are waiting
    /// for room, or memory would pass its high watermark. The space is
    /// allocated on the segment of the disk copy's owner, which reads the
    /// copy into it ([`LedgerOp::Promote`]) and reports the result
    /// ([`MasterState::promoted`]). Returns whether it started.
    pub(crate) fn note_disk_read(&mut self, key: &str, cfg: &MasterConfig) -> bool {
        let Some(o) = self.objects.get_mut(key) else {
            return false;
        };
        if o.status != ObjStatus::Complete || !o.replicas.is_empty() || o.promoting {
            return false;
        }
        let Some(seg) = o.disk() else {
            return false;
        };
        o.disk_hits = o.disk_hits.saturating_add(1);
        if u32::from(o.disk_hits) < cfg.promotion_admission_threshold {
            return false;
        }
        let (version, size) = (o.version, o.size);
        if self.promotions.len() >= cfg.promotion_queue_limit as usize
            || !self.space_queue.is_empty()
        {
            return false;
        }
        let (used, total) = self.usage();
        if total == 0
            || used.saturating_add(size) as f64 > cfg.eviction_high_watermark_ratio * total as f64
        {
            return false;
        }
        if self.admit_write(key, size).is_err() {
            return false;
        }
        let tag = self.tenant_tag(key);
        let Some(s) = self.segments.by_id_mut(seg) else {
            return false;
        };
        let Some(offset) = s.alloc.alloc(size) else {
            return false;
        };
        s.alloc.tag(offset, size, tag);
        s.ledger.push(LedgerOp::Promote {
            offset,
            version,
            key: key.to_string(),
            size,
        });
        self.promotions.insert(
            (seg, offset),
            Promotion {
                key: key.into(),
                version,
                size,
            },
        );
        if let Some(o) = self.objects.get_mut(key) {
            o.promoting = true;
        }
        true
    }
}

/// What eviction did with an object it selected, in a master that offloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offload {
    /// On its way to its owner's disk tier.
    Moved,
    /// No replica's owner has a disk tier: eviction drops it, as without
    /// offload.
    NoTier,
    /// The disk copies would pass `--global_file_segment_size`, or the
    /// owner has `--offloading_queue_limit` copies queued: it stays in
    /// memory (an acknowledged value is dropped for want of disk only with
    /// `--offload_force_evict`).
    Full,
    /// An upsert of it is in flight: it stays until a later pass.
    Busy,
}

impl MasterState {
    /// The owner of `segment_name` has a disk tier holding `objects`: adopt
    /// as disk copies the objects this master does not know, and the copies
    /// of the very versions it holds in memory without one (1 per object;
    /// 0 where it knows the key otherwise, whose copy the owner deletes). From now
    /// on evicted replicas on that segment move to the owner's disk. A
    /// segment this master expired, come back, has none adopted: its disk
    /// copies were dropped with it (the owner deletes them), and its keys
    /// may since have been written again or removed. Nor is a copy of a
    /// key whose object this master removed (see `gone_keys`).
    pub fn disk_tier(
        &self,
        client_id: &str,
        segment_name: &str,
        objects: Vec<DiskObject>,
        done: bool,
    ) -> Result<Vec<i32>, ErrorCode> {
        let now = self.clock.now();
        let mut g = self.inner.lock();
        let (seg, stale) = match g.segments.get_mut(segment_name) {
            Some(s) if s.client_id == client_id => {
                let stale = s.stale_disk;
                if done {
                    s.stale_disk = false;
                }
                if done && !s.disk_tier {
                    s.disk_tier = true;
                    if !self.cfg.offloads() {
                        tracing::warn!(segment = segment_name, "the owner has a disk tier, but this master runs without --enable_offload or --root_fs_dir: evicted objects are dropped");
                    }
                }
                (g.segments.id_of(segment_name), stale)
            }
            Some(_) => return Err(ErrorCode::IllegalClient),
            None => return Err(ErrorCode::SegmentNotFound),
        };
        let Some(seg) = seg else {
            return Err(ErrorCode::SegmentNotFound);
        };
        if stale && !objects.is_empty() {
            tracing::warn!(
                segment = segment_name,
                objects = objects.len(),
                "an expired segment's disk copies were dropped with it; not adopted"
            );
        }
        let codes = objects
            .into_iter()
            .map(|d| {
                if d.key.is_empty() || stale {
                    return 0;
                }
                if let Some(o) = g.objects.get(d.key.as_str()) {
                    // The copy of a version known in memory (written through
                    // before this master took over) is its disk copy.
                    let same = o.version == d.version
                        && o.size == d.size
                        && o.status == ObjStatus::Complete
                        && o.disk().is_none();
                    return i32::from(same && g.objects.set_disk(d.key.as_str(), seg));
                }
                if g.gone.contains(d.key.as_str()) {
                    // A leftover of an object this master removed.
                    return 0;
                }
                let o = Object::complete(d.size, d.version, Replicas::new(), now, None, false)
                    .on_disk(seg);
                g.last_version = g.last_version.max(d.version);
                g.objects.insert(d.key.into_boxed_str(), o);
                1
            })
            .collect();
        Ok(codes)
    }

    /// The owner of `segment_name` applied these promotions
    /// (`(key, version, offset, copied)`): a copied one whose object is
    /// still that version, on disk there, with no memory replica, gets the
    /// space as its memory replica; otherwise the space is freed. Unknown
    /// entries are ignored.
    pub fn promoted(
        &self,
        client_id: &str,
        segment_name: &str,
        done: &[PromoteResult],
    ) -> Result<(), ErrorCode> {
        let mut g = self.inner.lock();
        let seg = g.segments.owned_id(client_id, segment_name)?;
        let mut freed = false;
        for (key, version, offset, copied) in done {
            let Some(p) = g.promotions.remove(&(seg, *offset)) else {
                continue;
            };
            let mut installed = false;
            if let Some(o) = g.objects.get_mut(&p.key) {
                o.promoting = false;
                if *copied
                    && *p.key == **key
                    && p.version == *version
                    && o.version == p.version
                    && o.status == ObjStatus::Complete
                    && o.replicas.is_empty()
                    && o.disk() == Some(seg)
                {
                    o.replicas.push(Replica {
                        seg,
                        offset: *offset,
                    });
                    o.disk_hits = 0;
                    installed = true;
                }
            }
            if installed {
                self.metrics.promoted_objects.inc();
            } else if let Some(s) = g.segments.by_id_mut(seg) {
                s.alloc.free(*offset, p.size);
                freed = true;
            }
        }
        if freed {
            self.note_space_freed();
        }
        Ok(())
    }

    /// The owner of `segment_name` lost these disk copies: forget them
    /// (an object left with no replica at all is gone).
    pub fn disk_dropped(
        &self,
        client_id: &str,
        segment_name: &str,
        objects: &[(String, u64)],
    ) -> Result<(), ErrorCode> {
        let mut g = self.inner.lock();
        let seg = g.segments.owned_id(client_id, segment_name)?;
        let mut lost = 0u64;
        for (key, version) in objects {
            let Some(o) = g.objects.get(key.as_str()) else {
                continue;
            };
            if o.disk() != Some(seg) || o.version != *version {
                continue;
            }
            let gone = o.replicas.is_empty();
            g.objects.take_disk(key.as_str());
            if gone {
                g.erase_bare(key);
                lost += 1;
            }
        }
        if lost > 0 {
            tracing::info!(
                segment = segment_name,
                objects = lost,
                "objects left the owner's disk tier"
            );
        }
        Ok(())
    }

    /// The owner of `segment_name` drains its disk tier
    /// (`unmount_local_disk_segment`): every disk copy on it is forgotten
    /// (an object with no memory replica left is gone, as when the segment
    /// goes away) and no copy is queued to it any more, until it announces
    /// a tier again.
    pub fn drain_disk_tier(&self, client_id: &str, segment_name: &str) -> Result<(), ErrorCode> {
        let mut g = self.inner.lock();
        let seg = g.segments.owned_id(client_id, segment_name)?;
        if let Some(s) = g.segments.by_id_mut(seg) {
            s.disk_tier = false;
        }
        let gone = g.objects.drop_disk_copies_on(seg);
        for k in &gone {
            g.erase_bare(k);
        }
        tracing::info!(
            segment = segment_name,
            gone = gone.len(),
            "the owner drained its disk tier"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests;
