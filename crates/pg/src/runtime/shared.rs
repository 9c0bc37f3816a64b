//! State shared by one group member's threads (executor, readers, watchdog
//! and the callers' threads): the active mask, the links, the op queue and
//! the doorbells. It sits below every thread body in the module tree; the
//! thread bodies (`executor`, `reader`, `watchdog`, `progress`) use it and
//! `group` owns it.

use crate::collectives::p2p::{P2p, PostedRecv};
use crate::collectives::plan::OpKind;
use crate::collectives::retain::Retention;
use crate::completion::Completion;
use crate::config::{self, Config};
use crate::error::PgError;
use crate::membership::agent::Agent;
use crate::membership::control::{MemberRec, ToAgent, ToCoord};
use crate::transport::futex::Doorbell;
use crate::transport::link::PeerLink;
use crate::transport::shm::Segment;
use mooncake_common::AuthKey;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
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

/// A membership view as the executor applies it: collectives with
/// `seq >= from_seq` run over `mask` (until a later view takes over).
#[derive(Clone, Copy, Debug)]
pub(crate) struct View {
    /// First collective the view governs.
    pub(crate) from_seq: u64,
    /// Active set (`{self}` while this member is local-only).
    pub(crate) mask: u64,
}

/// What a member dropped for failure owes its collectives: those with
/// `seq < next_seq` were submitted under `views`, so the peers those views
/// held are missing from their results. The first collective submitted
/// after the drop (`seq == next_seq`) flags the peers of the last view: a
/// dropped member marks all its peers failed once, even when the drop
/// arrived between two collectives, so every result matches its hint.
#[derive(Debug)]
pub(crate) struct FencedBefore {
    /// First collective submitted after the drop.
    pub(crate) next_seq: u64,
    /// The views in force before the drop, oldest first.
    pub(crate) views: Vec<View>,
}

impl FencedBefore {
    /// Peers of the view collective `seq` was submitted under; for the first
    /// collective submitted after the drop, the peers of the last view;
    /// none for any later one.
    pub(crate) fn lost_peers(&self, seq: u64, me: usize) -> u64 {
        if seq > self.next_seq {
            return 0;
        }
        self.views
            .iter()
            .rev()
            .find(|v| v.from_seq <= seq)
            .or(self.views.first())
            .map_or(0, |v| v.mask & !(1u64 << me))
    }
}

/// A prepared view change: no collective at or past `seq` may start.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gate {
    /// The coordinator's transaction.
    pub(crate) txn: u64,
    /// Collectives issued when the prepare arrived.
    pub(crate) seq: u64,
}

/// A completion held back until the coordinator has reconciled its failure
/// (`auto_sync_on_failure`).
pub(crate) struct Deferred {
    /// The op's completion.
    pub(crate) done: Arc<Completion>,
    /// Its error, if any.
    pub(crate) error: Option<PgError>,
    /// Its failed set.
    pub(crate) failed: u64,
}

