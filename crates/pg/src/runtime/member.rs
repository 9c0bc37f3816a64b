//! This member's side of the membership protocol: admitting and attaching
//! peer links (at construction and later, from joiners and replacements),
//! negotiating shared memory on each link, and applying what the
//! coordinator pushes (member records, two-phase view changes, link
//! queries, fencing). See `coordinator` for the protocol.

use crate::config;
use crate::error::PgError;
use crate::membership::agent::GroupSink;
use crate::membership::control::{MemberRec, ViewCommit};
use crate::membership::engine::{Incoming, LinkHandler};
use crate::runtime::reader::reader_loop;
use crate::runtime::shared::{FencedBefore, Gate, Shared, View};
use crate::transport::link::PeerLink;
use crate::transport::shm::Segment;
use crate::transport::wire::{Hdr, KIND_MAPPED};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// Hands the engine's incoming links to a group.
pub(crate) struct Acceptor(pub(crate) Weak<Shared>);

impl LinkHandler for Acceptor {
    fn admit(&self, slot: u32, member_id: u64) -> bool {
        self.0
            .upgrade()
            .is_some_and(|s| s.admits(slot as usize, member_id))
    }

    fn attach(&self, inc: Incoming) {
        let Some(sh) = self.0.upgrade() else { return };
        let slot = inc.slot as usize;
        let rec = sh.known(slot);
        let _ = attach_link(&sh, slot, inc.member_id, inc.stream, rec.as_ref());
    }

    fn auth_failed(&self, slot: u32, reason: String) {
        let Some(sh) = self.0.upgrade() else { return };
        sh.auth_failures.lock().insert(slot as usize, reason);
        sh.ctrl_cv.notify_all();
    }
}

impl Shared {
    /// The record of the member we expect at `slot`, if any.
    pub(crate) fn known(&self, slot: usize) -> Option<MemberRec> {
        self.members.read().get(slot).cloned().flatten()
    }

    /// Records what we know of a member.
    pub(crate) fn remember(&self, rec: MemberRec) {
        let mut m = self.members.write();
        if rec.slot >= m.len() {
            m.resize(rec.slot + 1, None);
        }
        let slot = rec.slot;
        m[slot] = Some(rec);
    }

    /// The live link to `slot`, if any.
    pub(crate) fn live_link(&self, slot: usize) -> Option<Arc<PeerLink>> {
        self.links
            .read()
            .get(slot)
            .cloned()
            .flatten()
            .filter(|l| !l.is_dead())
    }

    /// Whether a link from member `member_id` at `slot` is expected now.
    pub(crate) fn admits(&self, slot: usize, member_id: u64) -> bool {
        if slot == self.rank || slot >= self.capacity() || self.is_shutdown() {
            return false;
        }
        if self
            .live_link(slot)
            .is_some_and(|l| l.member_id == member_id)
        {
            return false;
        }
        match self.known(slot) {
            Some(rec) => rec.member_id == member_id,
            // A founding peer may dial before we read its record; connect()
            // checks the member id once it has.
            None => self.founding.load(Ordering::Acquire) && slot < self.size,
        }
    }

    /// True when `slot` is a usable data-plane peer: a live link to the
    /// member we know at that slot, shared memory negotiated.
    pub(crate) fn linked(&self, slot: usize) -> bool {
        let Some(l) = self.live_link(slot) else {
            return false;
        };
        let current = self.known(slot).is_none_or(|r| r.member_id == l.member_id);
        current && l.settled()
    }
}

