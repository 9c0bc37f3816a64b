//! How the master's mutations reach the segment owners' ledgers (see
//! `mooncake_common::ledger`): commits when a write ends, forgets when a
//! committed replica goes away, and the waits that make a write or removal
//! acknowledged only once the owners know. Space a forget frees returns to
//! the allocator when the owner acknowledges the forget
//! ([`MasterState::release_forgotten`]).

use crate::ledger_push::{AckWait, OwnerQueue, ACK_TIMEOUT};
use crate::state::{Inner, MasterState, Object, PendingPin, Replica};
use mooncake_common::auth::unix_ms;
use mooncake_common::ledger::{alloc_len, LedgerEntry, LedgerOp};
use std::sync::Arc;
use std::time::Instant;

/// The soft-pin deadline (Unix ms) a commit applying `pin` records, given
/// the object's current deadline.
pub(crate) fn soft_pin_until_ms(
    pin: PendingPin,
    current: Option<Instant>,
    now: Instant,
) -> Option<u64> {
    let now_ms = unix_ms();
    match pin {
        PendingPin::Keep => current
            .filter(|d| *d > now)
            .map(|d| now_ms.saturating_add(d.saturating_duration_since(now).as_millis() as u64)),
        PendingPin::Set(ms) => Some(now_ms.saturating_add(ms)),
        PendingPin::Clear => None,
    }
}

pub(crate) use crate::forgets::Waits;
/// Waits of commits, each tagged with its replica's segment.
pub(crate) type TaggedWaits = Vec<(String, Arc<OwnerQueue>, u64)>;
/// Ledger commits handed back to the writer, with their segments.
pub(crate) type Handed = Vec<(String, LedgerOp)>;

impl Inner {
    /// Tell the owners of `o`'s replicas that they are gone; each replica's
    /// space is released once its owner acknowledges. The forgets are also
    /// remembered under `key`, so that a later write of the key is
    /// acknowledged only after them.
    pub(crate) fn forget_replicas(&mut self, key: Box<str>, o: &Object) -> Waits {
        let waits = self.push_forgets(o);
        self.forgets.remember(&key, &waits);
        waits
    }

    /// Tell the owners of `o`'s replicas that they are gone (space released
    /// on their acks), without remembering the forgets under the key.
    pub(crate) fn push_forgets(&mut self, o: &Object) -> Waits {
        o.replicas
            .iter()
            .filter_map(|r| self.push_forget(r, o))
            .collect()
    }

    /// [`Inner::push_forgets`] for a bulk removal: the forgets are
    /// remembered as the removal's (see `forgets`) instead of being
    /// returned, so removing a million objects allocates nothing per object.
    pub(crate) fn push_forgets_bulk(&mut self, o: &Object) {
        for r in &o.replicas {
            if let Some((q, seq)) = self.push_forget(r, o) {
                self.forgets.note_bulk(q, seq);
            }
        }
    }

    /// Queue the forget of replica `r` of `o` on its owner's ledger (its
    /// space is released on the owner's ack); `None` when its segment is gone.
    fn push_forget(&self, r: &Replica, o: &Object) -> Option<(Arc<OwnerQueue>, u64)> {
        let q = Arc::clone(&self.segments.by_id(r.seg)?.ledger);
        let op = LedgerOp::Forget {
            offset: r.offset,
            version: o.version,
        };
        let seq = q.push_forget_then_free(op, r.offset, o.size);
        Some((q, seq))
    }

    /// Record `replicas` of `key` at `version` (about to become the
    /// object's COMPLETE version) in their owners' ledgers, with the soft
    /// pin the commit will apply (Unix ms). Commits for segments in `local`
    /// are returned instead (the writer's own process owns them and
    /// records them before its write returns). The waits are tagged with
    /// their replica's segment.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn commit_replicas(
        &self,
        key: &str,
        version: u64,
        size: u64,
        replicas: &[Replica],
        hard_pin: bool,
        soft_pin_until_ms: Option<u64>,
        local: &[String],
    ) -> (TaggedWaits, Handed) {
        let mut waits = Vec::new();
        let mut handed = Vec::new();
        for r in replicas {
            if let Some(seg) = self.segments.by_id(r.seg) {
                let op = LedgerOp::Commit(LedgerEntry {
                    key: key.to_string(),
                    version,
                    offset: r.offset,
                    size,
                    hard_pin,
                    soft_pin_until_ms,
                });
                if local.contains(&seg.desc.name) {
                    handed.push((seg.desc.name.clone(), op));
                } else {
                    let q = Arc::clone(&seg.ledger);
                    let seq = q.push(op);
                    waits.push((seg.desc.name.clone(), q, seq));
                }
            }
        }
        (waits, handed)
    }

    /// Tell the owners of `replicas` (outside `local`) to forget their
    /// entries at `version`, without releasing space (whoever dropped the
    /// write releases it, or the space stays in use, as for an in-place
    /// rewrite). Returns the acks to wait for where that matters.
    pub(crate) fn forget_entries(
        &self,
        version: u64,
        replicas: &[Replica],
        local: &[String],
    ) -> Waits {
        replicas
            .iter()
            .filter_map(|r| {
                let seg = self.segments.by_id(r.seg)?;
                if local.contains(&seg.desc.name) {
                    return None;
                }
                let q = Arc::clone(&seg.ledger);
                let seq = q.push(LedgerOp::Forget {
                    offset: r.offset,
                    version,
                });
                Some((q, seq))
            })
            .collect()
    }

    /// Forget committed `replicas` at `version` whose write lost
    /// (superseded, or its object went away while it committed): pushed
    /// after the queued commit, each replica's space returning on the ack.
    pub(crate) fn forget_committed(&mut self, version: u64, size: u64, replicas: &[Replica]) {
        for r in replicas {
            if let Some(seg) = self.segments.by_id(r.seg) {
                let op = LedgerOp::Forget {
                    offset: r.offset,
                    version,
                };
                seg.ledger.push_forget_then_free(op, r.offset, size);
            }
        }
    }

    /// Whether replica `r` lives in one of the segments named in `names`.
    pub(crate) fn in_segments(&self, r: &Replica, names: &[String]) -> bool {
        let name = self.segments.name_of(r.seg);
        !name.is_empty() && names.iter().any(|n| n == name)
    }

    /// Drop the replicas of `key` that live in `segments` (their owners did
    /// not confirm the commit): each owner is told to forget it (after the
    /// commit still queued for it) and the space returns on that ack.
    pub(crate) fn drop_unconfirmed(&mut self, key: &str, segments: &[String]) {
        let Some(o) = self.objects.get(key) else {
            return;
        };
        let (gone, keep): (Vec<Replica>, Vec<Replica>) = o
            .replicas
            .iter()
            .partition(|r| self.in_segments(r, segments));
        let (version, size) = (o.version, o.size);
        self.forget_committed(version, size, &gone);
        if keep.is_empty() {
            self.objects.remove(key);
        } else if let Some(o) = self.objects.get_mut(key) {
            o.replicas = keep.into_iter().collect();
        }
    }
}

