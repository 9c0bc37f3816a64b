//! The forgets not yet known to be acknowledged, which later writes wait
//! for.
//!
//! When a committed replica goes away (removal, overwrite, eviction, a
//! replaced version's last reader), its owner is sent a forget. A new write
//! of the same key is acknowledged only once those forgets are: otherwise
//! an owner that restarts could replay the old entry over the new one.
//! [`Forgets`] keeps them:
//! - per key, for forgets of one object's replicas;
//! - in bulk, for a removal of many objects (`remove_all`,
//!   `remove_by_regex`): only the last op per owner queue, since acks are
//!   cumulative per queue. While any bulk forget is unacknowledged, a write
//!   of *any* key waits for it (remembering each of a million removed keys
//!   cost more than the removal itself).
//!
//! Acknowledged entries are dropped when their key is written again, and by
//! a sweep whose cost is amortised over the forgets remembered since the
//! last one (see [`Forgets::sweep_due`]).

use crate::ledger_push::OwnerQueue;
use std::collections::HashMap;
use std::sync::Arc;

/// Ops to wait for: each owner queue and the sequence number to reach.
pub(crate) type Waits = Vec<(Arc<OwnerQueue>, u64)>;

/// Number of keys with remembered forgets above which acks sweep them.
const SWEEP_ABOVE: usize = 4096;

/// Forgets remembered until their owners acknowledge them (see the module
/// docs).
#[derive(Debug, Default)]
pub(crate) struct Forgets {
    /// Per key: forgets of its earlier replicas.
    by_key: HashMap<Box<str>, Waits>,
    /// Entries `by_key` kept at its last sweep.
    swept: usize,
    /// A bulk removal's forgets: the last op per owner queue.
    bulk: Waits,
}

impl Forgets {
    /// Remember `waits` under `key`: a later write of the key waits for them.
    pub(crate) fn remember(&mut self, key: &str, waits: &[(Arc<OwnerQueue>, u64)]) {
        if waits.is_empty() {
            return;
        }
        match self.by_key.get_mut(key) {
            Some(v) => v.extend(waits.iter().cloned()),
            None => {
                self.by_key.insert(key.into(), waits.to_vec());
            }
        }
    }

    /// Remember a bulk removal's forgets: every later write waits for them.
    pub(crate) fn remember_bulk(&mut self, waits: &[(Arc<OwnerQueue>, u64)]) {
        for (q, seq) in waits {
            self.note_bulk(Arc::clone(q), *seq);
        }
    }

    /// Remember one forget of a bulk removal, keeping the last op per owner
    /// queue.
    pub(crate) fn note_bulk(&mut self, q: Arc<OwnerQueue>, seq: u64) {
        match self.bulk.iter_mut().find(|(b, _)| Arc::ptr_eq(b, &q)) {
            Some((_, s)) => *s = (*s).max(seq),
            None => self.bulk.push((q, seq)),
        }
    }

    /// What a write of `key` waits for: the key's remembered forgets not
    /// yet acknowledged (taken: the write supersedes them), and every
    /// unacknowledged bulk forget (kept for the next write).
    pub(crate) fn take(&mut self, key: &str) -> Waits {
        let mut waits: Waits = match self.by_key.remove(key) {
            Some(v) => v.into_iter().filter(|(q, s)| q.acked() < *s).collect(),
            None => Vec::new(),
        };
        waits.extend(self.bulk_pending().iter().cloned());
        waits
    }

    /// The bulk forgets not yet acknowledged (the acknowledged ones are
    /// dropped).
    pub(crate) fn bulk_pending(&mut self) -> &[(Arc<OwnerQueue>, u64)] {
        self.prune_bulk();
        &self.bulk
    }

    /// Drop the bulk forgets their owners acknowledged.
    pub(crate) fn prune_bulk(&mut self) {
        if !self.bulk.is_empty() {
            self.bulk.retain(|(q, s)| q.acked() < *s);
        }
    }

    /// Whether enough keys were remembered since the last sweep that an
    /// ack should sweep now (the map doubled since then, and is large):
    /// the sweep's cost is then constant per forget remembered.
    pub(crate) fn sweep_due(&self) -> bool {
        self.by_key.len() > SWEEP_ABOVE.max(2 * self.swept)
    }