/// Makes `stream` the link to `slot` (member `member_id`), starts its
/// reader and, when the peer's record is known, offers shared memory.
pub(crate) fn attach_link(
    sh: &Arc<Shared>,
    slot: usize,
    member_id: u64,
    stream: TcpStream,
    rec: Option<&MemberRec>,
) -> Result<Arc<PeerLink>, PgError> {
    let rs = stream
        .try_clone()
        .map_err(|e| PgError::io("clone socket", e))?;
    let closer = stream
        .try_clone()
        .map_err(|e| PgError::io("clone socket", e))?;
    let link = Arc::new(PeerLink::new(
        slot,
        sh.rank,
        member_id,
        stream,
        closer,
        sh.label.clone(),
        Arc::clone(&sh.clock),
    ));
    let old = {
        let mut links = sh.links.write();
        let mut v = (**links).clone();
        if v.len() <= slot {
            v.resize(slot + 1, None);
        }
        let old = v[slot].replace(link.clone());
        *links = Arc::new(v);
        old
    };
    if let Some(old) = old {
        old.close();
        if old.member_id != member_id {
            // A replacement: nothing of its predecessor's channel survives.
            sh.p2p.reset_source(slot);
        }
    }
    let (sh2, l2) = (sh.clone(), link.clone());
    let h = std::thread::Builder::new()
        .name("mcpg-read".into())
        .spawn(move || reader_loop(sh2, l2, rs))
        .map_err(|e| PgError::io("spawn reader", e))?;
    sh.threads.lock().push(h);
    if let Some(rec) = rec {
        offer_shm(sh, &link, rec);
    }
    sh.notify_ctrl();
    Ok(link)
}

/// Our half of the shared-memory negotiation on `link`: map the peer's
/// segment when it is on this host, then tell it (MAPPED). Runs once per
/// link, whichever thread gets there first: the peer may push into its ring
/// as soon as it has our MAPPED, so the ring is cleared only before that.
pub(crate) fn offer_shm(sh: &Shared, link: &Arc<PeerLink>, rec: &MemberRec) {
    if !link.claim_offer() {
        return;
    }
    let peer = match &sh.seg {
        Some(own) if !rec.shm.is_empty() && *sh.host.lock() == rec.host => {
            if let Some(ring) = own.ring(rec.slot) {
                // The producer of this ring is new: drop what a predecessor left.
                ring.clear();
            }
            Segment::open(&rec.shm)
                .ok()
                .filter(|s| s.capacity() > sh.rank && own.capacity() > rec.slot)
                .map(Arc::new)
        }
        _ => None,
    };
    let ok = peer.is_some();
    link.offer_shm(peer);
    let hdr = Hdr {
        kind: KIND_MAPPED,
        aux: u32::from(ok),
        ..Default::default()
    };
    let _ = link.write_frame(&hdr, &[]);
    if let Some(own) = &sh.seg {
        link.try_attach_shm(own);
    }
}

impl Shared {
    /// Raises the capacity (never lowers it).
    pub(crate) fn grow(&self, capacity: usize) {
        if capacity <= self.capacity() {
            return;
        }
        {
            let mut links = self.links.write();
            let mut v = (**links).clone();
            v.resize(capacity, None);
            *links = Arc::new(v);
        }
        self.members.write().resize(capacity, None);
        self.p2p.extend(capacity);
        self.capacity.store(capacity, Ordering::Release);
    }

    fn clear_gate(&self, txn: Option<u64>) {
        let mut g = self.gate.lock();
        if txn.is_none() || g.is_some_and(|g| Some(g.txn) == txn) {
            *g = None;
        }
        drop(g);
        self.submit_bell.ring();
    }

    /// Publishes the active set: the atomic, then the caller's int32 mirror,
    /// so a reader that sees the epoch that follows also sees the mirror.
    fn set_mask(&self, mask: u64) {
        self.mask.store(mask, Ordering::Release);
        self.write_mask();
    }

    fn wake_all(&self) {
        self.write_mask();
        self.submit_bell.ring();
        self.bell().ring();
        self.notify_ctrl();
    }
}

impl GroupSink for Shared {
    fn on_member(&self, rec: MemberRec) {
        if rec.slot != self.rank {
            self.remember(rec);
        }
    }

    fn on_member_gone(&self, slot: usize, member_id: u64) {
        let mut m = self.members.write();
        if m.get(slot)
            .and_then(|r| r.as_ref())
            .is_some_and(|r| r.member_id == member_id)
        {
            m[slot] = None;
        }
    }

