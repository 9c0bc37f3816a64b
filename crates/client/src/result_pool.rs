//! Memory for the result tensors of tensor reads (`get_tensor`,
//! `get_tensor_with_parallelism`, ...): blocks of anonymous memory that go
//! back to a bounded, process-wide pool when the tensor that used them is
//! freed, so that the next read of a similar size copies into pages that
//! are already in memory.
//!
//! Why: filling never-touched memory costs a page fault and a zero fill per
//! page before the copy (on a 2-core VM measured at about as much as the
//! copy itself, even with transparent huge pages), and a fresh 64 MiB
//! `torch.empty` is a fresh `mmap` every time. A reused block costs only the
//! copy.
//!
//! How much it keeps: at most `MC_TENSOR_RESULT_POOL` bytes of idle blocks
//! (a size such as `2GiB`; default an eighth of the machine's memory,
//! between 256 MiB and 4 GiB; `0` turns the pool off, and results are then
//! plain `torch.empty` tensors). A block returned when the idle blocks
//! would pass that cap makes room by unmapping the blocks idle longest, so
//! the pool follows the sizes a process reads now (a reshard that reads
//! 16 MiB shards after one that read 4 MiB shards does not find the pool
//! full of 4 MiB blocks); a block larger than the cap is unmapped. A block
//! idle for [`RELEASE_AFTER`] is unmapped by the pool's reaper thread, so a
//! process that stopped reading gives the memory back. Only results of at
//! least [`POOL_MIN`] bytes use the pool.
//!
//! Blocks are sized in 2 MiB steps, aligned to 2 MiB and advised to use
//! transparent huge pages (one fault per 2 MiB when first filled).

use parking_lot::Mutex;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Results smaller than this are not pooled (the fault cost of a few pages
/// is small next to the per-call cost, and rounding to 2 MiB would waste
/// more than half of a small block).
pub const POOL_MIN: u64 = 4 << 20;

/// Block size step and alignment (one transparent huge page).
const STEP: usize = 2 << 20;

/// An idle block not handed out again for this long is unmapped.
pub(crate) const RELEASE_AFTER: Duration = Duration::from_secs(10);

/// The default idle-byte cap: an eighth of physical memory, between
/// 256 MiB and 4 GiB.
fn default_idle() -> u64 {
    // SAFETY: sysconf reads system constants.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let phys = u64::try_from(pages).unwrap_or(0) * u64::try_from(page).unwrap_or(0);
    (phys / 8).clamp(256 << 20, 4 << 30)
}

/// Idle-byte cap: `MC_TENSOR_RESULT_POOL` (read once).
fn idle_cap() -> u64 {
    static CAP: OnceLock<u64> = OnceLock::new();
    *CAP.get_or_init(|| match std::env::var("MC_TENSOR_RESULT_POOL") {
        Ok(v) => match mooncake_common::size::parse_size(v.trim()) {
            Some(n) => n,
            None => {
                let d = default_idle();
                tracing::warn!(value = %v, default = d, "MC_TENSOR_RESULT_POOL is not a size; using the default");
                d
            }
        },
        Err(_) => default_idle(),
    })
}

/// One anonymous mapping, of which the 2 MiB-aligned `base..base+cap` is
/// handed out (unmapped when dropped).
struct Mapping {
    /// Keeps the mapping alive; `base` points into it.
    _map: memmap2::MmapMut,
    base: usize,
    cap: usize,
}

impl Mapping {
    fn new(cap: usize) -> Option<Mapping> {
        let map_len = cap.checked_add(STEP)?;
        let map = memmap2::MmapMut::map_anon(map_len).ok()?;
        let start = map.as_ptr() as usize;
        let base = start.next_multiple_of(STEP);
        // Transparent huge pages for the handed-out part (one fault per
        // 2 MiB); without them the memory is still usable.
        let _ = map.advise_range(memmap2::Advice::HugePage, base - start, cap);
        Some(Mapping {
            _map: map,
            base,
            cap,
        })
    }
}

/// An idle mapping and when it was returned.
struct Idle {
    map: Mapping,
    since: Instant,
}

/// Idle mappings, least recently returned first.
#[derive(Default)]
struct Pool {
    idle: Vec<Idle>,
    idle_bytes: u64,
}

impl Pool {
    /// An idle mapping of exactly `cap` bytes, the most recently returned.
    fn take(&mut self, cap: usize) -> Option<Mapping> {
        let i = self.idle.iter().rposition(|m| m.map.cap == cap)?;
        let m = self.idle.remove(i);
        self.idle_bytes -= m.map.cap as u64;
        Some(m.map)
    }

    /// Keep `map` idle under `limit` bytes in all, unmapping the mappings
    /// idle longest to make room; returns what is to be unmapped (dropped
    /// by the caller once the lock is released).
    fn put(&mut self, map: Mapping, now: Instant, limit: u64) -> Vec<Mapping> {
        let size = map.cap as u64;
        if size > limit {
            return vec![map];
        }
        let mut out = Vec::new();
        let mut drop_n = 0;
        while self.idle_bytes + size > limit {
            self.idle_bytes -= self.idle[drop_n].map.cap as u64;
            drop_n += 1;
        }
        out.extend(self.idle.drain(..drop_n).map(|m| m.map));
        self.idle_bytes += size;
        self.idle.push(Idle { map, since: now });
        out
    }

    /// Mappings idle for at least `after` at `now`, taken out of the pool.
    fn expire(&mut self, now: Instant, after: Duration) -> Vec<Mapping> {
        let n = self
            .idle
            .iter()
            .take_while(|m| now.saturating_duration_since(m.since) >= after)
            .count();
        let out: Vec<Mapping> = self.idle.drain(..n).map(|m| m.map).collect();
        self.idle_bytes -= out.iter().map(|m| m.cap as u64).sum::<u64>();
        out
    }
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        // The reaper: unmaps blocks idle for RELEASE_AFTER. Without the
        // thread, idle blocks are still bounded by the cap.
        let _ = std::thread::Builder::new()
            .name("mc-result-pool".into())
            .spawn(|| loop {
                std::thread::sleep(RELEASE_AFTER / 2);
                let old = pool().lock().expire(Instant::now(), RELEASE_AFTER);
                drop(old);
            });
        Mutex::new(Pool::default())
    })
}

