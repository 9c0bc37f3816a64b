//! One peer connection within a group: the TCP socket (control, P2P and
//! collective data when shm is not used), the optional shared-memory ring
//! pair and the liveness flags. The thread that drains the socket lives in
//! `reader`; this module knows nothing about the group around it.

use crate::clock::Clock;
use crate::completion::Completion;
use crate::fault;
use crate::transport::shm::{Segment, PIECE};
use crate::transport::wire::{self, Hdr};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

/// Shared-memory rings used with one peer.
pub(crate) struct ShmPair {
    /// The peer's segment (we push into our ring there).
    pub(crate) peer: Arc<Segment>,
    /// Our segment (we pop from the peer's ring here).
    pub(crate) own: Arc<Segment>,
}

/// TCP piece buffers a link keeps for reuse: enough for a 16 MiB message
/// queued whole (a large reduction's pieces arrive faster than they are
/// reduced when the cores are shared), so a steady loop of large ops
/// allocates, zero-fills and faults in no fresh piece buffers.
const POOLED_PIECES: usize = (16 << 20) / PIECE;

/// State of a connection to one peer slot.
pub(crate) struct PeerLink {
    /// The peer's slot.
    pub(crate) slot: usize,
    /// Our own slot.
    pub(crate) my_slot: usize,
    /// The peer's member id.
    pub(crate) member_id: u64,
    writer: Mutex<TcpStream>,
    /// Clone of the socket used to close it while a write may hold `writer`.
    closer: TcpStream,
    /// Torch group id (for fault rules).
    group: Arc<str>,
    /// The clock `last_rx` and `last_tx` are read on.
    clock: Arc<dyn Clock>,
    /// When the last frame from the peer arrived (`clock`).
    last_rx: AtomicU64,
    /// When the last frame to the peer was fully written (`clock`).
    last_tx: AtomicU64,
    /// Serialises whole P2P messages from several user threads.
    pub(crate) p2p_lock: Mutex<()>,
    coll_rx: Mutex<VecDeque<(Hdr, Rx)>>,
    /// A receive buffer the executor lent to the reader (see [`Landing`]).
    landing: Mutex<LandingSlot>,
    /// Signalled when the reader stops writing into the landing buffer.
    landing_free: Condvar,
    pool: Mutex<Vec<Vec<u8>>>,
    shm: OnceLock<ShmPair>,
    dead: AtomicBool,
    bye: AtomicBool,
    /// 0 = no MAPPED received, 1 = peer mapped our segment, 2 = peer could not.
    pub(crate) mapped: AtomicU8,
    /// Our MAPPED: 0 = not sent, 1 = we mapped the peer's segment, 2 = we could not.
    shm_sent: AtomicU8,
    /// Some thread took our side of the negotiation ([`PeerLink::claim_offer`]).
    offer_claimed: AtomicBool,
    /// The peer's segment, mapped, until both sides agreed to use it.
    shm_pending: Mutex<Option<Arc<Segment>>>,
    abort_seq: AtomicU64,
    /// Sends written to this link and not yet acknowledged, by message
    /// number (a send succeeds when the peer acknowledges it, which it
    /// does once a receive took the message; not when its bytes are handed
    /// to the socket).
    sends: Mutex<SendLedger>,
    /// P2P messages from the peer that receives consumed (a running count).
    rx_msgs: AtomicU64,
    /// The highest count acknowledged to the peer so far.
    rx_acked: AtomicU64,
}

/// How a queued collective piece holds its payload.
enum Rx {
    /// In a pooled buffer.
    Buf(Vec<u8>),
    /// Already written by the reader into the op's output (a [`Landing`]).
    Landed,
}

/// An op's output range lent to this link's reader: the payload of every
/// piece of message `(seq, tag)` with signature `sig` and total `len` is
/// read from the socket straight into `ptr + offset`, saving the copy out
/// of a pooled buffer. The queue still gets the piece's header, in arrival
/// order, so the executor accounts for it as for a buffered piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Landing {
    /// Collective sequence number.
    pub(crate) seq: u64,
    /// Message tag within the op.
    pub(crate) tag: u32,
    /// Op signature.
    pub(crate) sig: u32,
    /// Output address.
    pub(crate) ptr: usize,
    /// Message length.
    pub(crate) len: usize,
}