/// State shared by the group's threads.
pub(crate) struct Shared {
    /// Our slot.
    pub(crate) rank: usize,
    /// Declared size.
    pub(crate) size: usize,
    /// Reserved capacity.
    pub(crate) capacity: AtomicUsize,
    /// Declared as a joining/replacement member.
    pub(crate) is_extension: bool,
    /// Failed ranks leave the active set (coordinator decision, or locally
    /// when no coordinator is reachable).
    pub(crate) auto_deactivate: bool,
    /// A failed op waits for the coordinator's reconciled view.
    pub(crate) auto_sync: bool,
    /// In the group's active set (false: local-only).
    pub(crate) active: AtomicBool,
    /// `join_group` is waiting for an activation.
    pub(crate) joining: AtomicBool,
    /// Dropped from the group for failure.
    pub(crate) fenced: AtomicBool,
    /// Still in founding construction (links from founding peers admitted
    /// before their records are read).
    pub(crate) founding: AtomicBool,
    /// Epoch of the last view applied.
    pub(crate) epoch: AtomicU64,
    /// Views for the executor, oldest first.
    pub(crate) views: Mutex<Vec<View>>,
    /// Set when this member is dropped for failure: the collectives
    /// submitted before then and the views they were submitted under.
    pub(crate) fenced_before: Mutex<Option<FencedBefore>>,
    /// The prepared view change, if any.
    pub(crate) gate: Mutex<Option<Gate>>,
    /// Known member records by slot (expected link dialers).
    pub(crate) members: RwLock<Vec<Option<MemberRec>>>,
    /// Our registration order (we dial members registered before us).
    pub(crate) order: AtomicU64,
    /// Our host identity (same host + shm segment: rings are used).
    pub(crate) host: Mutex<String>,
    /// The session with the membership coordinator.
    pub(crate) agent: RwLock<Option<Arc<Agent>>>,
    /// Completions waiting for reconciliation.
    pub(crate) deferred: Mutex<Vec<Deferred>>,
    /// Wakes the sync thread.
    pub(crate) deferred_cv: Condvar,
    /// The sync thread runs.
    pub(crate) syncer: AtomicBool,
    /// Every thread the group started (joined at shutdown).
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
    /// Hash of the group key (connection preambles).
    pub(crate) key: u64,
    /// The cluster secret every link and control session of this member
    /// proves (`MC_AUTH_TOKEN` / `MC_AUTH_TOKEN_FILE` when it was created).
    pub(crate) auth: Option<AuthKey>,
    /// Why the last link attempt from each slot failed authentication (the
    /// reason a connect timeout reports).
    pub(crate) auth_failures: Mutex<HashMap<usize, String>>,
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
    /// Retained reduction inputs and this member's pulls (all-or-nothing
    /// inclusion; shared with the threads that answer pulls).
    pub(crate) retain: Arc<Retention>,
    /// Tunables.
    pub(crate) cfg: Config,
    /// The clock link liveness is measured on.
    pub(crate) clock: Arc<dyn crate::clock::Clock>,
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

    /// The committed active mask as users see it (`{self}` while local-only).
    pub(crate) fn mask(&self) -> u64 {
        self.mask.load(Ordering::Acquire)
    }

