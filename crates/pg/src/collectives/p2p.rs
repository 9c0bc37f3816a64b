//! Point-to-point messaging over the peer sockets: FIFO per (group,
//! source), tags ignored.
//!
//! Sends write whole messages from the calling thread (GIL released by the
//! bindings); the peer's reader thread always drains, so writing never
//! deadlocks. The reader lands data directly in a posted receive buffer or,
//! if none is posted yet, in an "unexpected" buffer that a later receive
//! copies from. A send succeeds when a receive took its message, not when
//! the message reached the peer: the peer acknowledges a message once a
//! receive consumed it, so a message left unconsumed by a peer that then
//! fails is a failed send (as with upstream's receiver-granted credits).
//! This module only matches and copies: completing a receive whose peer
//! failed (and what that does to the group) is the caller's job.

use crate::completion::Completion;
use crate::error::PgError;
use crate::transport::link::PeerLink;
use crate::transport::wire::{Hdr, KIND_P2P};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::Read;
use std::sync::Arc;

/// The sender's side of a message: told once a receive consumed it.
pub(crate) trait Ack: Send + Sync {
    /// A receive took one more message from this sender (in order).
    fn consumed(&self);
}

impl Ack for PeerLink {
    fn consumed(&self) {
        self.received_message();
    }
}

/// A message that arrived before any receive was posted for it, with the
/// connection that acknowledges it once a receive takes it.
struct Buffered {
    data: Vec<u8>,
    ack: Arc<dyn Ack>,
}

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
    unexpected: VecDeque<Buffered>,
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

/// What became of a posted receive.
pub(crate) enum PostOutcome {
    /// Waiting for its message.
    Queued,
    /// Took a buffered message (now acknowledged) and completed.
    Delivered,
    /// Its source is known dead: handed back for the caller to fail.
    Dead(PostedRecv),
}

fn mismatch(expected: usize, got: u64, src: usize) -> PgError {
    PgError::RecvSizeMismatch {
        posted: expected,
        src,
        sent: got,
    }
}

