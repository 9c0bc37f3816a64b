//! Whether never-written segment pages are filled with `pwrite` or through
//! the mapping, decided from how fast recent `pwrite`s were.
//!
//! `pwrite` on the memfd allocates and fills each new page in one step, with
//! no page fault or page-table update (on the reference VM, 1.6x faster
//! fresh-page fills under load, level with the mapped copy on a quiet
//! machine). But shmem's write path holds the
//! file's inode lock for the whole call, so the copy workers of one batch
//! take turns. That costs little while a page takes about 2 µs to provide;
//! it costs a lot when each new page first needs the host's help (a VM whose
//! free memory was reported to the host: about 20 µs a page), because stores
//! through the mapping then fault on every core at once: cold 64 KiB
//! backups ran about 1.5x faster through the mapping in that state.
//!
//! So a `pwrite` that took longer than [`SLOW_NS_PER_PAGE`] per page,
//! [`STREAK`] times in a row, sends fresh writes through the mapping for
//! [`HOLD_NS`]; the first fresh write after that tries `pwrite` again.
//! A single slow call (a preempted thread) does not switch.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// A `pwrite` slower than this per 4 KiB page counts as slow (about 2 µs
/// is normal here, twice that when two workers take turns on the lock).
pub(crate) const SLOW_NS_PER_PAGE: u64 = 12_000;
/// Consecutive slow calls that switch fresh writes to the mapping.
pub(crate) const STREAK: u32 = 3;
/// How long fresh writes then go through the mapping.
pub(crate) const HOLD_NS: u64 = 2_000_000_000;
/// Calls shorter than this many pages are not timed (too noisy).
pub(crate) const MIN_PAGES: u64 = 16;

/// The decision state (one per process: see [`gate`]).
pub(crate) struct Gate {
    slow_streak: AtomicU32,
    hold_until_ns: AtomicU64,
}

impl Gate {
    /// A gate that allows `pwrite`.
    pub(crate) const fn new() -> Self {
        Self {
            slow_streak: AtomicU32::new(0),
            hold_until_ns: AtomicU64::new(0),
        }
    }

    /// Whether a fresh write at `now_ns` should use `pwrite`.
    pub(crate) fn allow(&self, now_ns: u64) -> bool {
        now_ns >= self.hold_until_ns.load(Ordering::Relaxed)
    }

    /// Records a `pwrite` of `bytes` that ended at `now_ns` after `took_ns`.
    pub(crate) fn record(&self, now_ns: u64, bytes: u64, took_ns: u64) {
        let pages = bytes / 4096;
        if pages < MIN_PAGES {
            return;
        }
        if took_ns <= pages.saturating_mul(SLOW_NS_PER_PAGE) {
            self.slow_streak.store(0, Ordering::Relaxed);
            return;
        }
        if self.slow_streak.fetch_add(1, Ordering::Relaxed) + 1 >= STREAK {
            self.slow_streak.store(0, Ordering::Relaxed);
            self.hold_until_ns
                .store(now_ns.saturating_add(HOLD_NS), Ordering::Relaxed);
            tracing::debug!(
                ns_per_page = took_ns / pages,
                hold_ms = HOLD_NS / 1_000_000,
                "fresh-page pwrite is slow; writing new pages through the mapping for a while"
            );
        }
    }
}

/// The process's gate.
pub(crate) fn gate() -> &'static Gate {
    static GATE: Gate = Gate::new();
    &GATE
}

/// Nanoseconds since this process first asked.
pub(crate) fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let e = EPOCH.get_or_init(Instant::now);
    u64::try_from(e.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn three_slow_calls_in_a_row_switch_for_the_hold_time() {
        let g = Gate::new();
        let bytes = 64 << 10; // 16 pages
        let slow = 16 * SLOW_NS_PER_PAGE + 1;
        assert!(g.allow(0));
        g.record(MS, bytes, slow);
        g.record(2 * MS, bytes, slow);
        assert!(g.allow(2 * MS), "two slow calls do not switch");
        g.record(3 * MS, bytes, slow);
        assert!(!g.allow(3 * MS), "the third one does");
        assert!(!g.allow(3 * MS + HOLD_NS - 1));
        assert!(
            g.allow(3 * MS + HOLD_NS),
            "pwrite is tried again after the hold"
        );
    }

    #[test]
    fn a_fast_call_restarts_the_count_and_short_calls_are_not_timed() {
        let g = Gate::new();
        let bytes = 64 << 10;
        let slow = 16 * SLOW_NS_PER_PAGE + 1;
        let fast = 16 * 2_000;
        g.record(MS, bytes, slow);
        g.record(2 * MS, bytes, slow);
        g.record(3 * MS, bytes, fast);
        g.record(4 * MS, bytes, slow);
        g.record(5 * MS, bytes, slow);
        assert!(g.allow(5 * MS), "a fast call restarts the count");
        // Calls under MIN_PAGES are not timed: they neither count nor reset.
        g.record(6 * MS, 16 << 10, u64::MAX);
        assert!(g.allow(6 * MS));
        g.record(7 * MS, bytes, slow);
        assert!(!g.allow(7 * MS), "three slow timed calls in a row");
    }
}