#[derive(Default)]
struct LandingSlot {
    lent: Option<Landing>,
    /// The reader is writing into the lent range.
    busy: bool,
}

#[derive(Default)]
struct SendLedger {
    next: u64,
    pending: VecDeque<(u64, Arc<Completion>)>,
}

/// What the front of a collective channel holds.
pub(crate) struct Front {
    /// Piece header.
    pub(crate) hdr: Hdr,
    /// Piece payload, valid until `pop`; null when the payload already
    /// landed in the op's output (see [`Landing`]).
    pub(crate) data: *const u8,
}

impl PeerLink {
    /// Wraps a connected socket (`closer` is a clone of it); its liveness
    /// is measured on `clock`.
    pub(crate) fn new(
        slot: usize,
        my_slot: usize,
        member_id: u64,
        stream: TcpStream,
        closer: TcpStream,
        group: Arc<str>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let now = clock.now_ns();
        PeerLink {
            clock,
            slot,
            my_slot,
            member_id,
            writer: Mutex::new(stream),
            closer,
            group,
            last_rx: AtomicU64::new(now),
            last_tx: AtomicU64::new(now),
            p2p_lock: Mutex::new(()),
            coll_rx: Mutex::new(VecDeque::new()),
            landing: Mutex::new(LandingSlot::default()),
            landing_free: Condvar::new(),
            pool: Mutex::new(Vec::new()),
            shm: OnceLock::new(),
            dead: AtomicBool::new(false),
            bye: AtomicBool::new(false),
            mapped: AtomicU8::new(0),
            shm_sent: AtomicU8::new(0),
            offer_claimed: AtomicBool::new(false),
            shm_pending: Mutex::new(None),
            abort_seq: AtomicU64::new(0),
            sends: Mutex::new(SendLedger::default()),
            rx_msgs: AtomicU64::new(0),
            rx_acked: AtomicU64::new(0),
        }
    }

    /// Records our side of the shared-memory negotiation: `peer` is the
    /// peer's segment if we mapped it. The caller then sends MAPPED.
    pub(crate) fn offer_shm(&self, peer: Option<Arc<Segment>>) {
        let ok = peer.is_some();
        *self.shm_pending.lock() = peer;
        self.shm_sent
            .store(if ok { 1 } else { 2 }, Ordering::Release);
    }

    /// Switches collective data to shared memory once both sides mapped the
    /// other's segment (called after either side's MAPPED; idempotent).
    pub(crate) fn try_attach_shm(&self, own: &Arc<Segment>) {
        let mut pending = self.shm_pending.lock();
        if self.shm_sent.load(Ordering::Acquire) == 1 && self.mapped.load(Ordering::Acquire) == 1 {
            if let Some(peer) = pending.take() {
                let _ = self.shm.set(ShmPair {
                    peer,
                    own: own.clone(),
                });
            }
        }
    }

    /// Claims our side of the shared-memory negotiation: true for exactly
    /// one caller per link. Both the thread that attaches an incoming link
    /// and `connect` offer; a second offer would clear the ring again after
    /// the peer may already have pushed into it (its piece lost, the op
    /// hung), so only the claimer offers.
    pub(crate) fn claim_offer(&self) -> bool {
        !self.offer_claimed.swap(true, Ordering::AcqRel)
    }

    /// The shared-memory negotiation is over: both MAPPED exchanged and, if
    /// both agreed, the rings attached. Only then may collective data flow.
    pub(crate) fn settled(&self) -> bool {
        let sent = self.shm_sent.load(Ordering::Acquire);
        let got = self.mapped.load(Ordering::Acquire);
        sent != 0 && got != 0 && !(sent == 1 && got == 1 && !self.uses_shm())
    }

    /// True when collective data uses shared memory.
    pub(crate) fn uses_shm(&self) -> bool {
        self.shm.get().is_some()
    }

    /// The peer crashed, closed, or was fenced.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Declares the peer failed.
    pub(crate) fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// True if the peer said goodbye (orderly shutdown).
    pub(crate) fn said_bye(&self) -> bool {
        self.bye.load(Ordering::Acquire)
    }

