//! The space of discarded writes waiting to be freed.
//!
//! A write discarded while its writer may still be copying (a stale first
//! write, an upsert dropped with its object) keeps its space allocated
//! until the discard delay has passed: the space is a [`DeferredFree`]
//! until then.

use crate::segments::SegId;
use std::time::Instant;

/// Space of a discarded write, to be freed at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeferredFree {
    pub at: Instant,
    pub seg: SegId,
    pub offset: u64,
    pub size: u64,
}

/// Deferred frees, in no order.
#[derive(Debug, Default)]
pub(crate) struct DeferredFrees {
    list: Vec<DeferredFree>,
}

impl DeferredFrees {
    /// Free `size` bytes at `offset` of `seg` at `at`.
    pub(crate) fn defer(&mut self, seg: SegId, offset: u64, size: u64, at: Instant) {
        self.list.push(DeferredFree {
            at,
            seg,
            offset,
            size,
        });
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
        f.defer(a, 0, 64, t0 + s);
        f.defer(b, 64, 64, t0 + s);
        f.defer(a, 128, 64, t0 + 2 * s);
        f.defer(b, 256, 64, t0 + 2 * s);
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
}