    /// Reserved capacity now.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Acquire)
    }

    /// The active set that governs collective `seq`.
    pub(crate) fn view_mask(&self, seq: u64) -> u64 {
        let mut views = self.views.lock();
        let idx = views.iter().rposition(|v| v.from_seq <= seq).unwrap_or(0);
        if idx > 0 {
            views.drain(..idx);
        }
        views.first().map_or(1u64 << self.rank, |v| v.mask)
    }

    /// The coordinator session, if it is alive.
    pub(crate) fn agent(&self) -> Option<Arc<Agent>> {
        self.agent.read().clone().filter(|a| a.is_alive())
    }

    /// Asks the coordinator (through `agent`) to reconcile this member's
    /// failure report `dead`, waiting at most the reconciliation window plus
    /// three collective timeouts, or until shutdown.
    pub(crate) fn request_sync(&self, agent: &Agent, dead: u64) -> Result<ToAgent, PgError> {
        let limit = config::reconciliation_window() + 3 * config::collective_timeout();
        agent.request_until(
            |req| ToCoord::Sync {
                req,
                group: self.key,
                slot: self.rank,
                member_id: self.member_id,
                dead,
            },
            limit,
            || self.is_shutdown(),
        )
    }

    /// Pops the next collective unless a prepared view change gates it.
    pub(crate) fn pop_runnable(&self) -> Option<Op> {
        let mut q = self.queue.lock();
        let seq = q.front()?.seq;
        if let Some(g) = *self.gate.lock() {
            if seq >= g.seq {
                return None;
            }
        }
        q.pop_front()
    }

    /// Reports an op's outcome: without failures, or with no coordinator,
    /// it completes now (auto mode first clears the failed ranks locally);
    /// with `auto_sync_on_failure` the completion waits until the
    /// coordinator has reconciled the failure and this member applied the
    /// resulting view; otherwise the evidence is reported and the op
    /// completes at once.
    pub(crate) fn finish(&self, done: &Arc<Completion>, error: Option<PgError>, failed: u64) {
        let evidence = failed & !(1u64 << self.rank);
        if evidence == 0 {
            done.complete(error, failed);
            return;
        }
        let Some(agent) = self.agent() else {
            self.after_op(failed);
            done.complete(error, failed);
            return;
        };
        if self.auto_sync && self.active.load(Ordering::Acquire) {
            self.deferred.lock().push(Deferred {
                done: done.clone(),
                error,
                failed,
            });
            self.deferred_cv.notify_all();
            return;
        }
        agent.send(&ToCoord::Sync {
            req: 0,
            group: self.key,
            slot: self.rank,
            member_id: self.member_id,
            dead: evidence,
        });
        done.complete(error, failed);
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

    /// Local failure handling, used while no coordinator is reachable (auto
    /// mode): slots in `failed` leave the mask, and the executor's view,
    /// before the op's completion is signalled.
    pub(crate) fn after_op(&self, failed: u64) {
        if !self.auto_deactivate {
            return;
        }
        let drop_mask = failed & !(1u64 << self.rank);
        if drop_mask != 0 {
            self.mask.fetch_and(!drop_mask, Ordering::AcqRel);
            let mut views = self.views.lock();
            for v in views.iter_mut() {
                v.mask &= !drop_mask;
            }
            drop(views);
            self.write_mask();
        }
    }

    /// Completes receives that lost their peer `src` (flagged in their hints).
    pub(crate) fn fail_recvs(&self, src: usize, recvs: Vec<PostedRecv>) {
        for r in recvs {
            r.done().set_source(src);
            self.finish(r.done(), None, 1u64 << src);
        }
    }

    /// Completes sends the peer at `slot` never acknowledged: failed
    /// (flagged in their hints), or cancelled at shutdown.
    pub(crate) fn fail_sends(&self, slot: usize, sends: Vec<Arc<Completion>>) {
        for d in sends {
            if self.is_shutdown() {
                d.complete(Some(PgError::Shutdown), 0);
            } else {
                self.finish(&d, None, 1u64 << slot);
            }
        }
    }

    /// Slots of the committed mask whose links are dead (or missing).
    pub(crate) fn dead_links(&self) -> u64 {
        let mask = self.mask() & !(1u64 << self.rank);
        (0..64)
            .filter(|&i| mask >> i & 1 == 1 && self.peer_dead(i))
            .fold(0, |m, i| m | 1u64 << i)
    }

    /// Mirrors the mask into the registered int32 tensor. The registration
    /// lock is held while writing, so once `Group::clear_mask_tensor` (or
    /// `shutdown`) returned no write reaches the old address: threads that
    /// outlive the owner's tensor (the coordinator session's reader calling
    /// `on_agent_lost` after the group shut down) write nothing.
    pub(crate) fn write_mask(&self) {
        let out = self.mask_out.lock();
        if let Some((ptr, len)) = *out {
            let m = self.mask();
            for i in 0..len.min(MAX_CAPACITY) {
                // SAFETY: `Group::set_mask_tensor` requires the registered
                // address to stay valid for `len` int32 writes until it is
                // replaced or cleared (shutdown clears it), and we hold the
                // registration lock, so neither can happen during the write.
                unsafe { (ptr as *mut i32).add(i).write_volatile((m >> i & 1) as i32) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{FencedBefore, View};

    #[test]
    fn a_drop_flags_the_peers_of_collectives_submitted_before_it_and_of_the_next_one() {
        let f = FencedBefore {
            next_seq: 10,
            views: vec![
                View {
                    from_seq: 0,
                    mask: 0b0111,
                },
                View {
                    from_seq: 5,
                    mask: 0b1111,
                },
            ],
        };
        // Member 1: collectives 0-4 ran over {0,1,2}, 5-9 over {0,1,2,3}.
        assert_eq!(f.lost_peers(0, 1), 0b0101);
        assert_eq!(f.lost_peers(4, 1), 0b0101);
        assert_eq!(f.lost_peers(5, 1), 0b1101);
        assert_eq!(f.lost_peers(9, 1), 0b1101);
        // The first collective submitted after the drop flags the peers
        // of the last view once; later ones run local-only with none lost.
        assert_eq!(f.lost_peers(10, 1), 0b1101);
        assert_eq!(f.lost_peers(11, 1), 0);
        assert_eq!(f.lost_peers(12, 1), 0);
    }
}