    /// True if the peer aborted collective `seq`.
    pub(crate) fn aborted(&self, seq: u64) -> bool {
        self.abort_seq.load(Ordering::Acquire) == seq + 1
    }

    /// Writes one control or data frame on the socket.
    pub(crate) fn write_frame(&self, hdr: &Hdr, payload: &[u8]) -> std::io::Result<()> {
        fault::delay(&self.group, self.slot);
        let mut w = self.writer.lock();
        let res = wire::write_frame(&mut *w, hdr, payload);
        drop(w);
        self.flush_acks();
        res?;
        self.last_tx.store(self.clock.now_ns(), Ordering::Relaxed);
        Ok(())
    }

    /// Registers a send of the next P2P message on this link (call with
    /// `p2p_lock` held, before its first frame is written): it completes
    /// when the peer acknowledges that message, or fails with the link.
    pub(crate) fn register_send(&self, done: Arc<Completion>) {
        let mut l = self.sends.lock();
        l.next += 1;
        let n = l.next;
        l.pending.push_back((n, done));
    }

    /// The peer acknowledged every message up to number `upto`: those sends
    /// succeeded.
    pub(crate) fn acked(&self, upto: u64) {
        let mut done = Vec::new();
        {
            let mut l = self.sends.lock();
            while l.pending.front().is_some_and(|(n, _)| *n <= upto) {
                if let Some((_, d)) = l.pending.pop_front() {
                    done.push(d);
                }
            }
        }
        for d in done {
            d.complete(None, 0);
        }
    }

    /// Takes the sends still waiting for an acknowledgement (the link
    /// failed or is shutting down; the caller fails them).
    pub(crate) fn take_sends(&self) -> Vec<Arc<Completion>> {
        self.sends
            .lock()
            .pending
            .drain(..)
            .map(|(_, d)| d)
            .collect()
    }

    /// Whether sends wait for this peer's acknowledgement.
    pub(crate) fn sends_pending(&self) -> bool {
        !self.sends.lock().pending.is_empty()
    }

    /// A receive consumed one more P2P message from the peer (they are
    /// consumed in the order sent): acknowledge it.
    pub(crate) fn received_message(&self) {
        self.rx_msgs.fetch_add(1, Ordering::SeqCst);
        self.flush_acks();
    }

    /// Sends the acknowledgement count if it moved. Acknowledgements are
    /// cumulative, so none is lost when the writer is busy: whoever holds
    /// the writer flushes after releasing it (every write path calls this),
    /// and a reader never blocks on its own socket to acknowledge.
    fn flush_acks(&self) {
        // Pairs with the count's increment: a reader that found the writer
        // busy, and the holder releasing it, cannot both miss the other.
        std::sync::atomic::fence(Ordering::SeqCst);
        while self.rx_msgs.load(Ordering::SeqCst) > self.rx_acked.load(Ordering::SeqCst) {
            let Some(mut w) = self.writer.try_lock() else {
                return;
            };
            let upto = self.rx_msgs.load(Ordering::SeqCst);
            let hdr = Hdr {
                kind: wire::KIND_P2P_ACK,
                seq: upto,
                ..Default::default()
            };
            let ok = wire::write_frame(&mut *w, &hdr, &[]).is_ok();
            self.rx_acked.store(upto, Ordering::SeqCst);
            drop(w);
            if !ok {
                return;
            }
        }
    }

    /// Writes a control frame (carrying `seq`: a watermark for PONGs)
    /// unless another thread is writing (whose frames prove liveness just as
    /// well). Returns whether it was written.
    pub(crate) fn try_write_ctrl(&self, kind: u8, seq: u64) -> bool {
        let Some(mut w) = self.writer.try_lock() else {
            return false;
        };
        let hdr = Hdr {
            kind,
            seq,
            ..Default::default()
        };
        let ok = wire::write_frame(&mut *w, &hdr, &[]).is_ok();
        drop(w);
        self.flush_acks();
        ok
    }

    /// True while a thread is writing to the socket.
    pub(crate) fn writing(&self) -> bool {
        self.writer.is_locked()
    }

