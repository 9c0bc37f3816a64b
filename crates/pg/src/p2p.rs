//! Point-to-point messaging over the peer sockets.
//!
//! Matching is FIFO per (group, source); tags are ignored. Sends write whole
//! messages from the calling thread (GIL released by the bindings); the
//! peer's reader thread always drains, so sends never deadlock. The reader
//! lands data directly in a posted receive buffer or, if none is posted yet,
//! in an "unexpected" buffer that a later receive copies from.

use crate::completion::Completion;
use crate::group::Shared;
use crate::link::PeerLink;
use crate::wire::{Hdr, KIND_P2P};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::Read;
use std::sync::Arc;

/// Largest P2P message accepted from a peer (a larger header is treated as a
/// protocol error and closes the link).
const MAX_MESSAGE: usize = 1 << 40;

/// A receive posted by the user.
pub struct PostedRecv {
    ptr: usize,
    len: usize,
    done: Arc<Completion>,
}

#[derive(Default)]
struct SrcQueue {
    posted: VecDeque<PostedRecv>,
    unexpected: VecDeque<Vec<u8>>,
}

/// Per-group P2P matching state.
pub struct P2p {
    st: Mutex<P2pState>,
}

struct P2pState {
    per_src: Vec<SrcQueue>,
    any: VecDeque<PostedRecv>,
}

/// A message currently being read by a reader thread.
pub enum RxMessage {
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

impl P2p {
    /// Matching state for `capacity` slots.
    pub fn new(capacity: usize) -> Self {
        P2p {
            st: Mutex::new(P2pState {
                per_src: (0..capacity).map(|_| SrcQueue::default()).collect(),
                any: VecDeque::new(),
            }),
        }
    }
}

impl P2p {
    /// Slots that posted receives wait on (every slot for an any-source receive).
    pub fn waited_mask(&self, capacity: usize) -> u64 {
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
}

fn mismatch(expected: usize, got: u64, src: usize) -> String {
    format!("recv size mismatch: posted {expected} bytes but rank {src} sent {got} bytes")
}

fn deliver(buf: &[u8], recv: PostedRecv, src: usize) {
    recv.done.set_source(src);
    if buf.len() != recv.len {
        recv.done
            .complete(Some(mismatch(recv.len, buf.len() as u64, src)), 0);
        return;
    }
    // SAFETY: the Python Work keeps the destination tensor alive until done.
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), recv.ptr as *mut u8, buf.len()) };
    recv.done.complete(None, 0);
}

/// Posts a receive from `src` (or from any source when `src` is `None`).
pub fn post_recv(
    shared: &Shared,
    src: Option<usize>,
    ptr: usize,
    len: usize,
    done: Arc<Completion>,
) {
    let recv = PostedRecv { ptr, len, done };
    let mut st = shared.p2p.st.lock();
    match src {
        Some(s) => {
            let Some(q) = st.per_src.get_mut(s) else {
                recv.done
                    .complete(Some(format!("recv from invalid rank {s}")), 0);
                return;
            };
            if let Some(buf) = q.unexpected.pop_front() {
                drop(st);
                deliver(&buf, recv, s);
                return;
            }
            if shared.peer_dead(s) {
                drop(st);
                recv.done.set_source(s);
                shared.after_op(1u64 << s);
                recv.done.complete(None, 1u64 << s);
                return;
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
                return;
            }
            st.any.push_back(recv);
        }
    }
}

/// Sends one message to `link` from the calling thread.
pub fn send(link: &PeerLink, frame: usize, data: &[u8]) -> std::io::Result<()> {
    let _g = link.p2p_lock.lock();
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

/// Reader-thread handler for one P2P frame. Returns false on a broken stream.
pub fn on_frame(
    shared: &Shared,
    link: &PeerLink,
    hdr: &Hdr,
    r: &mut impl Read,
    cur: &mut Option<RxMessage>,
) -> bool {
    let src = link.slot;
    if hdr.offset == 0 {
        let mut st = shared.p2p.st.lock();
        let posted = match st.per_src.get_mut(src).and_then(|q| q.posted.pop_front()) {
            Some(p) => Some(p),
            None => st.any.pop_front(),
        };
        drop(st);
        *cur = Some(match posted {
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
                // SAFETY: in bounds of the posted buffer, kept alive by the Work.
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
                let mut st = shared.p2p.st.lock();
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

/// Fails every receive waiting on `src` after its connection broke.
pub fn fail_peer(shared: &Shared, src: usize, cur: &mut Option<RxMessage>) {
    let current = match cur.take() {
        Some(RxMessage::Posted { recv, .. }) => Some(recv),
        _ => None,
    };
    let mut pending: Vec<PostedRecv> = {
        let mut st = shared.p2p.st.lock();
        match st.per_src.get_mut(src) {
            Some(q) => q.posted.drain(..).collect(),
            None => Vec::new(),
        }
    };
    pending.splice(0..0, current);
    if !pending.is_empty() {
        shared.after_op(1u64 << src);
    }
    for p in pending {
        p.done.set_source(src);
        p.done.complete(None, 1u64 << src);
    }
}

/// Fails every pending receive (shutdown).
pub fn fail_all(shared: &Shared) {
    let pending: Vec<PostedRecv> = {
        let mut st = shared.p2p.st.lock();
        let mut v: Vec<PostedRecv> = st.any.drain(..).collect();
        for q in st.per_src.iter_mut() {
            v.extend(q.posted.drain(..));
        }
        v
    };
    for p in pending {
        p.done
            .complete(Some("process group has been shut down".into()), 0);
    }
}