    fn on_prepare(&self, txn: u64, active: u64, members: Vec<MemberRec>) -> (u64, bool) {
        let me = self.rank;
        for rec in members {
            if rec.slot != me {
                self.remember(rec);
            }
        }
        let was_active = self.active.load(Ordering::Acquire);
        let next_seq = if was_active {
            let _q = self.queue.lock();
            let mut gate = self.gate.lock();
            match gate.as_mut() {
                Some(g) => {
                    g.txn = txn;
                    g.seq
                }
                None => {
                    let seq = self.next_seq.load(Ordering::Acquire);
                    *gate = Some(Gate { txn, seq });
                    seq
                }
            }
        } else {
            0
        };
        let joining = self.joining.load(Ordering::Acquire);
        let ready = if active >> me & 1 == 1 {
            (was_active || joining)
                && (0..64)
                    .filter(|&s| s != me && active >> s & 1 == 1)
                    .all(|s| self.linked(s))
        } else {
            true
        };
        (next_seq, ready)
    }

    fn on_commit(&self, view: ViewCommit) {
        let ViewCommit {
            txn,
            epoch,
            active,
            from_seq,
            capacity,
            fence,
        } = view;
        self.grow(capacity);
        for s in (0..64).filter(|s| fence >> s & 1 == 1) {
            if let Some(l) = self.live_link(s) {
                l.fence();
            }
        }
        let me = 1u64 << self.rank;
        let was_active = self.active.load(Ordering::Acquire);
        if active & me != 0 {
            if was_active {
                self.views.lock().push(View {
                    from_seq,
                    mask: active,
                });
            } else {
                let _q = self.queue.lock();
                self.next_seq.store(from_seq, Ordering::Release);
                *self.views.lock() = vec![View {
                    from_seq,
                    mask: active,
                }];
                self.active.store(true, Ordering::Release);
                self.joining.store(false, Ordering::Release);
            }
            self.set_mask(active);
        } else if was_active {
            self.views.lock().push(View { from_seq, mask: me });
            self.active.store(false, Ordering::Release);
            self.set_mask(me);
        }
        self.epoch.store(epoch, Ordering::Release);
        self.clear_gate(Some(txn));
        if config::log_info() {
            eprintln!(
                "mooncake-pg: group {} rank {}: applied epoch {epoch} (active {active:#x}) from op {from_seq}",
                self.label, self.rank
            );
        }
        self.wake_all();
    }

    fn on_abort(&self, txn: u64) {
        self.clear_gate(Some(txn));
    }

    fn dead_links(&self) -> (usize, u64) {
        if !self.active.load(Ordering::Acquire) {
            return (self.rank, 0);
        }
        (self.rank, Shared::dead_links(self))
    }

    fn on_fenced(&self, epoch: u64) {
        let me = 1u64 << self.rank;
        {
            // Collectives submitted before the fence but not yet run lose
            // every peer of the view they were submitted under: they run
            // local-only and flag those peers in their hints. So does the
            // first collective submitted after it (`FencedBefore`).
            let _q = self.queue.lock();
            let mut views = self.views.lock();
            let before = std::mem::replace(
                &mut *views,
                vec![View {
                    from_seq: 0,
                    mask: me,
                }],
            );
            // A second drop notice keeps the first record (the views after
            // the first drop are this member alone).
            self.fenced_before.lock().get_or_insert(FencedBefore {
                next_seq: self.next_seq.load(Ordering::Acquire),
                views: before,
            });
        }
        self.fenced.store(true, Ordering::Release);
        self.active.store(false, Ordering::Release);
        for l in self.links().iter().flatten() {
            l.fence();
        }
        self.set_mask(me);
        self.epoch.store(epoch, Ordering::Release);
        self.clear_gate(None);
        eprintln!(
            "mooncake-pg: group {} rank {}: dropped from the group for failure at epoch {epoch}; \
             running local-only (replace this process to rejoin)",
            self.label, self.rank
        );
        self.wake_all();
    }

    fn on_agent_lost(&self) {
        self.clear_gate(None);
        self.deferred_cv.notify_all();
        self.wake_all();
    }
}
