//! The owner side of the replica ledger (see `mooncake_common::ledger`): the
//! committed replicas in this client's segment, as the master pushed them.
//! It is what the client reports when it remounts on a master that lost its
//! metadata, so objects survive the master.
//!
//! Entries are keyed by offset; entries never overlap: a commit first drops
//! whatever it overlaps (a stale entry whose forget was lost cannot survive
//! next to the bytes that replaced it).

use mooncake_common::ledger::{alloc_len, LedgerEntry, LedgerOp};
use parking_lot::Mutex;
use std::collections::BTreeMap;

/// The ledger of one segment.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    entries: Mutex<BTreeMap<u64, LedgerEntry>>,
}

impl Ledger {
    /// Apply pushed ops in order.
    pub(crate) fn apply(&self, ops: Vec<LedgerOp>) {
        let mut g = self.entries.lock();
        for op in ops {
            match op {
                LedgerOp::Commit(e) => {
                    let end = e.offset.saturating_add(alloc_len(e.size).max(1));
                    // Drop every entry overlapping [offset, end).
                    let overlapping: Vec<u64> = g
                        .range(..end)
                        .rev()
                        .take_while(|(&off, old)| {
                            off.saturating_add(alloc_len(old.size).max(1)) > e.offset
                        })
                        .map(|(&off, _)| off)
                        .collect();
                    for off in overlapping {
                        g.remove(&off);
                    }
                    g.insert(e.offset, e);
                }
                LedgerOp::Forget { offset, version } => {
                    if g.get(&offset).is_some_and(|e| e.version == version) {
                        g.remove(&offset);
                    }
                }
            }
        }
    }

    /// Every entry, by offset.
    pub(crate) fn snapshot(&self) -> Vec<LedgerEntry> {
        self.entries.lock().values().cloned().collect()
    }

    /// Drop the listed `(offset, version)` entries (the master found them stale).
    pub(crate) fn drop_listed(&self, stale: &[(u64, u64)]) {
        self.apply(
            stale
                .iter()
                .map(|&(offset, version)| LedgerOp::Forget { offset, version })
                .collect(),
        );
    }

    /// Forget everything (the master discarded this segment's objects).
    pub(crate) fn clear(&self) {
        self.entries.lock().clear();
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(key: &str, version: u64, offset: u64, size: u64) -> LedgerEntry {
        LedgerEntry {
            key: key.into(),
            version,
            offset,
            size,
            hard_pin: false,
            soft_pin_until_ms: None,
        }
    }

    #[test]
    fn commit_forget_and_version_match() {
        let l = Ledger::default();
        l.apply(vec![
            LedgerOp::Commit(e("a", 1, 0, 100)),
            LedgerOp::Commit(e("b", 2, 128, 10)),
        ]);
        assert_eq!(l.len(), 2);
        // A forget of another version of the entry is ignored.
        l.apply(vec![LedgerOp::Forget {
            offset: 0,
            version: 9,
        }]);
        assert_eq!(l.len(), 2);
        l.apply(vec![LedgerOp::Forget {
            offset: 0,
            version: 1,
        }]);
        assert_eq!(l.snapshot(), vec![e("b", 2, 128, 10)]);
        l.drop_listed(&[(128, 2)]);
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn a_commit_replaces_what_it_overlaps() {
        let l = Ledger::default();
        l.apply(vec![
            LedgerOp::Commit(e("a", 1, 0, 64)),   // [0, 64)
            LedgerOp::Commit(e("b", 2, 64, 100)), // [64, 192)
            LedgerOp::Commit(e("c", 3, 192, 1)),  // [192, 256)
        ]);
        // [100, 200) overlaps b and c, not a.
        l.apply(vec![LedgerOp::Commit(e("d", 4, 100, 100))]);
        let keys: Vec<String> = l.snapshot().into_iter().map(|x| x.key).collect();
        assert_eq!(keys, vec!["a", "d"]);
        // Same offset, new version: replaced.
        l.apply(vec![LedgerOp::Commit(e("a", 5, 0, 64))]);
        assert_eq!(l.snapshot()[0].version, 5);
        l.clear();
        assert_eq!(l.len(), 0);
    }
}
