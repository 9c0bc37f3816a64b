//! Input retention and pulls for all-or-nothing reductions.
//!
//! A reduction that moves a rank's input in several pieces (or, in the
//! two-phase all_reduce, reduces chunks on different ranks) can lose a
//! failed rank's data partway through: some pieces would include it and
//! others not. To recompute such an op over exactly the ranks whose whole
//! input it can obtain, every rank keeps a copy of its input for the op
//! ("retention") until each other member of the op's snapshot has
//! acknowledged the op (completed-seq watermarks on PONGs and pieces) or
//! failed; a rank that must recompute pulls the survivors' retained inputs.
//!
//! This module owns the retained copies (in pooled buffers), the pull
//! requests that arrived before the retention they ask for, and this rank's
//! own outstanding pulls. It knows nothing about links or frames: `reader`
//! answers requests and lands responses, `progress` holds inputs and pulls.
//!
//! The copy is made lazily, block by block: [`Retention::hold`] records the
//! input ranges, and each block is copied when the op is about to write over
//! it or read it (then it is in cache for the read), when a pull asks for
//! it, or at the latest before the op completes ([`Retention::fill_all`]).
//! Until then a block's bytes are still the input's.
//!
//! Memory bound: at most [`MAX_HELD`] copies are kept. Holding one more
//! releases the oldest early; a later pull for it is answered "not held",
//! and the puller then counts that rank as failed for that op (its result
//! still matches its hint).

use crate::transport::copy;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Retained copies kept at once; holding another releases the oldest.
pub(crate) const MAX_HELD: usize = 4;
/// Released buffers kept for reuse (a steady loop of large reductions
/// then copies into warm memory instead of faulting in fresh pages).
const MAX_POOLED: usize = 2;

/// Bytes of a retained input copied at a time.
const FILL_BLOCK: usize = 64 * 1024;

/// Retained inputs at least this large are copied with streaming stores:
/// the copy is read only by a pull after a failure, so writing it through
/// the cache would evict the input the op is about to send and reduce.
const STREAM_MIN_RETAINED: usize = 256 * 1024;

/// One retained input.
struct Held {
    seq: u64,
    buf: Vec<u8>,
    len: usize,
    /// Slots that may still pull it (peers of the op's snapshot that have
    /// neither acknowledged the op nor failed, and ourselves until the op
    /// completes).
    waiting: u64,
    /// The input ranges `(address, bytes)`, concatenated in `buf`, while a
    /// block is not copied yet; empty once every block is.
    src: Vec<(usize, usize)>,
    /// Which [`FILL_BLOCK`]-sized blocks of `buf` hold their copy; empty
    /// once all do.
    filled: Vec<bool>,
    /// Blocks not copied yet.
    left: usize,
    /// Copy with streaming stores ([`STREAM_MIN_RETAINED`]).
    stream: bool,
}

impl Held {
    /// Copies block `k` of the input into `buf` unless it is there already.
    fn fill_block(&mut self, k: usize) {
        if self.filled.get(k) != Some(&false) {
            return;
        }
        let start = k * FILL_BLOCK;
        let end = (start + FILL_BLOCK).min(self.len);
        let mut base = 0;
        for &(p, l) in &self.src {
            let (a, b) = (start.max(base), end.min(base + l));
            if a < b {
                // SAFETY: `hold`'s caller keeps `p..p + l` readable, and
                // unwritten until its blocks are copied (this one is not
                // yet); `a..b` lies inside both that range (shifted by
                // `base`) and `buf` (`b <= len <= buf.len()`), which is ours.
                unsafe {
                    copy::copy(
                        (p + (a - base)) as *const u8,
                        self.buf.as_mut_ptr().add(a),
                        b - a,
                        self.stream,
                    )
                };
            }
            base += l;
            if base >= end {
                break;
            }
        }
        self.filled[k] = true;
        self.left -= 1;
        if self.left == 0 {
            self.src = Vec::new();
            self.filled = Vec::new();
        }
    }

    /// Copies the blocks covering bytes `off..off + len` of `buf`.
    fn fill_span(&mut self, off: usize, len: usize) {
        if self.left == 0 || len == 0 {
            return;
        }
        let last = (off + len - 1).min(self.len.saturating_sub(1)) / FILL_BLOCK;
        for k in off / FILL_BLOCK..=last {
            self.fill_block(k);
        }
    }

