//! Input retention and pulls for all-or-nothing reductions (pg spec,
//! per-op contract: "inclusion is all-or-nothing per rank").
//!
//! A multi-piece reduction can lose a failed rank's data partway through:
//! some pieces (or, in the two-phase all_reduce, some chunks) would include
//! it and others not. To recompute such an op over exactly the ranks whose
//! whole input it can obtain, every rank keeps a copy of its input for the
//! op ("retention") until every other member has acknowledged the op or
//! failed; a rank that must recompute pulls the survivors' retained inputs.
//!
//! This module holds the retained copies (pooled buffers), the pull requests
//! waiting for a retention that does not exist yet, and this rank's own
//! outstanding pulls. Frames: `PULL_REQ` / `PULL_RESP` / `ACK` over the
//! peer sockets (see `reader` and `progress`).

use crate::copy;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};

/// Retained copies kept at once before the oldest is released regardless
/// (bounds memory if acknowledgements never come).
const MAX_HELD: usize = 16;
/// Pooled buffers kept for reuse.
const MAX_POOLED: usize = 4;

struct Held {
    seq: u64,
    buf: Vec<u8>,
    len: usize,
    /// Peers that have not acknowledged the op yet.
    waiting: u64,
}

/// A pull this rank issued: `len` bytes from `src` into `dst`.
struct Pull {
    src: usize,
    dst: usize,
    len: usize,
    got: usize,
    failed: bool,
}

/// A peer's pull waiting for our retention of `seq`.
pub(crate) struct Request {
    /// The requesting slot.
    pub(crate) src: usize,
    /// Its pull id.
    pub(crate) id: u32,
    /// The op.
    pub(crate) seq: u64,
    /// First byte of the range.
    pub(crate) offset: u64,
    /// Bytes wanted.
    pub(crate) len: u64,
}

/// Per-group retention state.
#[derive(Default)]
pub(crate) struct Retention {
    held: Mutex<VecDeque<Held>>,
    pool: Mutex<Vec<Vec<u8>>>,
    requests: Mutex<Vec<Request>>,
    pulls: Mutex<HashMap<u32, Pull>>,
    next_id: AtomicU32,
}

impl Retention {
    /// A pooled buffer of at least `len` bytes.
    pub(crate) fn buffer(&self, len: usize) -> Vec<u8> {
        let mut pool = self.pool.lock();
        match pool.iter().position(|b| b.capacity() >= len) {
            Some(i) => {
                let mut b = pool.swap_remove(i);
                // SAFETY-free: the contents are overwritten before any read.
                b.resize(len, 0);
                b
            }
            None => vec![0u8; len],
        }
    }

    /// Returns a buffer to the pool.
    pub(crate) fn give_back(&self, b: Vec<u8>) {
        let mut pool = self.pool.lock();
        if pool.len() < MAX_POOLED {
            pool.push(b);
        }
    }

