//! Versions replaced (by an upsert) or removed while reads of them were in
//! flight, per key (see `versions` for the protocol).
//!
//! A retired version keeps its replicas allocated, their bytes unchanged,
//! until every read that may still copy from it ended: its client reported
//! the read ticket, or the lease its lookup granted ran out. This table
//! only decides *when* a version is free; returning its space (which needs
//! the segments) is the caller's step with the versions it hands back.

use crate::object_table::Replica;
use crate::segments::SegId;
use std::collections::HashMap;
use std::time::Instant;

/// A version replaced by an upsert (or removed) while reads of it were in
/// flight: its replicas stay allocated, and their bytes unchanged, until
/// every such read has finished or its lease ran out. The owners' ledgers
/// already forgot it, so no master ever serves it again.
#[derive(Debug)]
pub(crate) struct Retired {
    pub size: u64,
    /// Each replica with the sequence number of its ledger forget at the
    /// owner's queue (0: handed to the writer); the space is released only
    /// once that forget is acknowledged.
    pub replicas: Vec<(Replica, u64)>,
    /// The reads that may still copy from the replicas: `(read ticket,
    /// expiry)`, as `Object::readers`.
    pub readers: Vec<(u64, Instant)>,
}

/// Retired versions by key, oldest first.
#[derive(Debug, Default)]
pub(crate) struct RetiredVersions {
    by_key: HashMap<String, Vec<Retired>>,
}

impl RetiredVersions {
    /// Keep `r` for `key` at `now` until its reads end; a version with no
    /// read left (those expired by `now` do not count) is handed back at
    /// once, to be freed.
    pub(crate) fn hold(&mut self, key: &str, mut r: Retired, now: Instant) -> Option<Retired> {
        r.readers.retain(|(_, exp)| *exp > now);
        if r.readers.is_empty() {
            return Some(r);
        }
        self.by_key.entry(key.to_string()).or_default().push(r);
        None
    }

    /// Drop the reads of `key`'s versions that ended (`ticket` reported, or
    /// the lease expired at `now`); the versions no read is left on are
    /// handed back, to be freed.
    pub(crate) fn release(&mut self, key: &str, now: Instant, ticket: Option<u64>) -> Vec<Retired> {
        let Some(list) = self.by_key.get_mut(key) else {
            return Vec::new();
        };
        for r in list.iter_mut() {
            r.readers
                .retain(|(t, exp)| Some(*t) != ticket && *exp > now);
        }
        if list.iter().all(|r| !r.readers.is_empty()) {
            return Vec::new();
        }
        let (free, keep): (Vec<_>, Vec<_>) = std::mem::take(list)
            .into_iter()
            .partition(|r| r.readers.is_empty());
        if keep.is_empty() {
            self.by_key.remove(key);
        } else {
            *list = keep;
        }
        free
    }

    /// [`RetiredVersions::release`] of every key at `now` (periodic sweep).
    pub(crate) fn release_all(&mut self, now: Instant) -> Vec<Retired> {
        let keys: Vec<String> = self.by_key.keys().cloned().collect();
        keys.iter()
            .flat_map(|k| self.release(k, now, None))
            .collect()
    }