/// Writable memory for one read result, at least `len` bytes, owned until
/// dropped (then it goes back to the pool, or is unmapped when the pool is
/// full). Its contents are unspecified (zero when new, an earlier result's
/// bytes when reused).
pub struct ResultBlock {
    mapping: Option<Mapping>,
    len: u64,
}

impl ResultBlock {
    /// A block for a result of `len` bytes, or `None` when the result is
    /// below [`POOL_MIN`], the pool is turned off, or mapping failed (the
    /// caller then allocates the result another way).
    pub fn for_result(len: u64) -> Option<ResultBlock> {
        if len < POOL_MIN || idle_cap() == 0 {
            return None;
        }
        let cap = usize::try_from(len).ok()?.checked_next_multiple_of(STEP)?;
        let reused = pool().lock().take(cap);
        let mapping = match reused {
            Some(m) => m,
            None => Mapping::new(cap)?,
        };
        Some(ResultBlock {
            mapping: Some(mapping),
            len,
        })
    }

    /// Address of the first byte.
    pub fn ptr(&self) -> usize {
        self.mapping.as_ref().map_or(0, |m| m.base)
    }

    /// The result size asked for (the block may be larger).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the result is empty (never: empty results are not pooled).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for ResultBlock {
    fn drop(&mut self) {
        let Some(m) = self.mapping.take() else { return };
        let unmap = pool().lock().put(m, Instant::now(), idle_cap());
        // Unmapped here, after the lock is released.
        drop(unmap);
    }
}