    /// Retains a copy of `ranges` (concatenated) for op `seq` until every
    /// slot in `peers` acknowledged it; returns the requests that were
    /// waiting for it.
    ///
    /// # Safety
    /// Every range must be valid for reads of its length.
    pub(crate) unsafe fn hold(&self, seq: u64, ranges: &[(usize, usize)], peers: u64) -> Vec<Request> {
        let len: usize = ranges.iter().map(|r| r.1).sum();
        let mut buf = self.buffer(len);
        let mut at = 0;
        for &(p, l) in ranges {
            if l > 0 {
                // SAFETY: `p` is readable for `l` bytes (caller), `buf` has
                // `len - at >= l` bytes left; they cannot overlap (ours).
                unsafe {
                    copy::copy(
                        p as *const u8,
                        buf.as_mut_ptr().add(at),
                        l,
                        l >= copy::STREAM_MIN_MESSAGE,
                    )
                };
            }
            at += l;
        }
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
            waiting: peers,
        });
        drop(held);
        let mut reqs = self.requests.lock();
        let (now, later): (Vec<Request>, Vec<Request>) = reqs.drain(..).partition(|r| r.seq == seq);
        *reqs = later;
        now
    }

    /// Copies `len` bytes at `offset` of our retained input for `seq` out
    /// through `f`, in pieces; false when we hold no such range.
    pub(crate) fn with_range(
        &self,
        seq: u64,
        offset: u64,
        len: u64,
        f: impl FnOnce(&[u8]),
    ) -> bool {
        let held = self.held.lock();
        let Some(h) = held.iter().find(|h| h.seq == seq) else {
            return false;
        };
        let (Ok(off), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
            return false;
        };
        match off.checked_add(len) {
            Some(end) if end <= h.len => {
                f(&h.buf[off..end]);
                true
            }
            _ => false,
        }
    }

    /// A peer's request for a retention we may not have yet: true when it
    /// was queued (we will have it when our op `seq` starts).
    pub(crate) fn queue_if_missing(&self, r: Request, next_seq: u64) -> Option<Request> {
        let held = self.held.lock();
        if held.iter().any(|h| h.seq == r.seq) || r.seq < next_seq.saturating_sub(MAX_HELD as u64) {
            return Some(r);
        }
        drop(held);
        let mut reqs = self.requests.lock();
        // Re-check under the requests lock: `hold` drains it after inserting.
        if self.held.lock().iter().any(|h| h.seq == r.seq) {
            return Some(r);
        }
        reqs.push(r);
        None
    }

    /// `slot` acknowledged op `seq`; releases copies nobody needs any more.
    pub(crate) fn ack(&self, seq: u64, slot: usize) {
        self.settle(|h| {
            if h.seq == seq {
                h.waiting &= !(1u64 << slot);
            }
        });
    }

    /// Peers in `dead` will never acknowledge.
    pub(crate) fn forget(&self, dead: u64) {
        self.settle(|h| h.waiting &= !dead);
    }

    fn settle(&self, mut f: impl FnMut(&mut Held)) {
        let mut held = self.held.lock();
        for h in held.iter_mut() {
            f(h);
        }
        let mut keep = VecDeque::with_capacity(held.len());
        for h in held.drain(..) {
            if h.waiting == 0 {
                self.give_back(h.buf);
            } else {
                keep.push_back(h);
            }
        }
        *held = keep;
    }

    /// Registers a pull of `len` bytes from `src` into `dst`; returns its id.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes until [`Retention::finish_pull`].
    pub(crate) unsafe fn start_pull(&self, src: usize, dst: usize, len: usize) -> u32 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.pulls.lock().insert(
            id,
            Pull {
                src,
                dst,
                len,
                got: 0,
                failed: len == 0 && false,
            },
        );
        id
    }

    /// Lands response bytes for pull `id` at `offset`; `None` when unknown.
    pub(crate) fn land(&self, id: u32, src: usize, offset: u64, data: &[u8]) -> Option<()> {
        let mut pulls = self.pulls.lock();
        let p = pulls.get_mut(&id).filter(|p| p.src == src)?;
        let off = usize::try_from(offset).ok()?;
        let end = off.checked_add(data.len())?;
        if end > p.len {
            p.failed = true;
            return None;
        }
        // SAFETY: `start_pull` guarantees `dst` is writable for `len` bytes
        // until the pull is finished; `off..end` is inside it.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), (p.dst + off) as *mut u8, data.len())
        };
        p.got += data.len();
        Some(())
    }

    /// Marks pull `id` (or every pull from `src` when `id` is `None`) failed.
    pub(crate) fn fail_pulls(&self, src: usize, id: Option<u32>) {
        for (k, p) in self.pulls.lock().iter_mut() {
            if p.src == src && id.is_none_or(|i| i == *k) {
                p.failed = true;
            }
        }
    }

    /// `Some(true)` when pull `id` has all its bytes, `Some(false)` when it
    /// failed, `None` while pending.
    pub(crate) fn pull_state(&self, id: u32) -> Option<bool> {
        let pulls = self.pulls.lock();
        let p = pulls.get(&id)?;
        if p.failed {
            Some(false)
        } else if p.got >= p.len {
            Some(true)
        } else {
            None
        }
    }

    /// Forgets pull `id` (its destination may be reused afterwards).
    pub(crate) fn finish_pull(&self, id: u32) {
        self.pulls.lock().remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retained_ranges_are_served_until_acknowledged() {
        let r = Retention::default();
        let a = [1u8, 2, 3];
        let b = [4u8, 5];
        // SAFETY: both ranges are live arrays.
        let waiting = unsafe { r.hold(7, &[(a.as_ptr() as usize, 3), (b.as_ptr() as usize, 2)], 0b110) };
        assert!(waiting.is_empty());
        let mut got = Vec::new();
        assert!(r.with_range(7, 2, 3, |d| got.extend_from_slice(d)));
        assert_eq!(got, vec![3, 4, 5]);
        assert!(!r.with_range(7, 4, 2, |_| {}), "past the end");
        assert!(!r.with_range(8, 0, 1, |_| {}), "unknown op");
        r.ack(7, 1);
        assert!(r.with_range(7, 0, 1, |_| {}));
        r.forget(0b100);
        assert!(!r.with_range(7, 0, 1, |_| {}), "released once everyone is done");
    }

    #[test]
    fn early_requests_wait_for_the_retention() {
        let r = Retention::default();
        let req = Request {
            src: 1,
            id: 3,
            seq: 9,
            offset: 0,
            len: 1,
        };
        assert!(r.queue_if_missing(req, 5).is_none(), "queued");
        let x = [42u8];
        // SAFETY: a live array.
        let due = unsafe { r.hold(9, &[(x.as_ptr() as usize, 1)], 0b10) };
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].src, due[0].id), (1, 3));
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
        let id = unsafe { r.start_pull(2, dst.as_mut_ptr() as usize, 2) };
        assert!(r.land(id, 2, 1, &[7, 7]).is_none(), "overrun");
        assert_eq!(r.pull_state(id), Some(false));
    }
}