    /// Drop the acknowledged forgets; returns whether the map gave memory
    /// back.
    pub(crate) fn sweep(&mut self) -> bool {
        self.by_key.retain(|_, v| {
            v.retain(|(q, s)| q.acked() < *s);
            !v.is_empty()
        });
        self.swept = self.by_key.len();
        if self.by_key.capacity() > SWEEP_ABOVE && self.by_key.len() * 4 < self.by_key.capacity() {
            self.by_key.shrink_to_fit();
            true
        } else {
            false
        }
    }

    /// Keys with remembered forgets (for tests and metrics).
    #[cfg(test)]
    pub(crate) fn keys(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_common::ledger::LedgerOp;

    fn forget() -> LedgerOp {
        LedgerOp::Forget {
            offset: 0,
            version: 1,
        }
    }

    fn queue() -> Arc<OwnerQueue> {
        Arc::new(OwnerQueue::default())
    }

    #[test]
    fn a_bulk_removal_holds_back_writes_of_any_key_until_its_owners_ack() {
        let mut f = Forgets::default();
        let (a, b) = (queue(), queue());
        let waits: Waits = (0..3)
            .map(|_| (Arc::clone(&a), a.push(forget())))
            .chain([(Arc::clone(&b), b.push(forget()))])
            .collect();
        f.remember_bulk(&waits);
        // One entry per owner queue, at its last op.
        assert_eq!(f.bulk.len(), 2);
        assert_eq!(f.bulk[0].1, 3);
        assert_eq!(f.bulk[1].1, 1);
        // No key was remembered one by one...
        assert_eq!(f.keys(), 0);
        // ...yet a write of any key waits for both queues while unacked.
        let w = f.take("some-key");
        assert_eq!(w.len(), 2);
        assert!(Arc::ptr_eq(&w[0].0, &a) && w[0].1 == 3);
        assert!(Arc::ptr_eq(&w[1].0, &b) && w[1].1 == 1);
        // Taking them for one write leaves them for the next.
        assert_eq!(f.take("other-key").len(), 2);
        // Once a queue acknowledges, writes stop waiting for it.
        a.ack_all(&|_, _| {});
        let w = f.take("third-key");
        assert_eq!(w.len(), 1);
        assert!(Arc::ptr_eq(&w[0].0, &b));
        b.ack_all(&|_, _| {});
        assert!(f.take("fourth-key").is_empty());
        assert!(f.bulk_pending().is_empty());
    }

    #[test]
    fn a_key_waits_only_for_its_own_unacked_forgets_and_only_once() {
        let mut f = Forgets::default();
        let (a, b) = (queue(), queue());
        f.remember("k", &[(Arc::clone(&a), a.push(forget()))]);
        f.remember("k", &[(Arc::clone(&b), b.push(forget()))]);
        f.remember("other", &[(Arc::clone(&b), b.push(forget()))]);
        f.remember("empty", &[]);
        assert_eq!(f.keys(), 2, "an empty list is not remembered");
        a.ack_all(&|_, _| {});
        let w = f.take("k");
        assert_eq!(w.len(), 1, "the acknowledged forget is not waited for");
        assert!(Arc::ptr_eq(&w[0].0, &b) && w[0].1 == 1);
        assert!(
            f.take("k").is_empty(),
            "a write supersedes the key's forgets"
        );
        assert_eq!(f.take("other").len(), 1);
        assert!(f.take("never-removed").is_empty());
    }

    #[test]
    fn a_sweep_is_due_when_the_map_doubled_and_keeps_unacked_keys() {
        let mut f = Forgets::default();
        let (a, b) = (queue(), queue());
        for i in 0..SWEEP_ABOVE {
            f.remember(&format!("a{i}"), &[(Arc::clone(&a), a.push(forget()))]);
        }
        assert!(!f.sweep_due(), "not above the floor yet");
        f.remember("b", &[(Arc::clone(&b), b.push(forget()))]);
        assert!(f.sweep_due());
        a.ack_all(&|_, _| {});
        assert!(f.sweep(), "most entries went: memory is given back");
        assert_eq!(f.keys(), 1, "only the unacknowledged key stays");
        assert!(!f.sweep_due());
        // The next sweep waits for the map to double again.
        for i in 0..SWEEP_ABOVE {
            f.remember(&format!("c{i}"), &[(Arc::clone(&b), b.push(forget()))]);
        }
        assert!(f.sweep_due());
        assert!(!f.sweep(), "nothing acknowledged: nothing to give back");
        assert_eq!(f.keys(), SWEEP_ABOVE + 1);
        assert!(!f.sweep_due(), "the floor moved to the swept size");
    }
}