    /// Latest sign of life: a frame received from, or fully written to, the peer.
    pub(crate) fn last_heard_ns(&self) -> u64 {
        self.last_rx
            .load(Ordering::Relaxed)
            .max(self.last_tx.load(Ordering::Relaxed))
    }

    /// Closes the socket in both directions (the reader then exits, and a
    /// write blocked on a stalled peer returns an error).
    pub(crate) fn close(&self) {
        let _ = self.closer.shutdown(Shutdown::Both);
    }

    /// Declares the peer failed and closes the link (fencing).
    pub(crate) fn fence(&self) {
        self.mark_dead();
        self.close();
    }

    /// Pushes one collective piece. `Ok(false)`: ring full, retry later.
    /// `stream`: the piece belongs to a large message, so a shared-memory
    /// push bypasses this core's cache (see [`crate::transport::copy::STREAM_MIN_MESSAGE`]).
    pub(crate) fn send_piece(&self, hdr: &Hdr, data: &[u8], stream: bool) -> std::io::Result<bool> {
        if let Some(p) = self.shm.get() {
            fault::delay(&self.group, self.slot);
            let Some(ring) = p.peer.ring(self.my_slot) else {
                return Err(std::io::Error::other("peer segment too small"));
            };
            return Ok(match ring.try_push(hdr, data, stream) {
                Some(was_empty) => {
                    if was_empty {
                        p.peer.bell().ring();
                    }
                    true
                }
                None => false,
            });
        }
        self.write_frame(hdr, data).map(|_| true)
    }

    /// The front collective piece from this peer, if any.
    pub(crate) fn peek(&self) -> Option<Front> {
        if let Some(p) = self.shm.get() {
            let ring = p.own.ring(self.slot)?;
            return ring.peek().map(|pc| Front {
                hdr: pc.hdr,
                data: pc.data,
            });
        }
        let q = self.coll_rx.lock();
        q.front().map(|(h, rx)| Front {
            hdr: *h,
            data: match rx {
                Rx::Buf(v) => v.as_ptr(),
                Rx::Landed => std::ptr::null(),
            },
        })
    }

    /// Releases the front collective piece.
    pub(crate) fn pop(&self) {
        if let Some(p) = self.shm.get() {
            if let Some(ring) = p.own.ring(self.slot) {
                if ring.pop() <= crate::transport::shm::Ring::WAKE_AT {
                    p.peer.bell().ring();
                }
            }
            return;
        }
        let v = self.coll_rx.lock().pop_front();
        if let Some((_, Rx::Buf(buf))) = v {
            let mut pool = self.pool.lock();
            if pool.len() < POOLED_PIECES {
                pool.push(buf);
            }
        }
    }

    /// A pooled buffer of `len` bytes for an incoming TCP piece. Its bytes
    /// are whatever the buffer last held (the caller overwrites all of
    /// them); only growth is zero-filled, so a reused buffer costs no
    /// memset of the whole piece.
    pub(crate) fn take_buf(&self, len: usize) -> Vec<u8> {
        let mut b = self.pool.lock().pop().unwrap_or_default();
        b.resize(len, 0);
        b
    }

    /// Queues a collective piece that arrived over TCP.
    pub(crate) fn push_coll(&self, hdr: Hdr, buf: Vec<u8>) {
        self.coll_rx.lock().push_back((hdr, Rx::Buf(buf)));
    }

    /// Queues the header of a piece whose payload landed in the op's
    /// output ([`PeerLink::claim_landing`]).
    pub(crate) fn push_landed(&self, hdr: Hdr) {
        self.coll_rx.lock().push_back((hdr, Rx::Landed));
    }

    /// Lends `to` to the reader (the executor, for one receive of the
    /// running op; one at a time per link). Pieces already queued stay
    /// queued; later ones of that message land in `to`.
    ///
    /// # Safety
    /// `to.ptr` must stay valid for writes of `to.len` bytes, and be neither
    /// read nor written by anyone else, until [`PeerLink::withdraw_landing`]
    /// returns.
    pub(crate) unsafe fn lend_landing(&self, to: Landing) {
        let mut l = self.landing.lock();
        while l.busy {
            self.landing_free.wait(&mut l);
        }
        l.lent = Some(to);
    }