impl MasterState {
    /// Wait (without the state lock) until every op in `waits` is
    /// acknowledged by its owner, at most [`ACK_TIMEOUT`] in all. Ops an
    /// owner did not acknowledge are counted as unconfirmed (they stay
    /// queued and reach the owner when it reconnects).
    pub(crate) fn await_owners(&self, waits: &Waits) {
        if waits.is_empty() {
            return;
        }
        // Acks are cumulative per queue: wait for each queue's last op only.
        let mut last: Vec<(&Arc<OwnerQueue>, u64, u64)> = Vec::new();
        for (q, seq) in waits {
            match last.iter_mut().find(|(l, _, _)| Arc::ptr_eq(l, q)) {
                Some((_, max, n)) => {
                    *max = (*max).max(*seq);
                    *n += 1;
                }
                None => last.push((q, *seq, 1)),
            }
        }
        let deadline = Instant::now() + ACK_TIMEOUT;
        let mut unconfirmed = 0u64;
        for (q, seq, n) in last {
            if q.wait(seq, deadline) == AckWait::Unconfirmed {
                unconfirmed += n;
            }
        }
        if unconfirmed > 0 {
            self.metrics.ledger_unconfirmed.inc_by(unconfirmed);
            tracing::warn!(
                unconfirmed,
                "segment owners did not acknowledge ledger updates within {} ms",
                ACK_TIMEOUT.as_millis()
            );
        }
    }

    /// The ledger queue of `segment` and its memory id, if `client_id` owns it.
    pub(crate) fn ledger_queue(
        &self,
        client_id: &str,
        segment: &str,
    ) -> Option<(Arc<OwnerQueue>, String)> {
        let g = self.inner.lock();
        let seg = g.segments.get(segment)?;
        (seg.client_id == client_id).then(|| (Arc::clone(&seg.ledger), seg.desc.uuid.clone()))
    }

    /// The owner of `segment` (memory `uuid`) acknowledged forgets: return
    /// their `(offset, size)` ranges to the segment's allocator. `settle`
    /// (see [`crate::ledger_push::Release`]) is called with the state lock
    /// held, once the ranges are back and before waiting puts are woken.
    pub(crate) fn release_forgotten(
        &self,
        segment: &str,
        uuid: &str,
        ranges: Vec<(u64, u64)>,
        settle: &dyn Fn(),
    ) {
        let mut ranges = ranges;
        ranges.sort_unstable();
        let runs = merge_runs(&ranges);
        let mut g = self.inner.lock();
        if let Some(seg) = g.segments.get_mut(segment) {
            if seg.desc.uuid == uuid {
                for (off, size) in runs {
                    seg.alloc.free(off, size);
                }
            }
        }
        settle();
        self.note_space_freed();
        // Remembered forgets are pruned when their key is written again;
        // acks sweep the acknowledged ones only when the map doubled since
        // its last sweep (amortised constant work per forget).
        if g.forgets.sweep_due() {
            let shrunk = g.forgets.sweep();
            drop(g);
            if shrunk {
                crate::memory::return_free_memory();
            }
        }
    }
}

/// Sorted `(offset, size)` ranges with every run of ranges that follow one
/// another (each starting where the previous one's allocation ends) joined
/// into one, so a large removal frees a few long extents instead of one
/// allocator update per object.
fn merge_runs(sorted: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(off, size) in sorted {
        let len = alloc_len(size);
        match out.last_mut() {
            Some((o, l)) if o.checked_add(*l) == Some(off) => *l += len,
            _ => out.push((off, len)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::merge_runs;

    #[test]
    fn runs_join_only_ranges_that_follow_one_another() {
        // 100 bytes take 128 with the 64-byte alignment.
        let r = merge_runs(&[(0, 100), (128, 64), (192, 1), (512, 64), (1024, 64)]);
        assert_eq!(r, vec![(0, 256), (512, 64), (1024, 64)]);
        assert!(merge_runs(&[]).is_empty());
        assert_eq!(
            merge_runs(&[(u64::MAX - 63, 64)]),
            vec![(u64::MAX - 63, 64)]
        );
    }
}
