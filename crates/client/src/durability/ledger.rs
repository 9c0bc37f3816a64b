//! The owner side of the replica ledger (see `mooncake_common::ledger`): the
//! committed replicas in this client's segment, as the master pushed them.
//! It is what the client reports when it remounts on a master that lost its
//! metadata, so objects survive the master.
//!
//! Entries are keyed by offset; entries never overlap: a commit first drops
//! whatever it overlaps (a stale entry whose forget was lost cannot survive
//! next to the bytes that replaced it).
//!
//! A writer whose replica lands in a segment of its own process records the
//! commit itself (the master hands it the entry), through the process-wide
//! registry of ledgers by segment name. Such a commit can arrive after the
//! forget of the same replica (a removal that raced it): the ledger remembers
//! recent forgets and ignores a commit they already cancelled.

use mooncake_common::ledger::{alloc_len, LedgerEntry, LedgerOp};
use mooncake_common::proto::ReplicaLoc;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, OnceLock, Weak};

/// Recent forgets remembered per ledger.
const RECENT_FORGETS: usize = 4096;

#[derive(Debug, Default)]
struct Inner {
    entries: BTreeMap<u64, LedgerEntry>,
    recent: VecDeque<(u64, u64)>,
    recent_set: HashSet<(u64, u64)>,
}

/// The ledger of one segment.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    entries: Mutex<Inner>,
}

fn registry() -> &'static Mutex<HashMap<String, Weak<Ledger>>> {
    static R: OnceLock<Mutex<HashMap<String, Weak<Ledger>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Make `ledger` the ledger of segment `name` in this process.
pub(crate) fn register(name: &str, ledger: &Arc<Ledger>) {
    registry()
        .lock()
        .insert(name.to_string(), Arc::downgrade(ledger));
}

/// Forget segment `name` (its client closed).
pub(crate) fn unregister(name: &str) {
    registry().lock().remove(name);
}

/// The ledger of segment `name` if this process owns the segment.
pub(crate) fn local(name: &str) -> Option<Arc<Ledger>> {
    registry().lock().get(name).and_then(Weak::upgrade)
}

/// Drop every entry overlapping the allocation at `offset` of `size` bytes.
fn drop_overlapping(g: &mut BTreeMap<u64, LedgerEntry>, offset: u64, size: u64) {
    let end = offset.saturating_add(alloc_len(size).max(1));
    let overlapping: Vec<u64> = g
        .range(..end)
        .rev()
        .take_while(|(&off, old)| off.saturating_add(alloc_len(old.size).max(1)) > offset)
        .map(|(&off, _)| off)
        .collect();
    for off in overlapping {
        g.remove(&off);
    }
}

/// Before an upsert copies into `replicas`: the entries of this process's
/// own segments that described those ranges are dropped (see
/// [`Ledger::vacate`]).
pub(crate) fn vacate_own(replicas: &[ReplicaLoc]) {
    for r in replicas {
        if let Some(l) = local(&r.segment_name) {
            l.vacate(r.offset, r.size);
        }
    }
}

/// Names of the segments this process owns.
pub(crate) fn local_names() -> Vec<String> {
    registry()
        .lock()
        .iter()
        .filter(|(_, l)| l.strong_count() > 0)
        .map(|(n, _)| n.clone())
        .collect()
}

impl Ledger {
    /// Apply pushed ops in order.
    pub(crate) fn apply(&self, ops: Vec<LedgerOp>) {
        let mut guard = self.entries.lock();
        let inner = &mut *guard;
        let g = &mut inner.entries;
        for op in ops {
            match op {
                LedgerOp::Commit(e) => {
                    if inner.recent_set.contains(&(e.offset, e.version)) {
                        continue; // cancelled by a forget that came first
                    }
                    drop_overlapping(g, e.offset, e.size);
                    g.insert(e.offset, e);
                }
                // The disk tier was already given the bytes (ledger stream);
                // a written-through replica stays in memory; a promoted
                // replica is not recorded (its disk copy stays).
                LedgerOp::DiskForget { .. }
                | LedgerOp::Persist { .. }
                | LedgerOp::Promote { .. }
                | LedgerOp::Fetch { .. } => {}
                LedgerOp::Forget { offset, version }
                | LedgerOp::Offload {
                    offset, version, ..
                } => {
                    if g.get(&offset).is_some_and(|e| e.version == version) {
                        g.remove(&offset);
                    }
                    if inner.recent_set.insert((offset, version)) {
                        inner.recent.push_back((offset, version));
                        if inner.recent.len() > RECENT_FORGETS {
                            if let Some(old) = inner.recent.pop_front() {
                                inner.recent_set.remove(&old);
                            }
                        }
                    }
                }
            }
        }
    }

    /// `[offset, offset + size)` was handed to a write of this process:
    /// whatever entry described those bytes no longer does (an upsert
    /// rewriting its key's replica in place records this before it copies,
    /// so no master rebuilt from this ledger serves half-written bytes).
    pub(crate) fn vacate(&self, offset: u64, size: u64) {
        drop_overlapping(&mut self.entries.lock().entries, offset, size);
    }

    /// Every entry, by offset.
    pub(crate) fn snapshot(&self) -> Vec<LedgerEntry> {
        self.entries.lock().entries.values().cloned().collect()
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
        self.entries.lock().entries.clear();
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(key: &str, version: u64, offset: u64, size: u64) -> LedgerEntry {
        LedgerEntry::unpinned(key, version, offset, size)
    }

    /// A ledger with `entries` committed, in order, by one apply.
    fn committed(entries: Vec<LedgerEntry>) -> Ledger {
        let l = Ledger::default();
        l.apply(entries.into_iter().map(LedgerOp::Commit).collect());
        l
    }

    #[test]
    fn commit_forget_and_version_match() {
        let l = committed(vec![e("a", 1, 0, 100), e("b", 2, 128, 10)]);
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
        let l = committed(vec![
            e("a", 1, 0, 64),   // [0, 64)
            e("b", 2, 64, 100), // [64, 192)
            e("c", 3, 192, 1),  // [192, 256)
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

    #[test]
    fn a_vacated_range_loses_the_entries_it_overlaps() {
        let l = committed(vec![
            e("a", 1, 0, 64),   // [0, 64)
            e("b", 2, 64, 100), // [64, 192)
        ]);
        // An in-place rewrite of "b" is about to copy into [64, 192).
        l.vacate(64, 100);
        assert_eq!(l.snapshot(), vec![e("a", 1, 0, 64)]);
        // Its commit records the new version there.
        l.apply(vec![LedgerOp::Commit(e("b", 3, 64, 100))]);
        assert_eq!(l.snapshot()[1], e("b", 3, 64, 100));
    }

    #[test]
    fn a_commit_after_its_forget_is_ignored() {
        let l = Ledger::default();
        l.apply(vec![LedgerOp::Forget {
            offset: 64,
            version: 7,
        }]);
        l.apply(vec![LedgerOp::Commit(e("late", 7, 64, 10))]);
        assert_eq!(l.len(), 0);
        // Another version at that offset is a different write.
        l.apply(vec![LedgerOp::Commit(e("new", 8, 64, 10))]);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn registry_by_segment_name() {
        let l = Arc::new(Ledger::default());
        register("reg-test:1", &l);
        assert!(local("reg-test:1").is_some());
        unregister("reg-test:1");
        assert!(local("reg-test:1").is_none());
        register("reg-test:2", &l);
        drop(l);
        assert!(
            local("reg-test:2").is_none(),
            "a dropped ledger is not found"
        );
    }
}