impl std::fmt::Debug for ResultBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultBlock")
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_results_are_not_pooled() {
        assert!(ResultBlock::for_result(0).is_none());
        assert!(ResultBlock::for_result(POOL_MIN - 1).is_none());
    }

    #[test]
    fn blocks_are_aligned_writable_and_reused() {
        let len = POOL_MIN + 12345;
        let b = ResultBlock::for_result(len).expect("a block");
        assert_eq!(b.ptr() % STEP, 0);
        assert_eq!(b.len(), len);
        // SAFETY: the block holds at least `len` writable bytes.
        let mem = unsafe { std::slice::from_raw_parts_mut(b.ptr() as *mut u8, len as usize) };
        mem.fill(7);
        assert!(mem.iter().all(|&x| x == 7));
        let first = b.ptr();
        drop(b);
        // Same size class: the idle block comes back (other tests use other sizes).
        let again = ResultBlock::for_result(len + 1).expect("a block");
        assert_eq!(again.ptr(), first);
        // SAFETY: as above; the reused block keeps its pages.
        let mem = unsafe { std::slice::from_raw_parts(again.ptr() as *const u8, len as usize) };
        assert_eq!(mem[0], 7);
        // A block in use is not handed out twice.
        let other = ResultBlock::for_result(len).expect("a block");
        assert_ne!(other.ptr(), again.ptr());
    }

    fn mapping(mib: usize) -> Mapping {
        Mapping::new(mib << 20).expect("a mapping")
    }

    #[test]
    fn a_full_pool_makes_room_by_unmapping_the_blocks_idle_longest() {
        const M: u64 = 1 << 20;
        let t0 = Instant::now();
        let mut p = Pool::default();
        // Three 4 MiB blocks fill a 12 MiB pool.
        for i in 0..3 {
            assert!(p
                .put(mapping(4), t0 + Duration::from_secs(i), 12 * M)
                .is_empty());
        }
        assert_eq!((p.idle.len(), p.idle_bytes), (3, 12 * M));
        // An 8 MiB block (the reads moved to another size) evicts the two
        // oldest 4 MiB blocks, not itself.
        let out = p.put(mapping(8), t0 + Duration::from_secs(5), 12 * M);
        assert_eq!(
            out.iter().map(|m| m.cap).collect::<Vec<_>>(),
            vec![4 << 20; 2]
        );
        assert_eq!(p.idle_bytes, 12 * M);
        assert!(p.take(8 << 20).is_some());
        assert!(p.take(8 << 20).is_none());
        assert!(p.take(4 << 20).is_some());
        assert_eq!((p.idle.len(), p.idle_bytes), (0, 0));
        // A block larger than the whole pool is not kept.
        let out = p.put(mapping(16), t0, 12 * M);
        assert_eq!(out.len(), 1);
        assert_eq!((p.idle.len(), p.idle_bytes), (0, 0));
    }

    #[test]
    fn blocks_idle_past_the_release_time_are_unmapped() {
        const M: u64 = 1 << 20;
        let t0 = Instant::now();
        let mut p = Pool::default();
        assert!(p.put(mapping(2), t0, 64 * M).is_empty());
        assert!(p
            .put(mapping(4), t0 + Duration::from_secs(4), 64 * M)
            .is_empty());
        // Neither has been idle long enough.
        assert!(p
            .expire(t0 + Duration::from_secs(9), RELEASE_AFTER)
            .is_empty());
        // The first has, the second not yet.
        let out = p.expire(t0 + RELEASE_AFTER, RELEASE_AFTER);
        assert_eq!(out.iter().map(|m| m.cap).collect::<Vec<_>>(), vec![2 << 20]);
        assert_eq!(p.idle_bytes, 4 * M);
        // A block taken and returned starts its idle time again.
        let m = p.take(4 << 20).expect("the 4 MiB block");
        assert!(p.put(m, t0 + Duration::from_secs(20), 64 * M).is_empty());
        assert!(p
            .expire(t0 + Duration::from_secs(29), RELEASE_AFTER)
            .is_empty());
        assert_eq!(
            p.expire(t0 + Duration::from_secs(30), RELEASE_AFTER).len(),
            1
        );
        assert_eq!((p.idle.len(), p.idle_bytes), (0, 0));
    }

    #[test]
    fn the_default_cap_is_an_eighth_of_memory_within_bounds() {
        let d = default_idle();
        assert!((256 << 20..=4 << 30).contains(&d), "{d}");
    }
}
