//! Versioned replicas: how an upsert replaces a value that readers are
//! copying without tearing their reads or starving the writer.
//!
//! An upsert of a committed object that may be being read never writes
//! into the object's current replicas. It gets fresh allocations (same
//! placement rules, replication and pins as any write) and stays a
//! [`PendingWrite`] of the object while its bytes are copied; readers keep
//! getting the committed replicas. Its commit switches the object to the
//! new version in one locked step; the replaced replicas are forgotten in
//! their owners' ledgers before the upsert is acknowledged (so no master
//! ever serves the old version again, even after a restart) and become a
//! [`Retired`] version that stays allocated, its bytes unchanged, until
//! every read that may still copy from it has finished (its client
//! reported the read ticket) or its lease ran out (a client discards a copy
//! that finishes after its lease). A removal of an object that is being
//! read retires its replicas the same way.
//!
//! An upsert of an object nobody is reading, whose replicas the writer
//! reaches by a memory copy on its own host and which keeps its size and
//! placement, rewrites the committed replicas in place instead (no second
//! allocation, and the destination stays in the writer's cache). Before the
//! writer gets the replicas, their owners forget the committed version (a
//! master that restarts meanwhile never serves half-written bytes); while
//! the write is in flight the object is PROCESSING, and lookups, removals
//! and other upserts of the key wait for it to end rather than fail; a
//! lookup that had to wait makes the next upsert of the key write a new
//! version beside it, so a writer looping on the key cannot keep a reader
//! waiting. A rewrite that is revoked or goes stale takes the key with it.
//!
//! Retired versions count against capacity until freed, and eviction never
//! sees them. A key may hold at most `max_pending_versions_per_key` of them:
//! an upsert of a key at the limit waits (up to `pending_version_wait_ms`)
//! for one to be freed, then fails with OBJECT_REPLICA_BUSY.

