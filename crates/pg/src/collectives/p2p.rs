//! Point-to-point messaging over the peer sockets: FIFO per (group,
//! source), tags ignored, sends never block on a receive.
//!
//! Sends write whole messages from the calling thread (GIL released by the
//! bindings); the peer's reader thread always drains, so sends never
//! deadlock. The reader lands data directly in a posted receive buffer or,
//! if none is posted yet, in an "unexpected" buffer that a later receive
//! copies from. This module only matches and copies: completing a receive
//! whose peer failed (and what that does to the group) is the caller's job.

use crate::completion::Completion;
use crate::error::PgError;
use crate::transport::link::PeerLink;
use crate::transport::wire::{Hdr, KIND_P2P};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::Read;
use std::sync::Arc;

/// Largest P2P message accepted from a peer (a larger header is treated as a
/// protocol error and closes the link).
const MAX_MESSAGE: usize = 1 << 40;

/// A receive posted by the user.
pub(crate) struct PostedRecv {
    ptr: usize,
    len: usize,
    done: Arc<Completion>,
}

impl PostedRecv {
    /// A receive of `len` bytes into `ptr`, reported through `done`.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes until `done` completes.
    pub(crate) unsafe fn new(ptr: usize, len: usize, done: Arc<Completion>) -> Self {
        PostedRecv { ptr, len, done }
    }

    /// Where the receive is reported.
    pub(crate) fn done(&self) -> &Arc<Completion> {
        &self.done
    }
}

#[derive(Default)]
struct SrcQueue {
    posted: VecDeque<PostedRecv>,
    unexpected: VecDeque<Vec<u8>>,
}

/// Per-group P2P matching state.
pub(crate) struct P2p {
    st: Mutex<P2pState>,
}

struct P2pState {
    per_src: Vec<SrcQueue>,
    any: VecDeque<PostedRecv>,
}

/// A message currently being read by a reader thread.
pub(crate) enum RxMessage {
    /// Landing in a posted receive (`ok == false`: size mismatch, discard).
    Posted {
        /// The receive being filled.
        recv: PostedRecv,
        /// False once a size mismatch was seen (payload discarded).
        ok: bool,
        /// Sending slot.
        src: usize,
        /// Announced message size.
        total: u64,
    },
    /// Landing in an unexpected buffer.
    Unexpected {
        /// Buffer the message lands in.
        buf: Vec<u8>,
        /// Sending slot.
        src: usize,
    },
}

fn mismatch(expected: usize, got: u64, src: usize) -> PgError {
    PgError::RecvSizeMismatch {
        posted: expected,
        src,
        sent: got,
    }
}

fn deliver(buf: &[u8], recv: PostedRecv, src: usize) {
    recv.done.set_source(src);
    if buf.len() != recv.len {
        recv.done
            .complete(Some(mismatch(recv.len, buf.len() as u64, src)), 0);
        return;
    }
    // SAFETY: `PostedRecv::new` guarantees `ptr` is writable for `len`
    // (= buf.len()) bytes until `done` completes, which happens just below.
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), recv.ptr as *mut u8, buf.len()) };
    recv.done.complete(None, 0);
}

impl P2p {
    /// Matching state for `capacity` slots.
    pub(crate) fn new(capacity: usize) -> Self {
        P2p {
            st: Mutex::new(P2pState {
                per_src: (0..capacity).map(|_| SrcQueue::default()).collect(),
                any: VecDeque::new(),
            }),
        }
    }

    /// Grows the state to `capacity` slots.
    pub(crate) fn extend(&self, capacity: usize) {
        let mut st = self.st.lock();
        while st.per_src.len() < capacity {
            st.per_src.push(SrcQueue::default());
        }
    }

    /// Forgets what an earlier member of `src` sent and nobody received: a
    /// replacement starts with empty channels.
    pub(crate) fn reset_source(&self, src: usize) {
        if let Some(q) = self.st.lock().per_src.get_mut(src) {
            q.unexpected.clear();
        }
    }

    /// Slots that posted receives wait on (every slot for an any-source receive).
    pub(crate) fn waited_mask(&self, capacity: usize) -> u64 {
        let st = self.st.lock();
        if !st.any.is_empty() {
            return if capacity >= 64 {
                u64::MAX
            } else {
                (1u64 << capacity) - 1
            };
        }
        st.per_src
            .iter()
            .enumerate()
            .filter(|(_, q)| !q.posted.is_empty())
            .fold(0, |m, (i, _)| m | 1u64 << i)
    }

    /// Posts a receive from `src` (or from any source when `src` is `None`).
    /// A message already buffered is delivered at once. Returns the receive
    /// back when `src` is known dead (`peer_dead`, checked under the matching
    /// lock so that it cannot race with [`P2p::take_pending`]); the caller
    /// completes it as failed.
    pub(crate) fn post_recv(
        &self,
        src: Option<usize>,
        recv: PostedRecv,
        peer_dead: impl FnOnce(usize) -> bool,
    ) -> Option<PostedRecv> {
        let mut st = self.st.lock();
        match src {
            Some(s) => {
                let Some(q) = st.per_src.get_mut(s) else {
                    return Some(recv);
                };
                if let Some(buf) = q.unexpected.pop_front() {
                    drop(st);
                    deliver(&buf, recv, s);
                    return None;
                }
                if peer_dead(s) {
                    return Some(recv);
                }
                q.posted.push_back(recv);
            }
            None => {
                let found = st
                    .per_src
                    .iter_mut()
                    .enumerate()
                    .find_map(|(i, q)| q.unexpected.pop_front().map(|b| (i, b)));
                if let Some((s, buf)) = found {
                    drop(st);
                    deliver(&buf, recv, s);
                    return None;
                }
                st.any.push_back(recv);
            }
        }
        None
    }