    /// Whether `key` holds retired versions.
    pub(crate) fn holds(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    /// Retired versions of `key` still held.
    pub(crate) fn count(&self, key: &str) -> usize {
        self.by_key.get(key).map_or(0, Vec::len)
    }

    /// The earliest instant one of `key`'s versions is sure to be freeable:
    /// the soonest among the versions of their last lease expiry.
    pub(crate) fn free_by(&self, key: &str) -> Option<Instant> {
        self.by_key
            .get(key)?
            .iter()
            .filter_map(|r| r.readers.iter().map(|(_, e)| *e).max())
            .min()
    }

    /// Segment `seg` is gone: forget the replicas versions had there (its
    /// allocator went with it), and the versions left with none.
    pub(crate) fn drop_segment(&mut self, seg: SegId) {
        self.by_key.retain(|_, list| {
            for r in list.iter_mut() {
                r.replicas.retain(|(rep, _)| rep.seg != seg);
            }
            list.retain(|r| !r.replicas.is_empty());
            !list.is_empty()
        });
    }

    /// Versions held, and the bytes their replicas keep allocated.
    pub(crate) fn totals(&self) -> (u64, u64) {
        self.by_key.values().flatten().fold((0, 0), |(n, b), r| {
            (n + 1, b + r.size.saturating_mul(r.replicas.len() as u64))
        })
    }

    /// Whether no version is held.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Give unused capacity back after many removals.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.by_key.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segments::{SegmentEntry, Segments};
    use std::time::Duration;

    fn segs() -> (SegId, SegId) {
        let mut s = Segments::default();
        let a = s.insert(SegmentEntry::new(
            &crate::recovery::tests::desc("a", "ua"),
            "c",
        ));
        let b = s.insert(SegmentEntry::new(
            &crate::recovery::tests::desc("b", "ub"),
            "c",
        ));
        (a, b)
    }

    fn version(size: u64, on: &[SegId], readers: &[(u64, Instant)]) -> Retired {
        Retired {
            size,
            replicas: on
                .iter()
                .map(|&seg| (Replica { seg, offset: 0 }, 1))
                .collect(),
            readers: readers.to_vec(),
        }
    }

    #[test]
    fn a_version_is_held_until_its_reads_end_or_expire() {
        let (a, _) = segs();
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut v = RetiredVersions::default();
        // No read in flight (or only expired ones): free at once.
        assert!(v.hold("k", version(10, &[a], &[]), t0).is_some());
        assert!(v.hold("k", version(10, &[a], &[(1, t0)]), t0).is_some());
        assert!(v.is_empty());
        // Two versions: one read by tickets 1 and 2, one by ticket 3.
        assert!(v
            .hold(
                "k",
                version(10, &[a], &[(1, t0 + 5 * s), (2, t0 + 9 * s)]),
                t0
            )
            .is_none());
        assert!(v
            .hold("k", version(20, &[a], &[(3, t0 + 3 * s)]), t0)
            .is_none());
        assert_eq!(v.count("k"), 2);
        assert!(v.holds("k") && !v.holds("other"));
        assert_eq!(v.totals(), (2, 30));
        // The soonest sure free: the second version's last expiry.
        assert_eq!(v.free_by("k"), Some(t0 + 3 * s));
        assert_eq!(v.free_by("other"), None);
        // Ticket 1 reported: the first version still has ticket 2.
        assert!(v.release("k", t0, Some(1)).is_empty());
        // Ticket 3's lease ran out: the second version is handed back.
        let freed = v.release("k", t0 + 3 * s, None);
        assert_eq!(freed.len(), 1);
        assert_eq!(freed[0].size, 20);
        assert_eq!(v.count("k"), 1);
        assert_eq!(v.free_by("k"), Some(t0 + 9 * s));
        // Ticket 2 reported: nothing is left for the key.
        assert_eq!(v.release("k", t0 + 4 * s, Some(2)).len(), 1);
        assert!(v.is_empty() && v.count("k") == 0);
        assert!(v.release("k", t0, None).is_empty());
    }

    #[test]
    fn a_sweep_frees_every_key_whose_leases_ran_out() {
        let (a, _) = segs();
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut v = RetiredVersions::default();
        for (i, k) in ["x", "y", "z"].iter().enumerate() {
            let exp = t0 + (i as u32 + 1) * s;
            assert!(v
                .hold(k, version(1, &[a], &[(i as u64, exp)]), t0)
                .is_none());
        }
        assert_eq!(v.release_all(t0 + 2 * s).len(), 2, "x and y expired");
        assert!(v.holds("z") && !v.holds("x") && !v.holds("y"));
        assert_eq!(v.release_all(t0 + 3 * s).len(), 1);
        assert!(v.is_empty());
    }

    #[test]
    fn a_gone_segment_takes_its_replicas_and_the_versions_left_with_none() {
        let (a, b) = segs();
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(10);
        let mut v = RetiredVersions::default();
        assert!(v
            .hold("k", version(8, &[a, b], &[(1, later)]), t0)
            .is_none());
        assert!(v.hold("k", version(8, &[a], &[(2, later)]), t0).is_none());
        assert_eq!(v.totals(), (2, 24));
        v.drop_segment(a);
        assert_eq!(v.count("k"), 1, "the version only on a went with it");
        assert_eq!(v.totals(), (1, 8));
        v.drop_segment(b);
        assert!(v.is_empty());
    }
}