use crate::durable::{Handed, Waits};
use crate::retired::Retired;
use crate::state::{Inner, MasterState, ObjStatus, Object, Replica};
use mooncake_common::ledger::LedgerOp;
use mooncake_common::proto::WriteConfig;
use parking_lot::MutexGuard;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a lookup held by an in-place rewrite looks again (a missed
/// wake-up costs at most this).
const REWRITE_RECHECK: Duration = Duration::from_millis(20);

impl Inner {
    /// Whether an upsert of `o` with `size` bytes under `cfg` may rewrite
    /// its committed replicas in place at `now`: no read may be in flight
    /// or waiting for an earlier rewrite, and no other upsert, the size, replica count and placement stay, no
    /// disk copy exists, and the writer reaches every replica through
    /// memory (its own segment, or one on its host while its same-host path
    /// is on), so the write cannot stop half done on a broken connection;
    /// none is in `exclude`.
    pub(crate) fn rewritable(
        &self,
        o: &Object,
        size: u64,
        cfg: &WriteConfig,
        exclude: &[String],
        now: Instant,
    ) -> bool {
        o.status == ObjStatus::Complete
            && o.size == size
            && o.disk().is_none()
            && !o.replicas.is_empty()
            && o.replicas.len() == cfg.replica_num.max(1) as usize
            && o.upserts().is_empty()
            && !o.being_read(now)
            && !o.reader_waiting()
            && o.replicas.iter().all(|r| {
                self.segments.by_id(r.seg).is_some_and(|s| {
                    let by_memory = cfg.writer_own_segments.contains(&s.desc.name)
                        || (cfg.writer_maps_host
                            && !cfg.writer_host_id.is_empty()
                            && s.desc.host_id == cfg.writer_host_id);
                    by_memory
                        && !exclude.contains(&s.desc.name)
                        && (cfg.preferred_segments.is_empty()
                            || cfg.preferred_segments.contains(&s.desc.name))
                })
            })
    }

    /// Retire the committed `replicas` of `key` at `version`: their owners
    /// forget them now (through `handed` for segments in `local`, which the
    /// writer records itself, otherwise through the owner's queue, whose
    /// acks the returned waits name), and the space is freed once no read
    /// in `readers` is left. Returns whether it was freed at once.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn retire(
        &mut self,
        key: &str,
        version: u64,
        size: u64,
        replicas: &[Replica],
        readers: Vec<(u64, Instant)>,
        local: &[String],
        now: Instant,
        waits: &mut Waits,
        handed: &mut Handed,
    ) -> bool {
        let mut kept = Vec::with_capacity(replicas.len());
        let mut pushed = Vec::new();
        for r in replicas {
            let Some(seg) = self.segments.by_id(r.seg) else {
                continue;
            };
            let op = LedgerOp::Forget {
                offset: r.offset,
                version,
            };
            let seq = if local.contains(&seg.desc.name) {
                handed.push((seg.desc.name.clone(), op));
                0
            } else {
                let q = Arc::clone(&seg.ledger);
                let seq = q.push(op);
                pushed.push((q, seq));
                seq
            };
            kept.push((*r, seq));
        }
        if !pushed.is_empty() {
            // A later write of the key is acknowledged only after these.
            self.forgets.remember(key, &pushed);
            waits.extend(pushed);
        }
        let r = Retired {
            size,
            replicas: kept,
            readers,
        };
        match self.retired.hold(key, r, now) {
            Some(r) => {
                self.free_retired(r);
                true
            }
            None => false,
        }
    }

    /// Return a retired version's space: at once where its forget is
    /// acknowledged (or was handed to the writer), else when the ack comes.
    pub(crate) fn free_retired(&mut self, r: Retired) {
        for (rep, seq) in r.replicas {
            let Some(seg) = self.segments.by_id_mut(rep.seg) else {
                continue;
            };
            if seq == 0 || !seg.ledger.free_after(seq, rep.offset, r.size) {
                seg.alloc.free(rep.offset, r.size);
            }
        }
    }

    /// Drop the reads of `key`'s retired versions that ended (`ticket`
    /// reported, or the lease expired at `now`) and free the versions no
    /// read is left on. Returns how many were freed.
    pub(crate) fn release_retired(&mut self, key: &str, now: Instant, ticket: Option<u64>) -> u64 {
        let free = self.retired.release(key, now, ticket);
        let n = free.len() as u64;
        for r in free {
            self.free_retired(r);
        }
        n
    }

    /// Drop an object's upserts in flight. Their writers may still be
    /// copying into the replicas, so the space is released only after the
    /// discard delay (as for a stale first write), or once each writer
    /// ends or revokes its write.
    pub(crate) fn discard_upserts(&mut self, o: &mut Object, release: Duration) {
        for p in o.take_upserts_where(|_| true) {
            self.defer_free(&p.replicas, p.size, p.version, p.put_start + release);
        }
    }

    /// Erase `key`'s object, left with no copy at all (its disk copy was
    /// lost, or its last copy went with its segment or its drained disk
    /// tier): its upserts in flight keep their space until their writers
    /// end or revoke them (or the discard delay passes), as when a removal
    /// drops the object; their space is not lost with it.
    pub(crate) fn erase_bare(&mut self, key: &str) {
        if let Some(mut o) = self.objects.remove(key) {
            let release = self.discard_release;
            self.discard_upserts(&mut o, release);
        }
    }

    /// Remove `key`'s object: its owners forget its committed replicas; the
    /// space returns on their acks, or, while reads of it are in flight,
    /// once those reads ended. Returns the forgets to wait for.
    pub(crate) fn remove_object(&mut self, key: &str, now: Instant, release: Duration) -> Waits {
        match self.objects.remove_entry(key) {
            Some((k, o)) => self.drop_object(k, o, now, release, false),
            None => Vec::new(),
        }
    }

    /// [`Inner::remove_object`] for an object already taken out of the map.
    /// With `bulk`, the forgets of an unread object are remembered as a
    /// bulk removal's (per owner queue, see `forgets`), not under its key,
    /// and none is returned.
    pub(crate) fn drop_object(
        &mut self,
        key: Box<str>,
        mut o: Object,
        now: Instant,
        release: Duration,
        bulk: bool,
    ) -> Waits {
        self.gone.note(&key);
        self.forget_disk(&key, &o);
        self.discard_upserts(&mut o, release);
        if o.status == ObjStatus::Complete && o.being_read(now) {
            let mut waits = Vec::new();
            let mut handed = Vec::new();
            let readers = o.take_readers();
            self.retire(
                &key,
                o.version,
                o.size,
                &o.replicas,
                readers,
                &[],
                now,
                &mut waits,
                &mut handed,
            );
            waits
        } else if bulk {
            self.push_forgets_bulk(&o);
            Vec::new()
        } else {
            self.forget_replicas(key, &o)
        }
    }
}