    /// Takes the lent range back, waiting while the reader writes a piece
    /// into it. A reader still writing after `patience` (its peer stalled
    /// partway through a piece) gets its link fenced, which ends the read.
    /// Returns whether a range was lent.
    pub(crate) fn withdraw_landing(&self, patience: std::time::Duration) -> bool {
        let mut l = self.landing.lock();
        let was = l.lent.take().is_some();
        let deadline = std::time::Instant::now() + patience;
        while l.busy {
            if self.landing_free.wait_until(&mut l, deadline).timed_out() && l.busy {
                // Closing the socket ends the reader's read at once.
                self.fence();
                break;
            }
        }
        while l.busy {
            self.landing_free.wait(&mut l);
        }
        was
    }

    /// Reader side: where the payload of piece `hdr` goes when it belongs
    /// to the lent range, checked to fit inside it; the reader then writes
    /// exactly `hdr.len` bytes there and calls
    /// [`PeerLink::landing_done`]. `None`: buffer the piece as usual.
    pub(crate) fn claim_landing(&self, hdr: &Hdr) -> Option<*mut u8> {
        let mut l = self.landing.lock();
        let to = l.lent?;
        let end = (hdr.offset as usize).checked_add(hdr.len as usize)?;
        let fits = hdr.seq == to.seq
            && hdr.phase == to.tag
            && hdr.aux == to.sig
            && hdr.total == to.len as u64
            && end <= to.len
            && hdr.len > 0;
        if !fits {
            return None;
        }
        l.busy = true;
        Some((to.ptr + hdr.offset as usize) as *mut u8)
    }

    /// Reader side: the write into the lent range is over.
    pub(crate) fn landing_done(&self) {
        self.landing.lock().busy = false;
        self.landing_free.notify_all();
    }

    /// Records that a frame just arrived from the peer.
    pub(crate) fn touch_rx(&self) {
        self.last_rx.store(self.clock.now_ns(), Ordering::Relaxed);
    }

    /// Records the peer's shared-memory answer (`ok`: it mapped our segment).
    pub(crate) fn set_mapped(&self, ok: bool) {
        self.mapped.store(if ok { 1 } else { 2 }, Ordering::Release);
    }

    /// Records that the peer aborted collective `seq`.
    pub(crate) fn set_aborted(&self, seq: u64) {
        self.abort_seq.fetch_max(seq + 1, Ordering::AcqRel);
    }

    /// Records the peer's orderly goodbye.
    pub(crate) fn set_bye(&self) {
        self.bye.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    fn link() -> PeerLink {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let s = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let c = s.try_clone().expect("clone");
        PeerLink::new(
            1,
            0,
            7,
            s,
            c,
            Arc::from("g"),
            Arc::new(crate::clock::Monotonic),
        )
    }

    #[test]
    fn liveness_is_read_on_the_links_clock() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let s = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let c = s.try_clone().expect("clone");
        let clock = Arc::new(crate::clock::Manual::default());
        clock.advance(Duration::from_secs(3));
        let link = PeerLink::new(1, 0, 7, s, c, Arc::from("g"), clock.clone());
        assert_eq!(link.last_heard_ns(), 3_000_000_000, "made at 3 s");
        clock.advance(Duration::from_secs(2));
        assert_eq!(link.last_heard_ns(), 3_000_000_000, "nothing heard since");
        link.touch_rx();
        assert_eq!(link.last_heard_ns(), 5_000_000_000);
        clock.advance(Duration::from_secs(1));
        link.write_frame(&Hdr::default(), &[]).expect("write");
        assert_eq!(link.last_heard_ns(), 6_000_000_000, "a frame fully written");
    }

    /// The whole of `out` as the landing of op `seq`'s message `tag`
    /// (signature `sig`).
    fn landing(seq: u64, tag: u32, sig: u32, out: &mut [u8]) -> Landing {
        Landing {
            seq,
            tag,
            sig,
            ptr: out.as_mut_ptr() as usize,
            len: out.len(),
        }
    }

    fn piece(seq: u64, tag: u32, sig: u32, total: u64, offset: u64, len: u32) -> Hdr {
        Hdr {
            kind: wire::KIND_COLL,
            phase: tag,
            seq,
            total,
            offset,
            len,
            aux: sig,
            ..Default::default()
        }
    }

