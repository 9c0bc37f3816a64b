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
//! copy. The pool keeps at most `MC_TENSOR_RESULT_POOL` bytes of idle
//! blocks (a size such as `256MiB`, default 256 MiB; `0` turns it off, and
//! results are then plain `torch.empty` tensors); a block returned above
//! that is unmapped. Only results of at least [`POOL_MIN`] bytes use it.
//!
//! Blocks are sized in 2 MiB steps, aligned to 2 MiB and advised to use
//! transparent huge pages (one fault per 2 MiB when first filled).

use parking_lot::Mutex;
use std::sync::OnceLock;

/// Results smaller than this are not pooled (the fault cost of a few pages
/// is small next to the per-call cost, and rounding to 2 MiB would waste
/// more than half of a small block).
pub const POOL_MIN: u64 = 4 << 20;

/// Block size step and alignment (one transparent huge page).
const STEP: usize = 2 << 20;

/// Idle bytes the pool keeps by default.
const DEFAULT_IDLE: u64 = 256 << 20;

/// Idle-byte cap: `MC_TENSOR_RESULT_POOL` (read once).
fn idle_cap() -> u64 {
    static CAP: OnceLock<u64> = OnceLock::new();
    *CAP.get_or_init(|| {
        match std::env::var("MC_TENSOR_RESULT_POOL") {
            Ok(v) => match mooncake_common::size::parse_size(v.trim()) {
                Some(n) => n,
                None => {
                    tracing::warn!(value = %v, "MC_TENSOR_RESULT_POOL is not a size; using the default");
                    DEFAULT_IDLE
                }
            },
            Err(_) => DEFAULT_IDLE,
        }
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

/// Idle mappings, most recently returned last.
struct Pool {
    idle: Vec<Mapping>,
    idle_bytes: u64,
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        Mutex::new(Pool {
            idle: Vec::new(),
            idle_bytes: 0,
        })
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
        let reused = {
            let mut p = pool().lock();
            match p.idle.iter().rposition(|m| m.cap == cap) {
                Some(i) => {
                    let m = p.idle.swap_remove(i);
                    p.idle_bytes -= m.cap as u64;
                    Some(m)
                }
                None => None,
            }
        };
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
        let cap = idle_cap();
        let mut p = pool().lock();
        if p.idle_bytes + m.cap as u64 <= cap {
            p.idle_bytes += m.cap as u64;
            p.idle.push(m);
        } else {
            // Over the cap: unmapped when `m` drops (after the lock is released).
            drop(p);
            drop(m);
        }
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
}