    /// Copies the blocks holding input bytes at `addr..addr + len`.
    fn fill_addr(&mut self, addr: usize, len: usize) {
        let mut base = 0;
        let mut i = 0;
        // By index: the last block copied empties `src`.
        while let Some(&(p, l)) = self.src.get(i) {
            let (a, b) = (addr.max(p), (addr + len).min(p + l));
            if a < b {
                self.fill_span(base + (a - p), b - a);
            }
            base += l;
            i += 1;
        }
    }
}

/// A pull this rank issued: `len` bytes from slot `src` into `dst`.
struct Pull {
    src: usize,
    dst: usize,
    len: usize,
    got: usize,
    failed: bool,
}

/// A peer's pull request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// The requesting slot.
    pub(crate) src: usize,
    /// Its pull id.
    pub(crate) id: u32,
    /// The op.
    pub(crate) seq: u64,
    /// First byte of the range within the retained input.
    pub(crate) offset: u64,
    /// Bytes wanted.
    pub(crate) len: u64,
}

/// What to do with a request that just arrived.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The input is held: answer now.
    Serve,
    /// The op started (or was released) without this input held: refuse.
    Refuse,
    /// The op has not started here yet: queued until it does.
    Queued,
}

/// Per-group retention state.
#[derive(Default)]
pub(crate) struct Retention {
    held: Mutex<VecDeque<Held>>,
    /// Number of entries in `held` (lets the readers skip the lock).
    nheld: AtomicUsize,
    pool: Mutex<Vec<Vec<u8>>>,
    requests: Mutex<Vec<Request>>,
    pulls: Mutex<HashMap<u32, Pull>>,
    next_id: AtomicU32,
    /// One past the latest op this member started (`begin`).
    started: AtomicU64,
    /// One past the latest op this member completed (our watermark).
    completed: AtomicU64,
}

impl Retention {
    /// A buffer of at least `len` bytes (pooled when one is big enough).
    fn buffer(&self, len: usize) -> Vec<u8> {
        let mut pool = self.pool.lock();
        match pool.iter().position(|b| b.len() >= len) {
            Some(i) => pool.swap_remove(i),
            None => vec![0u8; len],
        }
    }

    /// Returns a buffer to the pool (dropped when the pool is full).
    fn give_back(&self, b: Vec<u8>) {
        let mut pool = self.pool.lock();
        if pool.len() < MAX_POOLED {
            pool.push(b);
        } else if let Some(i) = pool.iter().position(|p| p.len() < b.len()) {
            pool[i] = b;
        }
    }

    /// Retains a copy of `ranges` (concatenated) for op `seq` until every
    /// slot in `waiting` acknowledged it or failed (include our own slot:
    /// [`Retention::ack`] it when the op completes). Returns the requests
    /// that were waiting for it. Releases the oldest copy at the cap.
    ///
    /// Nothing is copied yet: see [`Retention::fill`] and
    /// [`Retention::fill_all`].
    ///
    /// # Safety
    /// Every range `(address, len)` must stay valid for reads of `len` bytes
    /// until [`Retention::fill_all`] of `seq` returns, and no byte of it may
    /// be written before a [`Retention::fill`] covering it returned.
    pub(crate) unsafe fn hold(
        &self,
        seq: u64,
        ranges: &[(usize, usize)],
        waiting: u64,
    ) -> Vec<Request> {
        let len: usize = ranges.iter().map(|r| r.1).sum();
        let blocks = len.div_ceil(FILL_BLOCK);
        let buf = self.buffer(len);
        let mut held = self.held.lock();
        while held.len() >= MAX_HELD {
            if let Some(h) = held.pop_front() {
                self.give_back(h.buf);
            }
        }
        held.push_back(Held {
            seq,
            buf,
            len,
            waiting,
            src: if blocks > 0 {
                ranges.to_vec()
            } else {
                Vec::new()
            },
            filled: vec![false; blocks],
            left: blocks,
            stream: len >= STREAM_MIN_RETAINED,
        });
        self.nheld.store(held.len(), Ordering::Release);
        drop(held);
        let mut reqs = self.requests.lock();
        let (now, later): (Vec<Request>, Vec<Request>) = reqs.drain(..).partition(|r| r.seq == seq);
        *reqs = later;
        now
    }

    /// Copies what is not copied yet of op `seq`'s retained input among the
    /// input bytes at `addr..addr + len`: before the op writes them, or as
    /// it reads them (they are then in cache for its read).
    pub(crate) fn fill(&self, seq: u64, addr: usize, len: usize) {
        if self.nheld.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(h) = self.held.lock().iter_mut().find(|h| h.seq == seq) {
            h.fill_addr(addr, len);
        }
    }