    #[test]
    fn a_lent_range_takes_only_the_pieces_of_its_message() {
        let l = link();
        let mut out = vec![0u8; 300];
        let base = out.as_mut_ptr() as usize;
        assert!(
            l.claim_landing(&piece(5, 1, 9, 300, 0, 100)).is_none(),
            "nothing lent"
        );
        let to = landing(5, 1, 9, &mut out);
        // SAFETY: `out` outlives the loan (withdrawn below) and nothing
        // else touches it meanwhile.
        unsafe { l.lend_landing(to) };
        for (h, why) in [
            (piece(4, 1, 9, 300, 0, 100), "earlier op"),
            (piece(5, 0, 9, 300, 0, 100), "other message"),
            (piece(5, 1, 8, 300, 0, 100), "other signature"),
            (piece(5, 1, 9, 301, 0, 100), "other total"),
            (piece(5, 1, 9, 300, 250, 51), "past the end"),
            (piece(5, 1, 9, 300, u64::MAX, 2), "offset overflows"),
            (piece(5, 1, 9, 300, 0, 0), "empty"),
        ] {
            assert!(l.claim_landing(&h).is_none(), "{why}");
        }
        let at = l.claim_landing(&piece(5, 1, 9, 300, 200, 100));
        assert_eq!(at, Some((base + 200) as *mut u8));
        l.landing_done();
        assert!(l.withdraw_landing(Duration::from_secs(1)));
        assert!(!l.is_dead());
        assert!(
            l.claim_landing(&piece(5, 1, 9, 300, 0, 100)).is_none(),
            "withdrawn"
        );
        assert!(!l.withdraw_landing(Duration::from_secs(1)), "nothing lent");
    }

    #[test]
    fn withdrawing_waits_for_the_piece_being_landed() {
        use std::sync::atomic::AtomicBool;
        let l = Arc::new(link());
        let mut out = vec![0u8; 64];
        let to = landing(1, 0, 3, &mut out);
        // SAFETY: `out` outlives the loan; only the "reader" below writes it.
        unsafe { l.lend_landing(to) };
        let at = l.claim_landing(&piece(1, 0, 3, 64, 0, 64)).expect("fits");
        let written = Arc::new(AtomicBool::new(false));
        let (l2, w2) = (l.clone(), written.clone());
        let t = std::thread::spawn(move || {
            l2.withdraw_landing(Duration::from_secs(3600));
            w2.load(Ordering::Acquire)
        });
        // SAFETY: the claimed range is 64 bytes of `out`.
        unsafe { std::ptr::write_bytes(at, 7, 64) };
        written.store(true, Ordering::Release);
        l.landing_done();
        assert!(t.join().expect("join"), "withdraw returned mid-piece");
        assert!(!l.is_dead(), "a piece that finished is no stall");
        assert_eq!(out, vec![7u8; 64]);
    }

    #[test]
    fn a_piece_stalled_past_patience_fences_the_link() {
        let l = Arc::new(link());
        let mut out = vec![0u8; 8];
        let to = landing(1, 0, 3, &mut out);
        // SAFETY: `out` outlives the loan; nothing writes it.
        unsafe { l.lend_landing(to) };
        assert!(l.claim_landing(&piece(1, 0, 3, 8, 0, 8)).is_some());
        let l2 = l.clone();
        let t = std::thread::spawn(move || l2.withdraw_landing(Duration::ZERO));
        // The fence is what ends a real reader's read; here the "reader"
        // finishes once it sees it.
        while !l.is_dead() {
            std::thread::yield_now();
        }
        l.landing_done();
        assert!(t.join().expect("join"));
        assert!(l.is_dead());
        assert_eq!(out, vec![0u8; 8]);
    }

    #[test]
    fn exactly_one_thread_claims_the_shm_offer() {
        for _ in 0..50 {
            let l = Arc::new(link());
            let wins: usize = (0..4)
                .map(|_| {
                    let l = l.clone();
                    std::thread::spawn(move || usize::from(l.claim_offer()))
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().expect("join"))
                .sum();
            assert_eq!(wins, 1, "two offers would clear the ring twice");
            assert!(!l.claim_offer(), "a later caller never offers again");
        }
    }
}
