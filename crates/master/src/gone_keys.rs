//! Keys whose objects this master removed (a client's removal, an eviction
//! that dropped the object, or a newer version found at a remount), the
//! most recent [`GONE_KEYS_KEPT`] of them. A disk copy of such a key that
//! an owner announces afterwards (see `offload`) is a leftover of the
//! removed object (its owner had not deleted it yet when it listed its
//! tier, or the master that removed it never knew of the copy, as when a
//! new leader learned the object from the owner's ledger alone and the
//! owner listed its tier only after the removal): it is never adopted, so a
//! removed key does not come back with an old value. Objects that went
//! away with their owner (its segment unmounted or expired) are not listed:
//! an owner restarted on its old directory brings its disk copies back.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

/// How many removed keys are remembered.
pub(crate) const GONE_KEYS_KEPT: usize = 1 << 16;

/// The most recently removed keys, oldest first (one shared allocation per
/// key: every removal and eviction notes one).
#[derive(Debug, Default)]
pub(crate) struct GoneKeys {
    order: VecDeque<Arc<str>>,
    set: HashSet<Arc<str>>,
}

impl GoneKeys {
    /// `key`'s object was removed.
    pub(crate) fn note(&mut self, key: &str) {
        if self.set.contains(key) {
            return;
        }
        if self.order.len() >= GONE_KEYS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        let k: Arc<str> = key.into();
        self.set.insert(Arc::clone(&k));
        self.order.push_back(k);
    }

    /// Whether `key`'s object was removed (among the remembered ones).
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.set.contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_recent_removed_keys_are_remembered() {
        let mut g = GoneKeys::default();
        for i in 0..GONE_KEYS_KEPT + 2 {
            g.note(&format!("k{i}"));
        }
        g.note("k5"); // already remembered: not added twice
        assert!(
            !g.contains("k0") && !g.contains("k1"),
            "the oldest are forgotten"
        );
        assert!(g.contains("k2") && g.contains(&format!("k{}", GONE_KEYS_KEPT + 1)));
        assert_eq!(g.order.len(), GONE_KEYS_KEPT);
        assert_eq!(g.set.len(), GONE_KEYS_KEPT);
    }
}
