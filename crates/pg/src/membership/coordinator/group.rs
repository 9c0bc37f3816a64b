//! One group's membership: its members and their states, the queue of
//! changes, the two-phase view-change transaction, reconciliation of link
//! reports, and the rules that decide them.

use crate::config;
use crate::membership::control::{MemberRec, ProposalStatus, SyncStatus, ToAgent};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How often a prepare is re-sent to members that were not ready yet.
const PREPARE_RETRY: Duration = Duration::from_millis(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MState {
    /// Registered, not ready for activation.
    Inactive,
    /// Called `join_group`.
    Awaiting,
    /// In the active set.
    Active,
}

pub(super) struct CMember {
    pub(super) sess: u64,
    pub(super) rec: MemberRec,
    pub(super) state: MState,
    pub(super) alive: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Activate,
    Deactivate,
    Drop,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Waiter {
    Propose(u64, u64),
    Sync(u64, u64),
}

pub(super) struct Change {
    pub(super) kind: Kind,
    pub(super) ranks: u64,
    pub(super) waiters: Vec<Waiter>,
    pub(super) deadline: Instant,
    pub(super) dropped: u64,
    pub(super) reason: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Prepare,
    Commit,
}

pub(super) struct Txn {
    pub(super) id: u64,
    pub(super) new_active: u64,
    pub(super) participants: u64,
    pub(super) old: u64,
    pub(super) targets: u64,
    pub(super) ready: u64,
    pub(super) next_seq: u64,
    pub(super) phase: Phase,
    pub(super) deadline: Instant,
    pub(super) retry: Instant,
    pub(super) acked: u64,
    pub(super) fence: u64,
}

pub(super) struct Recon {
    pub(super) deadline: Instant,
    pub(super) reports: HashMap<usize, u64>,
    pub(super) reported: u64,
    pub(super) offline: u64,
    pub(super) waiters: Vec<Waiter>,
}

pub(super) struct PendingReg {
    pub(super) sess: u64,
    pub(super) req: u64,
    pub(super) rec: MemberRec,
    pub(super) deadline: Instant,
}

pub(super) struct CGroup {
    pub(super) key: u64,
    pub(super) label: String,
    pub(super) capacity: usize,
    pub(super) founding_capacity: usize,
    pub(super) size: usize,
    pub(super) founded: u64,
    pub(super) auto: bool,
    pub(super) epoch: u64,
    pub(super) active: u64,
    pub(super) members: Vec<Option<CMember>>,
    pub(super) next_order: u64,
    pub(super) pending_regs: Vec<PendingReg>,
    pub(super) changes: VecDeque<Change>,
    pub(super) txn: Option<Txn>,
    pub(super) recon: Option<Recon>,
    /// Ranks the last reconciliation found unhealthy but kept in the view
    /// (framework-managed mode): further reports about them are answered at
    /// once.
    pub(super) known_bad: u64,
}

pub(super) fn bit(slot: usize) -> u64 {
    1u64 << slot
}

pub(super) fn full(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

pub(super) fn slots(mask: u64) -> impl Iterator<Item = usize> {
    (0..64).filter(move |i| mask >> i & 1 == 1)
}

pub(super) fn list(mask: u64) -> Vec<usize> {
    slots(mask).collect()
}

/// Messages to send once the state change is done.
pub(super) type Out = Vec<(u64, ToAgent)>;

impl CGroup {
    pub(super) fn new(key: u64, label: String, capacity: usize) -> Self {
        CGroup {
            key,
            label,
            capacity,
            founding_capacity: 0,
            size: 0,
            founded: 0,
            auto: true,
            epoch: 0,
            active: 0,
            members: (0..capacity).map(|_| None).collect(),
            next_order: 0,
            pending_regs: Vec::new(),
            changes: VecDeque::new(),
            txn: None,
            recon: None,
            known_bad: 0,
        }
    }

    pub(super) fn grow(&mut self, capacity: usize) {
        self.capacity = self.capacity.max(capacity).min(64);
        while self.members.len() < self.capacity {
            self.members.push(None);
        }
    }

    pub(super) fn is_founded(&self) -> bool {
        self.size > 0 && self.founded == full(self.size)
    }

    pub(super) fn alive(&self) -> u64 {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.as_ref().is_some_and(|m| m.alive))
            .fold(0, |acc, (i, _)| acc | bit(i))
    }

    pub(super) fn member(&self, slot: usize) -> Option<&CMember> {
        self.members.get(slot).and_then(|m| m.as_ref())
    }

    pub(super) fn live_recs(&self) -> Vec<MemberRec> {
        self.members
            .iter()
            .flatten()
            .filter(|m| m.alive)
            .map(|m| m.rec.clone())
            .collect()
    }

    pub(super) fn recs_of(&self, mask: u64) -> Vec<MemberRec> {
        slots(mask)
            .filter_map(|s| self.member(s).map(|m| m.rec.clone()))
            .collect()
    }

    pub(super) fn to(&self, mask: u64, msg: &ToAgent, out: &mut Out) {
        for s in slots(mask) {
            if let Some(m) = self.member(s).filter(|m| m.alive) {
                out.push((m.sess, msg.clone()));
            }
        }
    }

    pub(super) fn broadcast_except(&self, slot: usize, msg: &ToAgent, out: &mut Out) {
        self.to(self.alive() & !bit(slot), msg, out);
    }
}

pub(super) fn reply(
    out: &mut Out,
    w: Waiter,
    status: ProposalStatus,
    epoch: u64,
    dropped: u64,
    reason: &str,
) {
    match w {
        Waiter::Propose(sess, req) => out.push((
            sess,
            ToAgent::Proposed {
                req,
                status,
                epoch,
                dropped: list(dropped),
                reason: reason.to_string(),
            },
        )),
        Waiter::Sync(sess, req) => {
            let status = if status == ProposalStatus::Rejected {
                SyncStatus::Rejected
            } else {
                SyncStatus::Reconciled
            };
            out.push((
                sess,
                ToAgent::Synced {
                    req,
                    status,
                    epoch,
                    reason: reason.to_string(),
                },
            ))
        }
    }
}

/// The largest set of candidates without a down link between any two of
/// them. Among sets of that size, the one that drops the most-accused ranks
/// wins (`votes[r]`: how many members reported `r` unreachable, so a rank
/// that reported a dead peer is not dropped in its place), then the one
/// whose lowest differing rank is kept.
pub(super) fn max_clique(cand: u64, down: &[(usize, usize)], votes: &[u32; 64]) -> u64 {
    let accused = |set: u64| -> u32 { slots(cand & !set).map(|s| votes[s]).sum() };
    let better = |a: u64, b: u64| -> bool {
        let (ca, cb) = (a.count_ones(), b.count_ones());
        if ca != cb {
            return ca > cb;
        }
        let (va, vb) = (accused(a), accused(b));
        if va != vb {
            return va > vb;
        }
        a != b && (a & (a ^ b)).trailing_zeros() == (a ^ b).trailing_zeros()
    };
    fn rec(
        set: u64,
        down: &[(usize, usize)],
        votes: &[u32; 64],
        best: &mut Option<u64>,
        better: &dyn Fn(u64, u64) -> bool,
    ) {
        if best.is_some_and(|b| set.count_ones() < b.count_ones()) {
            return;
        }
        match down
            .iter()
            .find(|(a, b)| set >> a & 1 == 1 && set >> b & 1 == 1)
        {
            None => {
                if best.is_none_or(|b| better(set, b)) {
                    *best = Some(set);
                }
            }
            Some(&(a, b)) => {
                // Try dropping the more-accused (then higher) end first.
                let (first, second) = if (votes[a], a) > (votes[b], b) {
                    (a, b)
                } else {
                    (b, a)
                };
                rec(set & !bit(first), down, votes, best, better);
                rec(set & !bit(second), down, votes, best, better);
            }
        }
    }
    let mut best = None;
    rec(cand, down, votes, &mut best, &better);
    best.unwrap_or(0)
}
/// Queues a failure-driven change ahead of proposals (behind the change a
/// running transaction belongs to, which is always the queue's front).
pub(super) fn push_urgent(g: &mut CGroup, c: Change) {
    let at = if g.txn.is_some() {
        1.min(g.changes.len())
    } else {
        0
    };
    g.changes.insert(at, c);
}

pub(super) fn failed(req: u64, reason: &str) -> ToAgent {
    ToAgent::Failed {
        req,
        reason: reason.to_string(),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn register_founder(
    g: &mut CGroup,
    sess: u64,
    req: u64,
    mut rec: MemberRec,
    capacity: usize,
    size: usize,
    auto: bool,
    out: &mut Out,
) {
    let slot = rec.slot;
    if g.size == 0 {
        g.size = size;
        g.founding_capacity = capacity;
        g.auto = auto;
        g.active = full(size);
        g.grow(capacity);
    } else if g.size != size || g.founding_capacity != capacity {
        let why = format!(
            "members of process group {} disagree on its founding shape: size {} / capacity {} here, \
             size {} / capacity {} at the first member (were new_group calls issued in the same \
             order with the same ranks everywhere?)",
            g.label, size, capacity, g.size, g.founding_capacity
        );
        out.push((sess, failed(req, &why)));
        return;
    }
    if slot >= size {
        out.push((
            sess,
            failed(
                req,
                &format!("rank {slot} is outside group {} of size {size}", g.label),
            ),
        ));
        return;
    }
    if g.member(slot).is_some_and(|m| m.alive) || g.founded >> slot & 1 == 1 {
        out.push((
            sess,
            failed(
                req,
                &format!("rank {slot} of process group {} registered twice", g.label),
            ),
        ));
        return;
    }
    rec.order = g.next_order;
    g.next_order += 1;
    g.founded |= bit(slot);
    g.members[slot] = Some(CMember {
        sess,
        rec: rec.clone(),
        state: MState::Active,
        alive: true,
    });
    g.broadcast_except(slot, &ToAgent::Member { group: g.key, rec }, out);
    out.push((
        sess,
        ToAgent::Registered {
            req,
            capacity: g.capacity,
            epoch: g.epoch,
            active: g.active,
            members: g.live_recs(),
            closed: false,
        },
    ));
}

pub(super) fn register_joiner(
    g: &mut CGroup,
    sess: u64,
    req: u64,
    mut rec: MemberRec,
    out: &mut Out,
) {
    let slot = rec.slot;
    if slot >= g.capacity {
        out.push((
            sess,
            failed(
                req,
                &format!(
                    "rank {slot} is beyond the capacity ({}) of process group {}; reserve it with \
                     max_group_size when the group is created",
                    g.capacity, g.label
                ),
            ),
        ));
        return;
    }
    if let Some(m) = g.member(slot).filter(|m| m.alive) {
        let why = if m.state == MState::Active {
            format!(
                "rank {slot} of process group {} is still active (its process is alive); only a \
                 failed or departed rank can be replaced",
                g.label
            )
        } else {
            format!(
                "rank {slot} of process group {} is already taken by a live process",
                g.label
            )
        };
        out.push((sess, failed(req, &why)));
        return;
    }
    rec.order = g.next_order;
    g.next_order += 1;
    g.known_bad &= !bit(slot);
    g.members[slot] = Some(CMember {
        sess,
        rec: rec.clone(),
        state: MState::Inactive,
        alive: true,
    });
    g.broadcast_except(slot, &ToAgent::Member { group: g.key, rec }, out);
    out.push((
        sess,
        ToAgent::Registered {
            req,
            capacity: g.capacity,
            epoch: g.epoch,
            active: g.active,
            members: g.live_recs(),
            closed: false,
        },
    ));
}

/// A member's process ended (`crashed`) or it left in an orderly way. A
/// crash of an active member opens a reconciliation at once; a member that
/// left stays in the view until its peers report its link gone (what it
/// sent before leaving is still delivered).
pub(super) fn member_gone(g: &mut CGroup, slot: usize, crashed: bool, now: Instant, out: &mut Out) {
    let Some(m) = g.members.get_mut(slot).and_then(|m| m.as_mut()) else {
        return;
    };
    m.alive = false;
    let member_id = m.rec.member_id;
    let was_active = g.active >> slot & 1 == 1;
    g.broadcast_except(
        slot,
        &ToAgent::MemberGone {
            group: g.key,
            slot,
            member_id,
        },
        out,
    );
    if was_active && crashed {
        open_recon(g, now, out);
        if let Some(r) = g.recon.as_mut() {
            r.offline |= bit(slot);
        }
    }
}

pub(super) fn open_recon(g: &mut CGroup, now: Instant, out: &mut Out) {
    if g.recon.is_some() {
        return;
    }
    g.recon = Some(Recon {
        deadline: now + config::reconciliation_window(),
        reports: HashMap::new(),
        reported: 0,
        offline: 0,
        waiters: Vec::new(),
    });
    let q = ToAgent::Query { group: g.key };
    g.to(g.active & g.alive(), &q, out);
}

#[allow(clippy::too_many_arguments)]
pub(super) fn sync(
    g: &mut CGroup,
    sess: u64,
    req: u64,
    slot: usize,
    member_id: u64,
    dead: u64,
    now: Instant,
    out: &mut Out,
) {
    let is_member = g
        .member(slot)
        .is_some_and(|m| m.rec.member_id == member_id && m.alive);
    if !is_member || g.active >> slot & 1 == 0 {
        if req != 0 {
            let reason = if is_member {
                format!(
                    "rank {slot} is not an active member of process group {}",
                    g.label
                )
            } else {
                format!(
                    "rank {slot} is not a registered member of process group {}",
                    g.label
                )
            };
            out.push((
                sess,
                ToAgent::Synced {
                    req,
                    status: SyncStatus::Rejected,
                    epoch: g.epoch,
                    reason,
                },
            ));
        }
        return;
    }
    let evidence = dead & g.active & !bit(slot);
    if config::log_info() && evidence != 0 {
        eprintln!(
            "mooncake-pg: process group {}: rank {slot} reports rank(s) {:?} unreachable",
            g.label,
            list(evidence)
        );
    }
    let pending = g.recon.is_some() || g.changes.iter().any(|c| c.kind == Kind::Drop);
    if !pending && evidence != 0 && evidence & !g.known_bad == 0 {
        // Framework-managed: already reconciled, the view keeps them.
        if req != 0 {
            out.push((
                sess,
                ToAgent::Synced {
                    req,
                    status: SyncStatus::Reconciled,
                    epoch: g.epoch,
                    reason: String::new(),
                },
            ));
        }
        return;
    }
    if evidence == 0 && !pending {
        if req != 0 {
            out.push((
                sess,
                ToAgent::Synced {
                    req,
                    status: SyncStatus::NoPending,
                    epoch: g.epoch,
                    reason: String::new(),
                },
            ));
        }
        return;
    }
    if evidence != 0 {
        open_recon(g, now, out);
    }
    let w = Waiter::Sync(sess, req);
    if let Some(r) = g.recon.as_mut() {
        r.reports.insert(slot, dead);
        r.reported |= bit(slot);
        if req != 0 {
            r.waiters.push(w);
        }
    } else if req != 0 {
        // A drop is already queued or committing: answer when it is done.
        if let Some(c) = g.changes.iter_mut().find(|c| c.kind == Kind::Drop) {
            c.waiters.push(w);
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn propose(
    g: &mut CGroup,
    slot: usize,
    activate: bool,
    ranks: &[usize],
    admission_ms: u64,
    w: Waiter,
    now: Instant,
    out: &mut Out,
) {
    let reject =
        |out: &mut Out, why: String| reply(out, w, ProposalStatus::Rejected, g.epoch, 0, &why);
    if !g.member(slot).is_some_and(|m| m.alive) {
        return reject(
            out,
            format!(
                "rank {slot} is not a registered member of process group {}",
                g.label
            ),
        );
    }
    if ranks.is_empty() {
        return reject(out, "no ranks given".into());
    }
    let mut mask = 0u64;
    for &r in ranks {
        if r >= g.capacity {
            return reject(
                out,
                format!(
                    "rank {r} is outside process group {} (capacity {})",
                    g.label, g.capacity
                ),
            );
        }
        mask |= bit(r);
    }
    if activate {
        let absent: Vec<usize> = slots(mask & !g.active)
            .filter(|&r| !g.member(r).is_some_and(|m| m.alive))
            .collect();
        if !absent.is_empty() {
            return reject(
                out,
                format!(
                    "rank(s) {absent:?} of process group {} have no registered process (never \
                     initialized with is_extension=True, or the process ended)",
                    g.label
                ),
            );
        }
    } else if g.active & !mask == 0 {
        return reject(
            out,
            format!(
                "deactivating rank(s) {:?} would leave process group {} without an active rank",
                list(mask & g.active),
                g.label
            ),
        );
    }
    g.changes.push_back(Change {
        kind: if activate {
            Kind::Activate
        } else {
            Kind::Deactivate
        },
        ranks: mask,
        waiters: vec![w],
        deadline: now + Duration::from_millis(admission_ms),
        dropped: 0,
        reason: String::new(),
    });
}

pub(super) fn tick_group(g: &mut CGroup, now: Instant, next_txn: &mut u64, out: &mut Out) {
    if !g.pending_regs.is_empty() && !g.is_founded() {
        let label = g.label.clone();
        g.pending_regs.retain(|p| {
            if now >= p.deadline {
                out.push((
                    p.sess,
                    failed(
                        p.req,
                        &format!("process group {label} was never founded by its members"),
                    ),
                ));
                false
            } else {
                true
            }
        });
    }
    try_decide(g, now, out);
    step_txn(g, now, out);
    pump(g, now, next_txn, out);
}

pub(super) fn try_decide(g: &mut CGroup, now: Instant, out: &mut Out) {
    let alive = g.alive();
    let Some(r) = g.recon.as_ref() else { return };
    let cand = g.active & alive & !r.offline;
    let suspects = r.reports.values().fold(0u64, |a, d| a | d) & cand;
    let needed = cand & !suspects;
    if needed & !r.reported != 0 && now < r.deadline {
        return;
    }
    let mut down = Vec::new();
    let mut votes = [0u32; 64];
    for (&a, &d) in &r.reports {
        for b in slots(d & cand) {
            if cand >> a & 1 == 1 && a != b {
                down.push((a, b));
                votes[b] += 1;
            }
        }
    }
    let keep = max_clique(cand, &down, &votes);
    let drop = g.active & !keep;
    if config::log_info() {
        eprintln!(
            "mooncake-pg: process group {}: reconciled: candidates {:?}, reports {:?}, keep {:?}, drop {:?}",
            g.label,
            list(cand),
            r.reports.iter().map(|(k, v)| (*k, list(*v))).collect::<Vec<_>>(),
            list(keep),
            list(drop)
        );
    }
    let Some(r) = g.recon.take() else { return };
    if g.auto && drop != 0 && keep != 0 {
        push_urgent(
            g,
            Change {
                kind: Kind::Drop,
                ranks: drop,
                waiters: r.waiters,
                deadline: now,
                dropped: 0,
                reason: String::new(),
            },
        );
    } else {
        g.known_bad = drop;
        for w in r.waiters {
            reply(out, w, ProposalStatus::Applied, g.epoch, 0, "");
        }
    }
}

pub(super) fn abort_txn(g: &mut CGroup, out: &mut Out) {
    if let Some(t) = g.txn.take() {
        g.to(
            t.participants,
            &ToAgent::Abort {
                group: g.key,
                txn: t.id,
            },
            out,
        );
    }
}

pub(super) fn step_txn(g: &mut CGroup, now: Instant, out: &mut Out) {
    let alive = g.alive();
    let Some(t) = g.txn.as_mut() else { return };
    match t.phase {
        Phase::Prepare => {
            let dead = t.participants & !alive;
            if !g.auto && dead & !t.targets != 0 {
                // Framework-managed: a dead member stays in the view; go on without it.
                t.participants &= !(dead & !t.targets);
                t.old &= alive;
            }
            let dead = t.participants & !alive;
            if t.ready == t.participants && dead == 0 {
                t.phase = Phase::Commit;
                t.deadline = now + config::collective_timeout();
                let msg = ToAgent::Commit {
                    group: g.key,
                    txn: t.id,
                    epoch: g.epoch + 1,
                    active: t.new_active,
                    from_seq: t.next_seq,
                    capacity: g.capacity,
                    fence: t.fence,
                };
                let parts = t.participants;
                g.to(parts, &msg, out);
                return;
            }
            let missing = if now >= t.deadline {
                t.participants & !t.ready
            } else {
                dead
            };
            if missing != 0 {
                if config::log_info() {
                    eprintln!(
                        "mooncake-pg: process group {}: view change {} lacks rank(s) {:?} (dead {:?})",
                        g.label,
                        t.id,
                        list(missing),
                        list(dead)
                    );
                }
                let targets = t.targets;
                abort_txn(g, out);
                let bad_targets = missing & targets;
                let bad_old = missing & !targets;
                if bad_targets != 0 {
                    if let Some(c) = g.changes.front_mut() {
                        c.dropped |= bad_targets;
                    }
                }
                if bad_old != 0 {
                    if g.auto {
                        g.changes.push_front(Change {
                            kind: Kind::Drop,
                            ranks: bad_old,
                            waiters: Vec::new(),
                            deadline: now,
                            dropped: 0,
                            reason: String::new(),
                        });
                    } else if let Some(c) = g.changes.pop_front() {
                        let why = format!(
                            "rank(s) {:?} of process group {} did not acknowledge the view change",
                            list(bad_old),
                            g.label
                        );
                        for w in c.waiters {
                            reply(out, w, ProposalStatus::Rejected, g.epoch, 0, &why);
                        }
                    }
                }
                return;
            }
            if now >= t.retry && t.ready != t.participants {
                t.retry = now + PREPARE_RETRY;
                let (id, active, pending) = (t.id, t.new_active, t.participants & !t.ready);
                let msg = ToAgent::Prepare {
                    group: g.key,
                    txn: id,
                    active,
                    members: g.recs_of(active),
                };
                g.to(pending, &msg, out);
            }
        }
        Phase::Commit => {
            if (t.acked | !alive) & t.participants == t.participants || now >= t.deadline {
                finalize(g, out);
            }
        }
    }
}

pub(super) fn finalize(g: &mut CGroup, out: &mut Out) {
    let Some(t) = g.txn.take() else { return };
    let change = g.changes.pop_front();
    let prev = g.active;
    g.epoch += 1;
    g.active = t.new_active;
    g.known_bad &= t.new_active;
    for s in slots(t.new_active & !prev) {
        if let Some(Some(m)) = g.members.get_mut(s) {
            m.state = MState::Active;
        }
    }
    for s in slots(prev & !t.new_active) {
        if let Some(Some(m)) = g.members.get_mut(s) {
            m.state = MState::Inactive;
        }
    }
    if let Some(c) = change {
        if c.kind == Kind::Drop {
            let fenced = ToAgent::Fenced {
                group: g.key,
                epoch: g.epoch,
            };
            g.to(prev & !t.new_active, &fenced, out);
        }
        let (status, dropped) = if c.dropped != 0 {
            (ProposalStatus::AppliedWithDroppedRanks, c.dropped)
        } else {
            (ProposalStatus::Applied, 0)
        };
        for w in c.waiters {
            reply(out, w, status, g.epoch, dropped, "");
        }
    }
    if config::log_info() {
        eprintln!(
            "mooncake-pg: process group {}: epoch {} active ranks {:?}",
            g.label,
            g.epoch,
            list(g.active)
        );
    }
}

pub(super) fn pump(g: &mut CGroup, now: Instant, next_txn: &mut u64, out: &mut Out) {
    while g.txn.is_none() {
        let alive = g.alive();
        let Some(c) = g.changes.front_mut() else {
            return;
        };
        let (new_active, targets, fence) = match c.kind {
            Kind::Drop => {
                let eff = c.ranks & g.active;
                if eff == 0 || g.active & !eff & alive == 0 {
                    if let Some(c) = g.changes.pop_front() {
                        for w in c.waiters {
                            reply(out, w, ProposalStatus::Applied, g.epoch, 0, "");
                        }
                    }
                    continue;
                }
                (g.active & !eff, 0, eff)
            }
            Kind::Deactivate => {
                let eff = c.ranks & g.active;
                let why = (g.active & !eff == 0).then(|| {
                    format!(
                        "deactivating rank(s) {:?} would leave process group {} without an active rank",
                        list(eff),
                        g.label
                    )
                });
                if eff == 0 || why.is_some() {
                    if let Some(c) = g.changes.pop_front() {
                        let (st, why) = match &why {
                            Some(w) => (ProposalStatus::Rejected, w.as_str()),
                            None => (ProposalStatus::Applied, ""),
                        };
                        for w in c.waiters {
                            reply(out, w, st, g.epoch, 0, why);
                        }
                    }
                    continue;
                }
                (g.active & !eff, 0, 0)
            }
            Kind::Activate => {
                let mut targets = c.ranks & !g.active & !c.dropped;
                for s in slots(targets) {
                    if !g
                        .members
                        .get(s)
                        .and_then(|m| m.as_ref())
                        .is_some_and(|m| m.alive)
                    {
                        c.dropped |= bit(s);
                        targets &= !bit(s);
                    }
                }
                let waiting = slots(targets)
                    .filter(|&s| {
                        g.members
                            .get(s)
                            .and_then(|m| m.as_ref())
                            .is_some_and(|m| m.state != MState::Awaiting)
                    })
                    .fold(0u64, |a, s| a | bit(s));
                if waiting != 0 {
                    if now < c.deadline {
                        return;
                    }
                    c.dropped |= waiting;
                    if c.reason.is_empty() {
                        c.reason = format!(
                            "rank(s) {:?} did not call join_group within the admission timeout",
                            list(waiting)
                        );
                    }
                    continue;
                }
                if targets == 0 {
                    if let Some(c) = g.changes.pop_front() {
                        let activated = c.ranks & !c.dropped;
                        let (st, why) = if c.dropped == 0 {
                            (ProposalStatus::Applied, String::new())
                        } else if activated == 0 {
                            let why = if c.reason.is_empty() {
                                format!(
                                    "rank(s) {:?} left before they could be activated",
                                    list(c.dropped)
                                )
                            } else {
                                c.reason.clone()
                            };
                            (ProposalStatus::Rejected, why)
                        } else {
                            (ProposalStatus::AppliedWithDroppedRanks, String::new())
                        };
                        for w in c.waiters {
                            reply(out, w, st, g.epoch, c.dropped, &why);
                        }
                    }
                    continue;
                }
                (g.active | targets, targets, 0)
            }
        };
        let kind = c.kind;
        let old = g.active & alive;
        let participants = match kind {
            Kind::Activate => old | targets,
            Kind::Deactivate => old,
            Kind::Drop => new_active & alive,
        };
        *next_txn += 1;
        let t = Txn {
            id: *next_txn,
            new_active,
            participants,
            old: old & participants,
            targets,
            ready: 0,
            next_seq: 0,
            phase: Phase::Prepare,
            deadline: now + config::collective_timeout(),
            retry: now + PREPARE_RETRY,
            acked: 0,
            fence,
        };
        let msg = ToAgent::Prepare {
            group: g.key,
            txn: t.id,
            active: new_active,
            members: g.recs_of(new_active),
        };
        g.to(participants, &msg, out);
        g.txn = Some(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clique_keeps_the_connected_majority_and_lower_ranks_on_ties() {
        let mut v = [0u32; 64];
        // 0-1 broken, each accusing the other: keep {0, 2}.
        v[0] = 1;
        v[1] = 1;
        assert_eq!(max_clique(0b111, &[(0, 1), (1, 0)], &v), 0b101);
        // 3 cut from everyone: keep {0, 1, 2}.
        let mut v = [0u32; 64];
        v[3] = 3;
        assert_eq!(max_clique(0b1111, &[(0, 3), (1, 3), (2, 3)], &v), 0b0111);
        // Only 3 noticed that 1 is gone: drop the accused 1, not 3.
        let mut v = [0u32; 64];
        v[1] = 1;
        assert_eq!(max_clique(0b1111, &[(3, 1)], &v), 0b1101);
        // Two ranks that cannot see each other, no accusation: keep the lower.
        assert_eq!(max_clique(0b11, &[(1, 0)], &[0; 64]), 0b01);
        assert_eq!(max_clique(0b1011, &[], &[0; 64]), 0b1011);
    }

    #[test]
    fn masks() {
        assert_eq!(full(3), 0b111);
        assert_eq!(full(64), u64::MAX);
        assert_eq!(list(0b1010), vec![1, 3]);
    }
}
