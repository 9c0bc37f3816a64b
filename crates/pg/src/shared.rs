//! State shared by one group member's threads (executor, readers, watchdog
//! and the callers' threads): the active mask, the links, the op queue and
//! the doorbells. It sits below every thread body in the module tree; the
//! thread bodies (`executor`, `reader`, `watchdog`, `progress`) use it and
//! `group` owns it.

use crate::completion::Completion;
use crate::config::Config;
use crate::futex::Doorbell;
use crate::link::PeerLink;
use crate::p2p::{P2p, PostedRecv};
use crate::plan::OpKind;
use crate::shm::Segment;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Largest supported capacity (mask width).
pub(crate) const MAX_CAPACITY: usize = 64;

/// A queued collective.
pub(crate) struct Op {
    /// Group sequence number.
    pub(crate) seq: u64,
    /// What to do.
    pub(crate) kind: OpKind,
    /// Piece signature: op kind, dtype and reduce-op codes.
    pub(crate) sig: u32,
    /// Where the result is reported.
    pub(crate) done: Arc<Completion>,
}

/// Peer links indexed by slot.
pub(crate) type Links = Vec<Option<Arc<PeerLink>>>;

/// State shared by the group's threads.
pub(crate) struct Shared {
    /// Our slot.
    pub(crate) rank: usize,
    /// Declared size.
    pub(crate) size: usize,
    /// Reserved capacity.
    pub(crate) capacity: usize,
    /// Joining member that has not joined yet (local-only).
    pub(crate) is_extension: bool,
    /// Clear failed ranks from the mask automatically.
    pub(crate) auto_deactivate: bool,
    /// Hash of the group key (connection preambles).
    pub(crate) key: u64,
    /// Our member id.
    pub(crate) member_id: u64,
    /// Active mask.
    pub(crate) mask: AtomicU64,
    /// Peer links by slot.
    pub(crate) links: RwLock<Arc<Links>>,
    /// Doorbell used when there is no shm segment.
    pub(crate) heap_bell: Doorbell,
    /// Rung when an op is queued (the idle executor sleeps on it).
    pub(crate) submit_bell: Doorbell,
    /// Held by whichever thread is running ops (executor or an inline waiter).
    pub(crate) exec_lock: Mutex<()>,
    /// Our shm segment, if shm is on.
    pub(crate) seg: Option<Arc<Segment>>,
    /// Submitted, not yet started collectives.
    pub(crate) queue: Mutex<VecDeque<Op>>,
    /// Next collective sequence number.
    pub(crate) next_seq: AtomicU64,
    /// Set once shutdown starts.
    pub(crate) shutdown: AtomicBool,
    /// P2P matching state.
    pub(crate) p2p: P2p,
    /// Counter bumped by control frames (MAPPED, link death).
    pub(crate) ctrl: Mutex<u64>,
    /// Signalled with `ctrl`.
    pub(crate) ctrl_cv: Condvar,
    /// Registered int32 mask mirror `(address, elements)`.
    pub(crate) mask_out: Mutex<Option<(usize, usize)>>,
    /// Bounded spin before sleeping, in µs.
    pub(crate) spin_us: AtomicU64,
    /// Torch group id (the key's first component), used by fault rules.
    pub(crate) label: Arc<str>,
    /// Peers the running collective involves (the watchdog probes them).
    pub(crate) waiting_coll: AtomicU64,
    /// Watchdog sleep lock.
    pub(crate) watch: Mutex<()>,
    /// Wakes the watchdog (shutdown).
    pub(crate) watch_cv: Condvar,
    /// Tunables.
    pub(crate) cfg: Config,
}

impl Shared {
    /// Our doorbell (in our shm segment when there is one).
    pub(crate) fn bell(&self) -> &Doorbell {
        match &self.seg {
            Some(s) => s.bell(),
            None => &self.heap_bell,
        }
    }

    /// Bounded spin before sleeping on the doorbell.
    pub(crate) fn spin(&self) -> Duration {
        Duration::from_micros(self.spin_us.load(Ordering::Relaxed))
    }

    /// Current active mask.
    pub(crate) fn mask(&self) -> u64 {
        self.mask.load(Ordering::Acquire)
    }

    /// True once shutdown started.
    pub(crate) fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// True if the link to `slot` is known broken (or absent).
    pub(crate) fn peer_dead(&self, slot: usize) -> bool {
        match self.links.read().get(slot) {
            Some(Some(l)) => l.is_dead(),
            _ => true,
        }
    }

    /// The links (indexed by slot).
    pub(crate) fn links(&self) -> Arc<Links> {
        self.links.read().clone()
    }

    /// Wakes threads waiting for control frames.
    pub(crate) fn notify_ctrl(&self) {
        *self.ctrl.lock() += 1;
        self.ctrl_cv.notify_all();
    }

    /// Applies an op's outcome to the mask (auto mode): slots in `failed`
    /// are cleared before the op's completion is signalled (collectives
    /// and P2P alike).
    pub(crate) fn after_op(&self, failed: u64) {
        if !self.auto_deactivate {
            return;
        }
        let drop_mask = failed & !(1u64 << self.rank);
        if drop_mask != 0 {
            self.mask.fetch_and(!drop_mask, Ordering::AcqRel);
            self.write_mask();
        }
    }

    /// Completes receives that lost their peer `src` (flagged in their hints).
    pub(crate) fn fail_recvs(&self, src: usize, recvs: Vec<PostedRecv>) {
        if recvs.is_empty() {
            return;
        }
        self.after_op(1u64 << src);
        for r in recvs {
            r.done().set_source(src);
            r.done().complete(None, 1u64 << src);
        }
    }

    /// Mirrors the mask into the registered int32 tensor.
    pub(crate) fn write_mask(&self) {
        let out = *self.mask_out.lock();
        if let Some((ptr, len)) = out {
            let m = self.mask();
            for i in 0..len.min(MAX_CAPACITY) {
                // SAFETY: `Group::set_mask_tensor` requires the registered
                // address to stay valid for `len` int32 writes until it is
                // replaced or the group is dropped.
                unsafe { (ptr as *mut i32).add(i).write_volatile((m >> i & 1) as i32) };
            }
        }
    }
}