/// Completes `recv` with the buffered message `msg` from `src`: the
/// message is consumed (and acknowledged to its sender) whether or not its
/// size matches.
fn deliver(msg: Buffered, recv: PostedRecv, src: usize) {
    recv.done.set_source(src);
    let buf = &msg.data;
    if buf.len() != recv.len {
        msg.ack.consumed();
        recv.done
            .complete(Some(mismatch(recv.len, buf.len() as u64, src)), 0);
        return;
    }
    // SAFETY: `PostedRecv::new` guarantees `ptr` is writable for `len`
    // (= buf.len()) bytes until `done` completes, which happens just below.
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), recv.ptr as *mut u8, buf.len()) };
    // Acknowledged before the receive completes, so the sender's wait is
    // not behind the receiver's wakeup.
    msg.ack.consumed();
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
    /// A message already buffered is delivered at once. Hands the receive
    /// back when `src` is known dead (`peer_dead`, checked under the
    /// matching lock so that it cannot race with [`P2p::take_pending`]); the
    /// caller completes it as failed.
    pub(crate) fn post_recv(
        &self,
        src: Option<usize>,
        recv: PostedRecv,
        peer_dead: impl FnOnce(usize) -> bool,
    ) -> PostOutcome {
        let mut st = self.st.lock();
        match src {
            Some(s) => {
                let Some(q) = st.per_src.get_mut(s) else {
                    return PostOutcome::Dead(recv);
                };
                if let Some(msg) = q.unexpected.pop_front() {
                    drop(st);
                    deliver(msg, recv, s);
                    return PostOutcome::Delivered;
                }
                if peer_dead(s) {
                    return PostOutcome::Dead(recv);
                }
                q.posted.push_back(recv);
            }
            None => {
                let found = st
                    .per_src
                    .iter_mut()
                    .enumerate()
                    .find_map(|(i, q)| q.unexpected.pop_front().map(|b| (i, b)));
                if let Some((s, msg)) = found {
                    drop(st);
                    deliver(msg, recv, s);
                    return PostOutcome::Delivered;
                }
                st.any.push_back(recv);
            }
        }
        PostOutcome::Queued
    }

    fn next_posted(&self, src: usize) -> Option<PostedRecv> {
        let mut st = self.st.lock();
        match st.per_src.get_mut(src).and_then(|q| q.posted.pop_front()) {
            Some(p) => Some(p),
            None => st.any.pop_front(),
        }
    }

    /// Reader-thread handler for one P2P frame from `src`, whose connection
    /// `ack` acknowledges consumed messages. Returns false on a broken
    /// stream. A message that completes a posted receive is acknowledged
    /// once its last byte is in, before the receive completes (the sender's
    /// wait is then not behind the receiver's wakeup); one that no receive
    /// waits for is buffered unacknowledged until a receive takes it.
    pub(crate) fn on_frame(
        &self,
        src: usize,
        ack: &Arc<dyn Ack>,
        hdr: &Hdr,
        r: &mut impl Read,
        cur: &mut Option<RxMessage>,
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
            match cur.take() {
                Some(RxMessage::Posted {
                    recv,
                    ok,
                    src,
                    total,
                }) => {
                    ack.consumed();
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
                    let msg = Buffered {
                        data: buf,
                        ack: ack.clone(),
                    };
                    match posted {
                        Some(recv) => {
                            drop(st);
                            deliver(msg, recv, src);
                        }
                        None => {
                            if let Some(q) = st.per_src.get_mut(src) {
                                q.unexpected.push_back(msg);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts acknowledgements, as a peer's send ledger would.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Ack for Count {
        fn consumed(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn acks(c: &Arc<Count>) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    /// Feeds one whole message of `data` from `src` as a single frame.
    fn arrive(p: &P2p, src: usize, ack: &Arc<dyn Ack>, data: &[u8]) {
        let hdr = Hdr {
            kind: KIND_P2P,
            total: data.len() as u64,
            len: data.len() as u32,
            ..Default::default()
        };
        let mut cur = None;
        assert!(p.on_frame(src, ack, &hdr, &mut std::io::Cursor::new(data), &mut cur));
        assert!(cur.is_none());
    }

    fn post(p: &P2p, src: Option<usize>, buf: &mut [u8]) -> (Arc<Completion>, PostOutcome) {
        let done = Arc::new(Completion::new());
        // SAFETY: `buf` outlives every use below, and each test checks the
        // completion before reading it.
        let recv = unsafe { PostedRecv::new(buf.as_mut_ptr() as usize, buf.len(), done.clone()) };
        let out = p.post_recv(src, recv, |_| false);
        (done, out)
    }

    #[test]
    fn a_message_is_acknowledged_only_once_a_receive_takes_it() {
        let p = P2p::new(3);
        let count = Arc::new(Count::default());
        let ack: Arc<dyn Ack> = count.clone();
        // Arrived before any receive: buffered, not acknowledged (a peer
        // that fails now leaves the sender's send failed).
        arrive(&p, 1, &ack, &[7, 8]);
        arrive(&p, 1, &ack, &[9, 10]);
        assert_eq!(acks(&count), 0);
        let mut a = [0u8; 2];
        let (done, out) = post(&p, Some(1), &mut a);
        assert!(matches!(out, PostOutcome::Delivered));
        assert!(done.is_done() && done.snapshot().error.is_none());
        assert_eq!((a, acks(&count)), ([7, 8], 1));
        // Any-source receives take buffered messages in order too.
        let mut b = [0u8; 2];
        let (done, out) = post(&p, None, &mut b);
        assert!(matches!(out, PostOutcome::Delivered));
        assert_eq!((b, acks(&count), done.snapshot().source), ([9, 10], 2, 1));
        // Posted first: acknowledged when its last byte lands.
        let mut c = [0u8; 3];
        let (done, out) = post(&p, Some(2), &mut c);
        assert!(matches!(out, PostOutcome::Queued));
        assert!(!done.is_done());
        arrive(&p, 2, &ack, &[1, 2, 3]);
        assert!(done.is_done());
        assert_eq!((c, acks(&count)), ([1, 2, 3], 3));
        // A size mismatch still consumes the message (the receive fails).
        arrive(&p, 1, &ack, &[5]);
        let mut d = [0u8; 4];
        let (done, _) = post(&p, Some(1), &mut d);
        assert!(done.snapshot().error.is_some());
        assert_eq!(acks(&count), 4);
    }

    #[test]
    fn each_message_is_acknowledged_on_its_own_connection() {
        let p = P2p::new(3);
        let (one, two) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let (a1, a2): (Arc<dyn Ack>, Arc<dyn Ack>) = (one.clone(), two.clone());
        arrive(&p, 1, &a1, &[1]);
        arrive(&p, 2, &a2, &[2]);
        let mut x = [0u8; 1];
        let _ = post(&p, Some(2), &mut x);
        assert_eq!((x[0], acks(&one), acks(&two)), (2, 0, 1));
        // A known-dead source hands the receive back, and its buffered
        // message stays unacknowledged once the source is reset.
        p.reset_source(1);
        let done = Arc::new(Completion::new());
        // SAFETY: `x` outlives the call; the receive is handed back unused.
        let recv = unsafe { PostedRecv::new(x.as_mut_ptr() as usize, 1, done) };
        assert!(matches!(
            p.post_recv(Some(1), recv, |_| true),
            PostOutcome::Dead(_)
        ));
        assert_eq!(acks(&one), 0);
    }
}
