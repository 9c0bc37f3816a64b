//! Per-segment offset allocator: best-fit over free extents, 64-byte aligned,
//! coalescing neighbours on free. An allocation may carry an owner tag
//! (a tenant's number): the allocator keeps the bytes allocated per tag, and
//! freeing a tagged allocation takes its bytes off its tag.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Allocation granularity and alignment in bytes.
pub const ALIGN: u64 = 64;

/// Best-fit allocator over `[0, capacity)`.
#[derive(Debug)]
pub struct OffsetAllocator {
    capacity: u64,
    used: u64,
    /// free extents by offset -> length
    by_offset: BTreeMap<u64, u64>,
    /// free extents ordered by (length, offset) for best fit
    by_size: BTreeSet<(u64, u64)>,
    /// Tagged allocations: offset -> tag (untagged ones are not listed).
    tags: HashMap<u64, u32>,
    /// Bytes allocated per tag (after alignment rounding).
    by_tag: HashMap<u32, u64>,
}

fn round_up(n: u64) -> Option<u64> {
    n.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

impl OffsetAllocator {
    /// A fresh allocator with all of `capacity` free (rounded down to the alignment).
    pub fn new(capacity: u64) -> Self {
        let cap = capacity / ALIGN * ALIGN;
        let mut a = OffsetAllocator {
            capacity: cap,
            used: 0,
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            tags: HashMap::new(),
            by_tag: HashMap::new(),
        };
        if cap > 0 {
            a.insert_free(0, cap);
        }
        a
    }

    fn insert_free(&mut self, off: u64, len: u64) {
        self.by_offset.insert(off, len);
        self.by_size.insert((len, off));
    }

    fn remove_free(&mut self, off: u64, len: u64) {
        self.by_offset.remove(&off);
        self.by_size.remove(&(len, off));
    }

    /// Total bytes managed.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes currently allocated (after alignment rounding).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Largest single allocation that would currently succeed.
    pub fn largest_free(&self) -> u64 {
        self.by_size
            .iter()
            .next_back()
            .map(|(l, _)| *l)
            .unwrap_or(0)
    }

    /// Mark the range an allocation of `size` bytes at `off` would occupy
    /// as allocated, if all of it is free and `off` is aligned. Used to
    /// rebuild a segment's allocator from the replicas its owner reports.
    pub fn reserve(&mut self, off: u64, size: u64) -> bool {
        if size == 0 || !off.is_multiple_of(ALIGN) {
            return false;
        }
        let Some(need) = round_up(size) else {
            return false;
        };
        let Some(end) = off.checked_add(need) else {
            return false;
        };
        let Some((&foff, &flen)) = self.by_offset.range(..=off).next_back() else {
            return false;
        };
        let fend = foff.saturating_add(flen);
        if end > fend {
            return false;
        }
        self.remove_free(foff, flen);
        if foff < off {
            self.insert_free(foff, off - foff);
        }
        if end < fend {
            self.insert_free(end, fend - end);
        }
        self.used = self.used.saturating_add(need);
        true
    }

    /// Allocate `size` bytes; returns the offset.
    pub fn alloc(&mut self, size: u64) -> Option<u64> {
        if size == 0 {
            return None;
        }
        let need = round_up(size)?;
        let &(len, off) = self.by_size.range((need, 0)..).next()?;
        self.remove_free(off, len);
        if len > need {
            self.insert_free(off + need, len - need);
        }
        self.used = self.used.saturating_add(need);
        Some(off)
    }

    /// Tag the allocation of `size` bytes at `off` with `tag` (0: none);
    /// freeing it takes its bytes off the tag's total.
    pub fn tag(&mut self, off: u64, size: u64, tag: u32) {
        let Some(need) = round_up(size) else {
            return;
        };
        if tag == 0 {
            return;
        }
        if let Some(old) = self.tags.insert(off, tag) {
            self.untag_bytes(old, need);
        }
        *self.by_tag.entry(tag).or_default() += need;
    }

    /// Bytes allocated under `tag`.
    pub fn tagged(&self, tag: u32) -> u64 {
        self.by_tag.get(&tag).copied().unwrap_or(0)
    }

    fn untag_bytes(&mut self, tag: u32, need: u64) {
        if let Some(b) = self.by_tag.get_mut(&tag) {
            *b = b.saturating_sub(need);
            if *b == 0 {
                self.by_tag.remove(&tag);
            }
        }
    }

    /// Free an allocation made with `alloc(size)` at `off` (a range outside
    /// the managed space, or one that is already free in part or whole, is
    /// ignored).
    pub fn free(&mut self, off: u64, size: u64) {
        let Some(need) = round_up(size) else {
            return;
        };
        if !self.tags.is_empty() {
            if let Some(t) = self.tags.remove(&off) {
                self.untag_bytes(t, need);
            }
        }
        let Some(end) = off.checked_add(need).filter(|e| *e <= self.capacity) else {
            return;
        };
        // A range that overlaps free space is free already (a second free,
        // or never allocated): freeing it again would let two objects share
        // bytes, so it is refused.
        let before = self
            .by_offset
            .range(..=off)
            .next_back()
            .map(|(&p, &l)| (p, l));
        let overlaps_before = before.is_some_and(|(p, l)| p.saturating_add(l) > off);
        if overlaps_before || self.by_offset.range(off..end).next().is_some() {
            tracing::error!(
                offset = off,
                size,
                "refused to free a range that is already free (in part or whole)"
            );
            return;
        }
        let mut len = need;
        let mut start = off;
        self.used = self.used.saturating_sub(need);
        if let Some((poff, plen)) = before {
            if poff.checked_add(plen) == Some(off) {
                self.remove_free(poff, plen);
                start = poff;
                len += plen;
            }
        }
        if let Some(&nlen) = self.by_offset.get(&end) {
            self.remove_free(end, nlen);
            len += nlen;
        }
        self.insert_free(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_freed_twice_is_not_handed_out_twice() {
        let mut a = OffsetAllocator::new(1 << 12);
        let x = a.alloc(1024).unwrap();
        let y = a.alloc(1024).unwrap();
        a.free(x, 1024);
        let used = a.used();
        // Freed again, or overlapping free space from either side: refused.
        a.free(x, 1024);
        a.free(x + 512, 1024);
        a.free(y - 64, 128);
        assert_eq!(a.used(), used);
        let z = a.alloc(1024).unwrap();
        assert_eq!(z, x, "the freed range comes back once");
        // Everything is allocated but the tail: no second copy of x's range.
        let w = a.alloc(2048).unwrap();
        assert!(w >= y + 1024, "{w} overlaps a live allocation");
        assert!(a.alloc(64).is_none(), "more handed out than there is");
    }

    #[test]
    fn alloc_free_coalesce() {
        let mut a = OffsetAllocator::new(1 << 20);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(1000).unwrap();
        let z = a.alloc(64).unwrap();
        assert_eq!(x % ALIGN, 0);
        assert_eq!(y % ALIGN, 0);
        assert_eq!(a.used(), 128 + 1024 + 64);
        a.free(y, 1000);
        a.free(x, 100);
        a.free(z, 64);
        assert_eq!(a.used(), 0);
        assert_eq!(a.alloc(1 << 20), Some(0));
        assert_eq!(a.alloc(1), None);
    }

    #[test]
    fn best_fit_and_full() {
        let mut a = OffsetAllocator::new(64 * 10);
        let offs: Vec<u64> = (0..10).map(|_| a.alloc(64).unwrap()).collect();
        assert_eq!(a.alloc(1), None);
        a.free(offs[2], 64);
        a.free(offs[5], 64);
        a.free(offs[6], 64);
        // best fit picks the single hole for 64 bytes
        assert_eq!(a.alloc(64), Some(offs[2]));
        assert_eq!(a.alloc(128), Some(offs[5]));
        for (i, o) in offs.iter().enumerate() {
            if ![2, 5, 6].contains(&i) {
                a.free(*o, 64);
            }
        }
        a.free(offs[2], 64);
        a.free(offs[5], 128);
        assert_eq!(a.largest_free(), 640);
    }

    #[test]
    fn reserve_carves_exact_ranges() {
        let mut a = OffsetAllocator::new(64 * 8);
        assert!(a.reserve(128, 100)); // [128, 256)
        assert!(!a.reserve(192, 64), "overlaps the first reservation");
        assert!(!a.reserve(100, 64), "unaligned");
        assert!(!a.reserve(448, 128), "past the end");
        assert!(!a.reserve(0, 0));
        assert!(a.reserve(0, 64));
        assert_eq!(a.used(), 64 + 128);
        // The rest stays allocatable and frees coalesce back to one extent.
        assert_eq!(a.alloc(64), Some(64));
        assert_eq!(a.largest_free(), 64 * 4);
        a.free(128, 100);
        a.free(0, 64);
        a.free(64, 64);
        assert_eq!(a.used(), 0);
        assert_eq!(a.alloc(64 * 8), Some(0));
    }

    #[test]
    fn zero_and_overflow() {
        let mut a = OffsetAllocator::new(1024);
        assert_eq!(a.alloc(0), None);
        assert_eq!(a.alloc(u64::MAX), None);
        assert_eq!(a.alloc(2048), None);
        // Frees outside the managed space change nothing.
        a.free(u64::MAX - 10, 64);
        a.free(1000, 64);
        assert_eq!(a.used(), 0);
        assert_eq!(a.alloc(1024), Some(0));
    }

    #[test]
    fn tagged_allocations_count_per_tag_until_freed() {
        let mut a = OffsetAllocator::new(4096);
        let x = a.alloc(100).expect("room");
        let y = a.alloc(64).expect("room");
        let z = a.alloc(64).expect("room");
        a.tag(x, 100, 1);
        a.tag(y, 64, 2);
        a.tag(z, 64, 0); // no tag
        assert_eq!((a.tagged(1), a.tagged(2), a.tagged(0)), (128, 64, 0));
        a.free(x, 100);
        assert_eq!(a.tagged(1), 0);
        // Retagging moves the bytes; an untagged free changes no tag.
        a.tag(y, 64, 3);
        assert_eq!((a.tagged(2), a.tagged(3)), (0, 64));
        a.free(z, 64);
        assert_eq!(a.tagged(3), 64);
        a.free(y, 64);
        assert_eq!((a.tagged(3), a.used()), (0, 0));
    }
}
