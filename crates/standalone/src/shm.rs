//! Host memory another process on this host can map: the process-wide table
//! of shared regions (`memfd`s mapped here) behind
//! `MooncakeHostMemAllocator`, a dummy client's local buffer and memory
//! pool, and its temporary staging regions.
//!
//! A dummy client finds a caller's pointer in this table to hand its
//! daemon the bytes in place ([`find`]); a pointer outside every region is
//! copied through a staging region instead. Freeing a region tells every
//! live dummy client ([`on_free`]), which asks its daemon to drop its
//! mapping, so the memory goes back to the system.

use mooncake_transfer::{Prefault, Segment};
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// One shared region of this process.
pub(crate) struct Region {
    /// Process-wide id (the dummy/daemon protocol names regions by it).
    pub(crate) id: u64,
    /// The memfd and its mapping here.
    pub(crate) seg: Arc<Segment>,
}

impl Region {
    /// Base address in this process.
    pub(crate) fn base(&self) -> usize {
        self.seg.base() as usize
    }

    /// Size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.seg.size()
    }
}

/// Live regions by base address.
fn table() -> &'static RwLock<BTreeMap<usize, Arc<Region>>> {
    static T: OnceLock<RwLock<BTreeMap<usize, Arc<Region>>>> = OnceLock::new();
    T.get_or_init(|| RwLock::new(BTreeMap::new()))
}

type Listener = Box<dyn Fn(u64) -> bool + Send + Sync>;

fn listeners() -> &'static Mutex<Vec<Listener>> {
    static L: OnceLock<Mutex<Vec<Listener>>> = OnceLock::new();
    L.get_or_init(|| Mutex::new(Vec::new()))
}

/// Call `f(region_id)` whenever a region is freed, until `f` returns false.
pub(crate) fn on_free(f: impl Fn(u64) -> bool + Send + Sync + 'static) {
    listeners().lock().push(Box::new(f));
}

/// A new zero-filled region of `size` bytes (not entered in the table).
pub(crate) fn create(size: u64) -> std::io::Result<Arc<Region>> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let seg = Segment::create_with(size, Prefault::Lazy)?;
    Ok(Arc::new(Region {
        id: NEXT.fetch_add(1, Ordering::Relaxed),
        seg,
    }))
}

/// Enter `r` in the table (its memory can then be found by address).
pub(crate) fn insert(r: &Arc<Region>) {
    table().write().insert(r.base(), Arc::clone(r));
}

/// Take the region based at `base` out of the table and tell the listeners;
/// `false` when no region starts there.
pub(crate) fn remove(base: usize) -> bool {
    let Some(r) = table().write().remove(&base) else {
        return false;
    };
    listeners().lock().retain(|f| f(r.id));
    true
}

/// The region holding all of `ptr..ptr+len` and the offset of `ptr` in it.
pub(crate) fn find(ptr: usize, len: u64) -> Option<(Arc<Region>, u64)> {
    let t = table().read();
    let (_, r) = t.range(..=ptr).next_back()?;
    let off = (ptr - r.base()) as u64;
    let end = off.checked_add(len)?;
    (end <= r.size()).then(|| (Arc::clone(r), off))
}

/// `MooncakeHostMemAllocator.alloc(size)`: shared host memory of `size`
/// bytes, zero-filled, or 0 when `size` is 0 or the system refuses.
pub fn host_alloc(size: u64) -> usize {
    if size == 0 {
        return 0;
    }
    match create(size) {
        Ok(r) => {
            insert(&r);
            r.base()
        }
        Err(e) => {
            tracing::warn!(size, error = %e, "cannot allocate shared host memory");
            0
        }
    }
}

/// `MooncakeHostMemAllocator.free(ptr)`: 0, or -1 when `ptr` is not the
/// start of memory [`host_alloc`] returned.
pub fn host_free(ptr: usize) -> i32 {
    if remove(ptr) {
        0
    } else {
        -1
    }
}

/// A first-fit allocator over one region (a dummy's local buffer or pool):
/// free ranges by offset, merged on release.
pub(crate) struct Carver {
    region: Arc<Region>,
    free: Mutex<BTreeMap<u64, u64>>,
}

/// Allocations are rounded to this many bytes.
const ALIGN: u64 = 64;

impl Carver {
    /// Everything of `region` free.
    pub(crate) fn new(region: Arc<Region>) -> Carver {
        let mut free = BTreeMap::new();
        if region.size() > 0 {
            free.insert(0, region.size());
        }
        Carver {
            region,
            free: Mutex::new(free),
        }
    }

    /// The region carved.
    pub(crate) fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// Offset of `len` free bytes, or `None` when no free range is large enough.
    pub(crate) fn take(&self, len: u64) -> Option<u64> {
        let want = len.max(1).checked_next_multiple_of(ALIGN)?;
        let mut free = self.free.lock();
        let (&off, &size) = free.iter().find(|(_, &size)| size >= want)?;
        free.remove(&off);
        if size > want {
            free.insert(off + want, size - want);
        }
        Some(off)
    }

    /// Give back `len` bytes at `off` (a range [`Carver::take`] returned).
    pub(crate) fn give(&self, off: u64, len: u64) {
        let Some(mut size) = len.max(1).checked_next_multiple_of(ALIGN) else {
            return;
        };
        let mut start = off;
        let mut free = self.free.lock();
        if let Some(next) = free.remove(&(off + size)) {
            size += next;
        }
        if let Some((&prev, &prev_len)) = free.range(..off).next_back() {
            if prev + prev_len == off {
                free.remove(&prev);
                start = prev;
                size += prev_len;
            }
        }
        free.insert(start, size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_found_by_any_inner_range() {
        let p = host_alloc(1 << 20);
        assert_ne!(p, 0);
        let (r, off) = find(p + 4096, 100).unwrap();
        assert_eq!((r.base(), off), (p, 4096));
        assert!(find(p + (1 << 20) - 10, 11).is_none());
        assert!(find(p, 0).is_some());
        // SAFETY: the allocation is 1 MiB of writable shared memory.
        unsafe { std::ptr::write_bytes(p as *mut u8, 7, 1 << 20) };
        assert_eq!(host_free(p + 1), -1);
        assert_eq!(host_free(p), 0);
        assert_eq!(host_free(p), -1);
        assert!(find(p, 1).is_none());
        assert_eq!(host_alloc(0), 0);
    }

    #[test]
    fn the_carver_reuses_and_merges_ranges() {
        let c = Carver::new(create(1024).unwrap());
        let a = c.take(100).unwrap();
        let b = c.take(500).unwrap();
        let d = c.take(300).unwrap();
        assert_eq!((a, b, d), (0, 128, 640));
        assert!(c.take(200).is_none());
        c.give(b, 500);
        c.give(a, 100);
        assert_eq!(c.take(600), Some(0));
        c.give(0, 600);
        c.give(d, 300);
        assert_eq!(c.take(1024), Some(0));
    }
}