    fn next_posted(&self, src: usize) -> Option<PostedRecv> {
        let mut st = self.st.lock();
        match st.per_src.get_mut(src).and_then(|q| q.posted.pop_front()) {
            Some(p) => Some(p),
            None => st.any.pop_front(),
        }
    }

    /// Reader-thread handler for one P2P frame from `src`. Returns false on
    /// a broken stream. `arrived` runs once a message's last byte is in,
    /// before its receive completes (it acknowledges the message: the
    /// sender's wait is then not behind the receiver's wakeup).
    pub(crate) fn on_frame(
        &self,
        src: usize,
        hdr: &Hdr,
        r: &mut impl Read,
        cur: &mut Option<RxMessage>,
        arrived: impl FnOnce(),
    ) -> bool {
        if hdr.offset == 0 {
            *cur = Some(match self.next_posted(src) {
                Some(recv) => {
                    recv.done.set_source(src);
                    let ok = recv.len as u64 == hdr.total;
                    RxMessage::Posted {
                        recv,
                        ok,
                        src,
                        total: hdr.total,
                    }
                }
                None => {
                    let Ok(total) = usize::try_from(hdr.total) else {
                        return false;
                    };
                    if total > MAX_MESSAGE {
                        return false;
                    }
                    RxMessage::Unexpected {
                        buf: vec![0u8; total],
                        src,
                    }
                }
            });
        }
        let len = hdr.len as usize;
        let off = hdr.offset as usize;
        if hdr.offset.saturating_add(hdr.len as u64) > hdr.total {
            return false;
        }
        let read_ok = match cur.as_mut() {
            Some(RxMessage::Posted { recv, ok, .. }) => {
                if *ok && off + len <= recv.len {
                    // SAFETY: in bounds of the posted buffer, which
                    // `PostedRecv::new` guarantees writable until completion.
                    let dst =
                        unsafe { std::slice::from_raw_parts_mut((recv.ptr + off) as *mut u8, len) };
                    r.read_exact(dst).is_ok()
                } else {
                    *ok = false;
                    std::io::copy(&mut r.take(len as u64), &mut std::io::sink())
                        .map(|n| n == len as u64)
                        .unwrap_or(false)
                }
            }
            Some(RxMessage::Unexpected { buf, .. }) => match buf.get_mut(off..off + len) {
                Some(dst) => r.read_exact(dst).is_ok(),
                None => false,
            },
            None => false,
        };
        if !read_ok {
            return false;
        }
        if hdr.offset + hdr.len as u64 >= hdr.total {
            arrived();
            match cur.take() {
                Some(RxMessage::Posted {
                    recv,
                    ok,
                    src,
                    total,
                }) => {
                    if ok {
                        recv.done.complete(None, 0);
                    } else {
                        recv.done.complete(Some(mismatch(recv.len, total, src)), 0);
                    }
                }
                Some(RxMessage::Unexpected { buf, src }) => {
                    let mut st = self.st.lock();
                    let posted = match st.per_src.get_mut(src).and_then(|q| q.posted.pop_front()) {
                        Some(p) => Some(p),
                        None => st.any.pop_front(),
                    };
                    match posted {
                        Some(recv) => {
                            drop(st);
                            deliver(&buf, recv, src);
                        }
                        None => {
                            if let Some(q) = st.per_src.get_mut(src) {
                                q.unexpected.push_back(buf);
                            }
                        }
                    }
                }
                None => {}
            }
        }
        true
    }

    /// Takes every receive waiting on `src` (including the one being filled)
    /// after its connection broke; the caller fails them.
    pub(crate) fn take_pending(&self, src: usize, cur: &mut Option<RxMessage>) -> Vec<PostedRecv> {
        let current = match cur.take() {
            Some(RxMessage::Posted { recv, .. }) => Some(recv),
            _ => None,
        };
        let mut pending: Vec<PostedRecv> = {
            let mut st = self.st.lock();
            match st.per_src.get_mut(src) {
                Some(q) => q.posted.drain(..).collect(),
                None => Vec::new(),
            }
        };
        pending.splice(0..0, current);
        pending
    }

    /// Takes every pending receive (shutdown).
    pub(crate) fn take_all(&self) -> Vec<PostedRecv> {
        let mut st = self.st.lock();
        let mut v: Vec<PostedRecv> = st.any.drain(..).collect();
        for q in st.per_src.iter_mut() {
            v.extend(q.posted.drain(..));
        }
        v
    }
}

/// Sends one message to `link` from the calling thread; `done` completes
/// when the peer acknowledges it (see [`PeerLink::register_send`]).
pub(crate) fn send(
    link: &PeerLink,
    frame: usize,
    data: &[u8],
    done: Arc<Completion>,
) -> std::io::Result<()> {
    let _g = link.p2p_lock.lock();
    link.register_send(done);
    let total = data.len() as u64;
    let mut off = 0usize;
    loop {
        let n = frame.min(data.len() - off);
        let hdr = Hdr {
            kind: KIND_P2P,
            total,
            offset: off as u64,
            len: n as u32,
            ..Default::default()
        };
        link.write_frame(&hdr, &data[off..off + n])?;
        off += n;
        if off >= data.len() {
            return Ok(());
        }
    }
}
