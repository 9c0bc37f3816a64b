//! How the master's mutations reach the segment owners' ledgers (see
//! `mooncake_common::ledger`): commits when a write ends, forgets when a
//! committed replica goes away, and the waits that make a write or removal
//! acknowledged only once the owners know. Space a forget frees returns to
//! the allocator when the owner acknowledges the forget
//! ([`MasterState::release_forgotten`]).

use crate::ledger_push::{AckWait, OwnerQueue, ACK_TIMEOUT};
use crate::state::{Inner, MasterState, Object, PendingPin, Replica};
use mooncake_common::ledger::{LedgerEntry, LedgerOp};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

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

/// Ops to wait for: each owner queue and the sequence number to reach.
pub(crate) type Waits = Vec<(Arc<OwnerQueue>, u64)>;
/// Waits of commits, each tagged with its replica's segment.
pub(crate) type TaggedWaits = Vec<(String, Arc<OwnerQueue>, u64)>;
/// Ledger commits handed back to the writer, with their segments.
pub(crate) type Handed = Vec<(String, LedgerOp)>;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Inner {
    /// Tell the owners of `o`'s replicas that they are gone; each replica's
    /// space is released once its owner acknowledges. The forgets are also
    /// remembered under `key`, so that a later write of the key is
    /// acknowledged only after them.
    pub(crate) fn forget_replicas(&mut self, key: &str, o: &Object) -> Waits {
        let mut waits = Vec::new();
        for r in &o.replicas {
            if let Some(seg) = self.segments.get(&r.segment) {
                if seg.desc.uuid == r.segment_uuid {
                    let q = Arc::clone(&seg.ledger);
                    let op = LedgerOp::Forget {
                        offset: r.offset,
                        version: o.version,
                    };
                    let seq = q.push_forget_then_free(op, r.offset, o.size);
                    waits.push((q, seq));
                }
            }
        }
        if !waits.is_empty() {
            self.key_forgets
                .entry(key.to_string())
                .or_default()
                .extend(waits.iter().cloned());
        }
        waits
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
            if let Some(seg) = self.segments.get(&r.segment) {
                if seg.desc.uuid == r.segment_uuid {
                    let op = LedgerOp::Commit(LedgerEntry {
                        key: key.to_string(),
                        version,
                        offset: r.offset,
                        size,
                        hard_pin,
                        soft_pin_until_ms,
                    });
                    if local.contains(&r.segment) {
                        handed.push((r.segment.clone(), op));
                    } else {
                        let q = Arc::clone(&seg.ledger);
                        let seq = q.push(op);
                        waits.push((r.segment.clone(), q, seq));
                    }
                }
            }
        }
        (waits, handed)
    }

    /// Tell the owners of `replicas` (outside `local`) to forget their
    /// entries at `version`, without releasing space (whoever dropped the
    /// write releases it).
    pub(crate) fn forget_entries(&self, version: u64, replicas: &[Replica], local: &[String]) {
        for r in replicas {
            if local.contains(&r.segment) {
                continue;
            }
            if let Some(seg) = self.segments.get(&r.segment) {
                if seg.desc.uuid == r.segment_uuid {
                    seg.ledger.push(LedgerOp::Forget {
                        offset: r.offset,
                        version,
                    });
                }
            }
        }
    }

    /// Forget committed `replicas` at `version` whose write lost
    /// (superseded, or its object went away while it committed): pushed
    /// after the queued commit, each replica's space returning on the ack.
    pub(crate) fn forget_committed(&mut self, version: u64, size: u64, replicas: &[Replica]) {
        for r in replicas {
            if let Some(seg) = self.segments.get(&r.segment) {
                if seg.desc.uuid == r.segment_uuid {
                    let op = LedgerOp::Forget {
                        offset: r.offset,
                        version,
                    };
                    seg.ledger.push_forget_then_free(op, r.offset, size);
                }
            }
        }
    }

    /// Drop the replicas of `key` that live in `segments` (their owners did
    /// not confirm the commit): each owner is told to forget it (after the
    /// commit still queued for it) and the space returns on that ack.
    pub(crate) fn drop_unconfirmed(&mut self, key: &str, segments: &[String]) {
        let Some(mut o) = self.objects.remove(key) else {
            return;
        };
        let (gone, keep): (Vec<_>, Vec<_>) = o
            .replicas
            .drain(..)
            .partition(|r| segments.contains(&r.segment));
        o.replicas = keep;
        for r in gone {
            if let Some(seg) = self.segments.get(&r.segment) {
                if seg.desc.uuid == r.segment_uuid {
                    let op = LedgerOp::Forget {
                        offset: r.offset,
                        version: o.version,
                    };
                    seg.ledger.push_forget_then_free(op, r.offset, o.size);
                }
            }
        }
        if !o.replicas.is_empty() {
            self.objects.insert(key.to_string(), o);
        }
    }

    /// Forgets of `key`'s earlier replicas that may not be acknowledged yet.
    pub(crate) fn take_key_forgets(&mut self, key: &str) -> Waits {
        match self.key_forgets.remove(key) {
            Some(v) => v.into_iter().filter(|(q, s)| q.acked() < *s).collect(),
            None => Vec::new(),
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
        let deadline = Instant::now() + ACK_TIMEOUT;
        let mut unconfirmed = 0u64;
        for (q, seq) in waits {
            if q.wait(*seq, deadline) == AckWait::Unconfirmed {
                unconfirmed += 1;
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
    /// their `(offset, size)` ranges to the segment's allocator.
    pub(crate) fn release_forgotten(&self, segment: &str, uuid: &str, ranges: Vec<(u64, u64)>) {
        let mut g = self.inner.lock();
        if let Some(seg) = g.segments.get_mut(segment) {
            if seg.desc.uuid == uuid {
                for (off, size) in ranges {
                    seg.alloc.free(off, size);
                }
            }
        }
        // Remembered forgets are pruned when their key is written again;
        // sweep the acknowledged ones only when many keys accumulated.
        if g.key_forgets.len() > KEY_FORGETS_SWEEP {
            g.key_forgets.retain(|_, v| {
                v.retain(|(q, s)| q.acked() < *s);
                !v.is_empty()
            });
        }
    }
}

/// Number of keys with remembered forgets above which acks sweep them.
const KEY_FORGETS_SWEEP: usize = 4096;