    /// Copies the rest of op `seq`'s retained input; afterwards the copy no
    /// longer reads the op's ranges.
    pub(crate) fn fill_all(&self, seq: u64) {
        if self.nheld.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(h) = self.held.lock().iter_mut().find(|h| h.seq == seq) {
            let len = h.len;
            h.fill_span(0, len);
        }
    }

    /// Marks op `seq` started (after its input, if any, is held) and returns
    /// the queued requests for it or earlier ops that nothing holds: they
    /// must be refused.
    pub(crate) fn begin(&self, seq: u64) -> Vec<Request> {
        self.started.fetch_max(seq + 1, Ordering::AcqRel);
        let mut reqs = self.requests.lock();
        let (stale, later): (Vec<Request>, Vec<Request>) =
            reqs.drain(..).partition(|r| r.seq <= seq);
        *reqs = later;
        stale
    }

    /// Records that this member completed op `seq` (its watermark).
    pub(crate) fn complete(&self, seq: u64) {
        self.completed.fetch_max(seq + 1, Ordering::AcqRel);
    }

    /// Our completed-op watermark: every op below it is done here.
    pub(crate) fn watermark(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// Classifies a peer's request; queues it when its op has not started.
    pub(crate) fn admit(&self, r: Request) -> Verdict {
        let mut reqs = self.requests.lock();
        // `hold` inserts before draining `requests`, and `begin` advances
        // `started` after `hold`: checking both under the requests lock
        // never queues a request nobody will answer.
        if self.held.lock().iter().any(|h| h.seq == r.seq) {
            return Verdict::Serve;
        }
        if r.seq < self.started.load(Ordering::Acquire) {
            return Verdict::Refuse;
        }
        reqs.push(r);
        Verdict::Queued
    }

    /// Calls `f` with `len` bytes at `offset` of our retained input for
    /// `seq`; `None` when no such range is held.
    pub(crate) fn with_range<T>(
        &self,
        seq: u64,
        offset: u64,
        len: u64,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Option<T> {
        let mut held = self.held.lock();
        let h = held.iter_mut().find(|h| h.seq == seq)?;
        let off = usize::try_from(offset).ok()?;
        let len = usize::try_from(len).ok()?;
        let end = off.checked_add(len).filter(|&e| e <= h.len)?;
        h.fill_span(off, len);
        Some(f(&h.buf[off..end]))
    }

    /// Slot `slot` completed every op below `watermark`: it will not pull
    /// them any more.
    pub(crate) fn ack(&self, slot: usize, watermark: u64) {
        if self.nheld.load(Ordering::Acquire) == 0 || slot >= 64 {
            return;
        }
        self.settle(|h| {
            if h.seq < watermark {
                h.waiting &= !(1u64 << slot);
            }
        });
    }

    /// Slots in `dead` failed: they will never acknowledge (or pull).
    pub(crate) fn forget(&self, dead: u64) {
        if self.nheld.load(Ordering::Acquire) == 0 {
            return;
        }
        self.settle(|h| h.waiting &= !dead);
    }

    /// Number of copies held.
    #[cfg(test)]
    pub(crate) fn held_count(&self) -> usize {
        self.nheld.load(Ordering::Acquire)
    }

    fn settle(&self, mut f: impl FnMut(&mut Held)) {
        let mut held = self.held.lock();
        held.iter_mut().for_each(&mut f);
        while let Some(i) = held.iter().position(|h| h.waiting == 0) {
            if let Some(h) = held.remove(i) {
                self.give_back(h.buf);
            }
        }
        self.nheld.store(held.len(), Ordering::Release);
    }

    /// A destination buffer for a pull (from the pool).
    pub(crate) fn pull_buffer(&self, len: usize) -> Vec<u8> {
        self.buffer(len)
    }

    /// Returns a pull destination to the pool.
    pub(crate) fn recycle(&self, b: Vec<u8>) {
        self.give_back(b);
    }

    /// Registers a pull of `len` bytes from slot `src` into `dst`; returns
    /// its id.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes until
    /// [`Retention::finish_pull`] of the returned id.
    pub(crate) unsafe fn start_pull(&self, src: usize, dst: usize, len: usize) -> u32 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.pulls.lock().insert(
            id,
            Pull {
                src,
                dst,
                len,
                got: 0,
                failed: false,
            },
        );
        id
    }

    /// Lands response bytes for pull `id` from `src` at `offset`; `None`
    /// when the pull is unknown or the range overruns it (it then fails).
    pub(crate) fn land(&self, id: u32, src: usize, offset: u64, data: &[u8]) -> Option<()> {
        let mut pulls = self.pulls.lock();
        let p = pulls.get_mut(&id).filter(|p| p.src == src)?;
        let end = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(data.len()).map(|e| (o, e)))
            .filter(|&(_, e)| e <= p.len);
        let Some((off, _)) = end else {
            p.failed = true;
            return None;
        };
        // SAFETY: `start_pull` requires `dst` to stay writable for `len`
        // bytes until the pull is finished, which takes this lock; the
        // range `off..off + data.len()` lies inside it (checked above), and
        // `data` is a receive buffer, never the destination.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), (p.dst + off) as *mut u8, data.len())
        };
        p.got += data.len();
        Some(())
    }

    /// Marks pull `id` failed, or every pull from `src` when `id` is `None`.
    pub(crate) fn fail_pulls(&self, src: usize, id: Option<u32>) {
        for (k, p) in self.pulls.lock().iter_mut() {
            if p.src == src && id.is_none_or(|i| i == *k) {
                p.failed = true;
            }
        }
    }

    /// `Some(true)` when pull `id` has all its bytes, `Some(false)` when it
    /// failed (or is unknown), `None` while pending.
    pub(crate) fn pull_state(&self, id: u32) -> Option<bool> {
        let pulls = self.pulls.lock();
        let Some(p) = pulls.get(&id) else {
            return Some(false);
        };
        if p.failed {
            Some(false)
        } else if p.got >= p.len {
            Some(true)
        } else {
            None
        }
    }

    /// Forgets pull `id`; no byte lands in its destination afterwards.
    pub(crate) fn finish_pull(&self, id: u32) {
        self.pulls.lock().remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holds `data` for op `seq` and copies it at once (as an op does
    /// before it completes), so `data` may go away afterwards.
    fn hold(r: &Retention, seq: u64, data: &[u8], waiting: u64) -> Vec<Request> {
        // SAFETY: `data` is a live slice until `fill_all` returns.
        let due = unsafe { r.hold(seq, &[(data.as_ptr() as usize, data.len())], waiting) };
        r.fill_all(seq);
        due
    }

    #[test]
    fn retained_ranges_are_served_until_every_waiter_acknowledged() {
        let r = Retention::default();
        let a = [1u8, 2, 3];
        let b = [4u8, 5];
        // SAFETY: both ranges are live arrays.
        let due = unsafe {
            r.hold(
                7,
                &[(a.as_ptr() as usize, 3), (b.as_ptr() as usize, 2)],
                0b111,
            )
        };
        assert!(due.is_empty());
        assert_eq!(r.with_range(7, 2, 3, |d| d.to_vec()), Some(vec![3, 4, 5]));
        assert_eq!(r.with_range(7, 4, 2, |_| ()), None, "past the end");
        assert_eq!(r.with_range(8, 0, 1, |_| ()), None, "unknown op");
        r.ack(1, 7);
        assert!(
            r.with_range(7, 0, 1, |_| ()).is_some(),
            "watermark 7 excludes op 7"
        );
        r.ack(1, 8);
        r.ack(0, 8);
        assert!(
            r.with_range(7, 0, 1, |_| ()).is_some(),
            "slot 2 has not acknowledged"
        );
        r.forget(0b100);
        assert_eq!(
            r.with_range(7, 0, 1, |_| ()),
            None,
            "released once all are done"
        );
        assert_eq!(r.held_count(), 0);
    }

    #[test]
    fn blocks_are_copied_when_filled_and_keep_the_input_as_it_was_then() {
        let r = Retention::default();
        let n = 3 * FILL_BLOCK + 100;
        let mut a: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let mut b = vec![7u8; 50];
        let want_a = a.clone();
        let (pa, pb) = (a.as_mut_ptr() as usize, b.as_mut_ptr() as usize);
        // SAFETY: both vectors stay alive, and are written below only where
        // a fill covered them first (or after `fill_all`).
        unsafe { r.hold(3, &[(pa, n), (pb, 50)], 0b10) };
        // The second block of `a`, and `b`'s bytes 10..20, before they are
        // written over.
        r.fill(3, pa + FILL_BLOCK + 5, 10);
        r.fill(3, pb + 10, 10);
        a[FILL_BLOCK..2 * FILL_BLOCK].fill(0xEE);
        b.fill(0xEE);
        assert_eq!(
            r.with_range(3, FILL_BLOCK as u64, FILL_BLOCK as u64, |d| d.to_vec()),
            Some(want_a[FILL_BLOCK..2 * FILL_BLOCK].to_vec())
        );
        // `b` lies in the last block, which holds its copy from the fill.
        assert_eq!(
            r.with_range(3, n as u64 + 10, 10, |d| d.to_vec()),
            Some(vec![7u8; 10])
        );
        r.fill_all(3);
        a.fill(0xDD);
        let whole = r.with_range(3, 0, n as u64, |d| d.to_vec());
        assert_eq!(
            whole,
            Some(want_a),
            "every block as it was before the writes"
        );
    }

    #[test]
    fn a_pull_copies_the_blocks_it_reads() {
        let r = Retention::default();
        let mut a = vec![5u8; 2 * FILL_BLOCK];
        let pa = a.as_mut_ptr() as usize;
        // SAFETY: `a` stays alive and is written only after `fill_all`.
        unsafe { r.hold(1, &[(pa, a.len())], 0b10) };
        assert_eq!(r.with_range(1, 3, 2, |d| d.to_vec()), Some(vec![5, 5]));
        r.fill_all(1);
        a.fill(0);
        assert_eq!(
            r.with_range(1, FILL_BLOCK as u64, 4, |d| d.to_vec()),
            Some(vec![5; 4])
        );
    }

    #[test]
    fn the_cap_releases_the_oldest_copy() {
        let r = Retention::default();
        for seq in 0..MAX_HELD as u64 + 2 {
            hold(&r, seq, &[seq as u8; 8], 0b10);
        }
        assert_eq!(r.held_count(), MAX_HELD);
        assert_eq!(r.with_range(0, 0, 1, |_| ()), None, "oldest released");
        assert_eq!(r.with_range(1, 0, 1, |_| ()), None);
        let last = MAX_HELD as u64 + 1;
        assert_eq!(r.with_range(last, 0, 8, |d| d[7]), Some(last as u8));
        r.begin(last);
        let req = Request {
            src: 1,
            id: 0,
            seq: 0,
            offset: 0,
            len: 1,
        };
        assert_eq!(r.admit(req), Verdict::Refuse, "a released op is refused");
        r.ack(1, last + 1);
        assert_eq!(r.held_count(), 0, "one watermark releases every older op");
    }

    #[test]
    fn early_requests_wait_for_the_retention_or_are_refused() {
        let r = Retention::default();
        let req = |seq| Request {
            src: 1,
            id: 3,
            seq,
            offset: 0,
            len: 1,
        };
        r.begin(4);
        assert_eq!(r.admit(req(9)), Verdict::Queued);
        assert_eq!(r.admit(req(6)), Verdict::Queued);
        assert_eq!(
            r.admit(req(2)),
            Verdict::Refuse,
            "op 2 started, nothing held"
        );
        let due = hold(&r, 9, &[42], 0b10);
        assert_eq!(due, vec![req(9)]);
        assert_eq!(r.admit(req(9)), Verdict::Serve);
        assert_eq!(r.begin(9), vec![req(6)], "op 6 never held: refuse it");
        assert!(r.begin(10).is_empty());
    }

    #[test]
    fn pulls_land_in_place_and_reject_overruns() {
        let r = Retention::default();
        let mut dst = [0u8; 4];
        // SAFETY: `dst` outlives the pull.
        let id = unsafe { r.start_pull(2, dst.as_mut_ptr() as usize, 4) };
        assert_eq!(r.pull_state(id), None);
        assert!(r.land(id, 2, 0, &[1, 2]).is_some());
        assert!(r.land(id, 3, 2, &[9, 9]).is_none(), "wrong source");
        assert!(r.land(id, 2, 2, &[3, 4]).is_some());
        assert_eq!(r.pull_state(id), Some(true));
        r.finish_pull(id);
        assert_eq!(dst, [1, 2, 3, 4]);
        assert_eq!(r.pull_state(id), Some(false), "finished pulls are gone");
        // SAFETY: `dst` outlives the pull.
        let id = unsafe { r.start_pull(2, dst.as_mut_ptr() as usize, 2) };
        assert!(r.land(id, 2, 1, &[7, 7]).is_none(), "overrun");
        assert_eq!(r.pull_state(id), Some(false));
        r.finish_pull(id);
        // SAFETY: `dst` outlives the pull.
        let id = unsafe { r.start_pull(3, dst.as_mut_ptr() as usize, 2) };
        r.fail_pulls(3, None);
        assert_eq!(r.pull_state(id), Some(false), "source failed");
        assert_eq!(dst, [1, 2, 3, 4]);
    }
}