impl MasterState {
    /// Wait (releasing the lock) while one of `keys` is being rewritten in
    /// place, at most until that rewrite would be discarded as stale.
    pub(crate) fn wait_rewrites<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
        keys: &[String],
    ) -> MutexGuard<'a, Inner> {
        while self.rewrite_held(&g, keys) {
            self.rewrite_done.wait_for(&mut g, REWRITE_RECHECK);
        }
        g
    }

    /// Whether one of `keys` is being rewritten in place by a write not
    /// yet past the discard delay.
    pub(crate) fn rewrite_held(&self, g: &Inner, keys: &[String]) -> bool {
        let discard = Duration::from_secs(self.cfg.put_start_discard_timeout_sec);
        let now = self.clock.now();
        keys.iter().any(|k| {
            g.objects
                .get(k.as_str())
                .and_then(Object::rewrite_start)
                .is_some_and(|t| now.saturating_duration_since(t) <= discard)
        })
    }

    /// Before an upsert batch: wait (releasing the lock) until every key in
    /// `keys` holds fewer retired versions than the limit, at most
    /// `pending_version_wait_ms`. Keys still at the limit afterwards fail
    /// with OBJECT_REPLICA_BUSY in the caller. Also returns whether the
    /// lock was released meanwhile.
    pub(crate) fn wait_for_version_slots<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
        keys: &[String],
    ) -> (MutexGuard<'a, Inner>, bool) {
        let limit = self.cfg.max_pending_versions_per_key.max(1) as usize;
        if !keys.iter().any(|k| g.retired.count(k) >= limit) {
            return (g, false);
        }
        self.metrics.upsert_version_waits.inc();
        // The wait itself is real time; lease expiries are on the state's clock.
        let deadline = Instant::now() + Duration::from_millis(self.cfg.pending_version_wait_ms);
        loop {
            let now = self.clock.now();
            let mut wake = deadline;
            let mut full = false;
            for k in keys {
                if g.retired.count(k) < limit {
                    continue;
                }
                let freed = g.release_retired(k, now, None);
                if freed > 0 {
                    self.metrics.retired_versions_freed.inc_by(freed);
                    self.version_freed.notify_all();
                }
                if g.retired.count(k) >= limit {
                    full = true;
                    if let Some(t) = g.retired.free_by(k) {
                        wake = wake.min(Instant::now() + t.saturating_duration_since(now));
                    }
                }
            }
            let real = Instant::now();
            if !full || real >= deadline {
                return (g, true);
            }
            self.version_freed
                .wait_until(&mut g, wake.max(real + Duration::from_millis(1)));
        }
    }

    /// Free the retired versions whose reads all ended (periodic sweep).
    pub(crate) fn sweep_retired(&self, g: &mut Inner, now: Instant) {
        let free = g.retired.release_all(now);
        let freed = free.len() as u64;
        for r in free {
            g.free_retired(r);
        }
        if freed > 0 {
            self.metrics.retired_versions_freed.inc_by(freed);
            self.version_freed.notify_all();
            self.note_space_freed();
        }
    }
}
