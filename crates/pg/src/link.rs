//! One peer connection within a group: the TCP socket (control, P2P and
//! collective data when shm is not used), the optional shared-memory ring
//! pair, liveness flags, and the reader thread that drains the socket.

use crate::p2p::{self, RxMessage};
use crate::shm::{Segment, PIECE};
use crate::wire::{
    self, Hdr, KIND_ABORT, KIND_BYE, KIND_COLL, KIND_MAPPED, KIND_P2P, KIND_PING, KIND_PONG,
};
use crate::{fault, group::Shared};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::{BufReader, Read};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Monotonic nanoseconds since the first call in this process.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Shared-memory rings used with one peer.
pub struct ShmPair {
    /// The peer's segment (we push into our ring there).
    pub peer: Arc<Segment>,
    /// Our segment (we pop from the peer's ring here).
    pub own: Arc<Segment>,
}

/// State of a connection to one peer slot.
pub struct PeerLink {
    /// The peer's slot.
    pub slot: usize,
    /// Our own slot.
    pub my_slot: usize,
    /// The peer's member id.
    pub member_id: u64,
    writer: Mutex<TcpStream>,
    /// Clone of the socket used to close it while a write may hold `writer`.
    closer: TcpStream,
    /// Torch group id (for fault rules).
    group: Arc<str>,
    /// When the last frame from the peer arrived (`now_ns`).
    last_rx: AtomicU64,
    /// When the last frame to the peer was fully written (`now_ns`).
    last_tx: AtomicU64,
    /// Serialises whole P2P messages from several user threads.
    pub p2p_lock: Mutex<()>,
    coll_rx: Mutex<VecDeque<(Hdr, Vec<u8>)>>,
    pool: Mutex<Vec<Vec<u8>>>,
    shm: OnceLock<ShmPair>,
    dead: AtomicBool,
    bye: AtomicBool,
    /// 0 = no MAPPED received, 1 = peer mapped our segment, 2 = peer could not.
    pub mapped: AtomicU8,
    abort_seq: AtomicU64,
}

/// What the front of a collective channel holds.
pub struct Front {
    /// Piece header.
    pub hdr: Hdr,
    /// Piece payload, valid until `pop`.
    pub data: *const u8,
}

impl PeerLink {
    /// Wraps a connected socket (`closer` is a clone of it).
    pub fn new(
        slot: usize,
        my_slot: usize,
        member_id: u64,
        stream: TcpStream,
        closer: TcpStream,
        group: Arc<str>,
    ) -> Self {
        let now = now_ns();
        PeerLink {
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
            pool: Mutex::new(Vec::new()),
            shm: OnceLock::new(),
            dead: AtomicBool::new(false),
            bye: AtomicBool::new(false),
            mapped: AtomicU8::new(0),
            abort_seq: AtomicU64::new(0),
        }
    }

    /// Switches collective data to shared memory.
    pub fn attach_shm(&self, pair: ShmPair) {
        let _ = self.shm.set(pair);
    }

    /// True when collective data uses shared memory.
    pub fn uses_shm(&self) -> bool {
        self.shm.get().is_some()
    }

    /// The peer crashed, closed, or was fenced.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Declares the peer failed.
    pub fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// True if the peer said goodbye (orderly shutdown).
    pub fn said_bye(&self) -> bool {
        self.bye.load(Ordering::Acquire)
    }

    /// True if the peer aborted collective `seq`.
    pub fn aborted(&self, seq: u64) -> bool {
        self.abort_seq.load(Ordering::Acquire) == seq + 1
    }

    /// Writes one control or data frame on the socket.
    pub fn write_frame(&self, hdr: &Hdr, payload: &[u8]) -> std::io::Result<()> {
        fault::delay(&self.group, self.slot);
        let mut w = self.writer.lock();
        wire::write_frame(&mut *w, hdr, payload)?;
        self.last_tx.store(now_ns(), Ordering::Relaxed);
        Ok(())
    }

    /// Writes a control frame unless another thread is writing (whose
    /// frames prove liveness just as well). Returns whether it was written.
    pub fn try_write_ctrl(&self, kind: u8) -> bool {
        let Some(mut w) = self.writer.try_lock() else {
            return false;
        };
        let hdr = Hdr {
            kind,
            ..Default::default()
        };
        wire::write_frame(&mut *w, &hdr, &[]).is_ok()
    }

