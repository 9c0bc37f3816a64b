//! The space of discarded writes waiting to be freed.
//!
//! A write discarded while its writer may still be copying (a stale first
//! write, an upsert dropped with its object) keeps its space allocated
//! until the discard delay has passed, or until its writer ends or revokes
//! the write (then it copies no more): the space is a [`DeferredFree`]
//! until then.

use crate::segments::SegId;
use std::time::Instant;

/// Space of a discarded write (of version `version`), to be freed at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeferredFree {
    pub at: Instant,
    pub seg: SegId,
    pub offset: u64,
    pub size: u64,
    pub version: u64,
}

/// Deferred frees, in no order.
#[derive(Debug, Default)]
pub(crate) struct DeferredFrees {
    list: Vec<DeferredFree>,
}

impl DeferredFrees {
    /// Free `size` bytes at `offset` of `seg`, written by the write of
    /// `version`, at `at`.
    pub(crate) fn defer(&mut self, seg: SegId, offset: u64, size: u64, version: u64, at: Instant) {
        self.list.push(DeferredFree {
            at,
            seg,
            offset,
            size,
            version,
        });
    }

    /// The frees of the write of `version`, taken out (due or not).
    pub(crate) fn take_version(&mut self, version: u64) -> Vec<DeferredFree> {
        let (mine, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.list)
            .into_iter()
            .partition(|d| d.version == version);
        self.list = keep;
        mine
    }

    /// The frees due at `now`, taken out.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<DeferredFree> {
        let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.list)
            .into_iter()
            .partition(|d| d.at <= now);
        self.list = keep;
        due
    }

    /// Segment `seg` is gone (its allocator with it): drop its frees.
    pub(crate) fn drop_segment(&mut self, seg: SegId) {
        self.list.retain(|d| d.seg != seg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segments::{SegmentEntry, Segments};
    use std::time::Duration;

    #[test]
    fn deferred_frees_come_due_in_time_and_go_with_their_segment() {
        let mut segs = Segments::default();
        let d = |n| crate::recovery::tests::desc(n, n);
        let a = segs.insert(SegmentEntry::new(&d("a"), "c"));
        let b = segs.insert(SegmentEntry::new(&d("b"), "c"));
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut f = DeferredFrees::default();
        f.defer(a, 0, 64, 1, t0 + s);
        f.defer(b, 64, 64, 2, t0 + s);
        f.defer(a, 128, 64, 3, t0 + 2 * s);
        f.defer(b, 256, 64, 4, t0 + 2 * s);
        assert!(f.take_due(t0).is_empty());
        let due = f.take_due(t0 + s);
        assert_eq!(due.len(), 2);
        assert!(due.iter().all(|x| x.at == t0 + s));
        assert!(f.take_due(t0 + s).is_empty(), "taken once");
        f.drop_segment(b);
        let due = f.take_due(t0 + 5 * s);
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].seg, due[0].offset), (a, 128));
    }

    #[test]
    fn the_frees_of_one_write_are_taken_by_its_version_before_they_are_due() {
        let mut segs = Segments::default();
        let d = |n| crate::recovery::tests::desc(n, n);
        let a = segs.insert(SegmentEntry::new(&d("a"), "c"));
        let b = segs.insert(SegmentEntry::new(&d("b"), "c"));
        let at = Instant::now() + Duration::from_secs(600);
        let mut f = DeferredFrees::default();
        // Two replicas of version 7, one of version 8.
        f.defer(a, 0, 64, 7, at);
        f.defer(b, 0, 64, 7, at);
        f.defer(a, 64, 64, 8, at);
        let mine = f.take_version(7);
        assert_eq!(mine.len(), 2);
        assert!(mine.iter().all(|x| x.version == 7));
        assert!(f.take_version(7).is_empty(), "taken once");
        assert_eq!(f.take_due(at).len(), 1, "version 8 stays deferred");
    }
}