    /// True while a thread is writing to the socket.
    pub fn writing(&self) -> bool {
        self.writer.is_locked()
    }

    /// Latest sign of life: a frame received from, or fully written to, the peer.
    pub fn last_heard_ns(&self) -> u64 {
        self.last_rx
            .load(Ordering::Relaxed)
            .max(self.last_tx.load(Ordering::Relaxed))
    }

    /// Closes the socket in both directions (the reader then exits, and a
    /// write blocked on a stalled peer returns an error).
    pub fn close(&self) {
        let _ = self.closer.shutdown(Shutdown::Both);
    }

    /// Declares the peer failed and closes the link (fencing).
    pub fn fence(&self) {
        self.mark_dead();
        self.close();
    }

    /// Pushes one collective piece. `Ok(false)`: ring full, retry later.
    pub fn send_piece(&self, hdr: &Hdr, data: &[u8]) -> std::io::Result<bool> {
        if let Some(p) = self.shm.get() {
            fault::delay(&self.group, self.slot);
            let Some(ring) = p.peer.ring(self.my_slot) else {
                return Err(std::io::Error::other("peer segment too small"));
            };
            return Ok(match ring.try_push(hdr, data) {
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
    pub fn peek(&self) -> Option<Front> {
        if let Some(p) = self.shm.get() {
            let ring = p.own.ring(self.slot)?;
            return ring.peek().map(|pc| Front {
                hdr: pc.hdr,
                data: pc.data,
            });
        }
        let q = self.coll_rx.lock();
        q.front().map(|(h, v)| Front {
            hdr: *h,
            data: v.as_ptr(),
        })
    }

    /// Releases the front collective piece.
    pub fn pop(&self) {
        if let Some(p) = self.shm.get() {
            if let Some(ring) = p.own.ring(self.slot) {
                if ring.pop() <= crate::shm::Ring::WAKE_AT {
                    p.peer.bell().ring();
                }
            }
            return;
        }
        let v = self.coll_rx.lock().pop_front();
        if let Some((_, buf)) = v {
            let mut pool = self.pool.lock();
            if pool.len() < 32 {
                pool.push(buf);
            }
        }
    }

    fn take_buf(&self, len: usize) -> Vec<u8> {
        let mut b = self.pool.lock().pop().unwrap_or_default();
        b.clear();
        b.resize(len, 0);
        b
    }
}

/// Reader thread body: drains the socket until EOF or error.
pub fn reader_loop(shared: Arc<Shared>, link: Arc<PeerLink>, stream: TcpStream) {
    let mut r = BufReader::with_capacity(64 * 1024, stream);
    let mut rx_msg: Option<RxMessage> = None;
    while let Ok(hdr) = Hdr::read_from(&mut r) {
        fault::park_if_frozen();
        link.last_rx.store(now_ns(), Ordering::Relaxed);
        let ok = match hdr.kind {
            KIND_PING => {
                link.try_write_ctrl(KIND_PONG);
                true
            }
            KIND_PONG => true,
            KIND_COLL if hdr.len as usize <= PIECE => {
                let mut buf = link.take_buf(hdr.len as usize);
                let ok = r.read_exact(&mut buf).is_ok();
                if ok {
                    link.coll_rx.lock().push_back((hdr, buf));
                    shared.bell().ring();
                }
                ok
            }
            KIND_P2P => p2p::on_frame(&shared, &link, &hdr, &mut r, &mut rx_msg),
            KIND_MAPPED => {
                link.mapped
                    .store(if hdr.aux == 1 { 1 } else { 2 }, Ordering::Release);
                shared.notify_ctrl();
                true
            }
            KIND_ABORT => {
                link.abort_seq.fetch_max(hdr.seq + 1, Ordering::AcqRel);
                shared.bell().ring();
                true
            }
            KIND_BYE => {
                link.bye.store(true, Ordering::Release);
                true
            }
            _ => false,
        };
        if !ok {
            break;
        }
    }
    link.mark_dead();
    p2p::fail_peer(&shared, link.slot, &mut rx_msg);
    shared.bell().ring();
    shared.notify_ctrl();
}
