//! One group's membership: its members and their states, the queue of
//! changes, the two-phase view-change transaction, reconciliation of link
//! reports, and the rules that decide them.

use super::rankset::RankSet;
use crate::config;
use crate::membership::control::{MemberRec, ProposalStatus, SyncStatus, ToAgent, ViewCommit};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How often a prepare is re-sent to members that were not ready yet.
const PREPARE_RETRY: Duration = Duration::from_millis(20);

/// Where a registered member stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MState {
    /// Registered, not ready for activation.
    Inactive,
    /// Called `join_group`.
    Awaiting,
    /// In the active set.
    Active,
}

/// A registered member.
pub(super) struct CMember {
    /// The control session it registered on.
    pub(super) sess: u64,
    pub(super) rec: MemberRec,
    pub(super) state: MState,
    pub(super) alive: bool,
}

/// What a queued change does to the active set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Activate,
    Deactivate,
    Drop,
}

/// A request answered when a change is decided: `(session, request id)`.
#[derive(Clone, Copy, Debug)]
pub(super) enum Waiter {
    Propose(u64, u64),
    Sync(u64, u64),
}

/// A queued membership change.
pub(super) struct Change {
    pub(super) kind: Kind,
    /// The ranks it activates, deactivates or drops.
    pub(super) ranks: RankSet,
    pub(super) waiters: Vec<Waiter>,
    /// An activation gives up on targets that have not joined by then.
    pub(super) deadline: Instant,
    /// Ranks left out of it (reported to the waiters).
    pub(super) dropped: RankSet,
    /// Why, when it is rejected.
    pub(super) reason: String,
}

/// The phase of a view-change transaction.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Prepare,
    Commit,
}

/// A running view change (see the module documentation of the coordinator).
pub(super) struct Txn {
    pub(super) id: u64,
    /// The active set of the new view.
    pub(super) new_active: RankSet,
    /// Who must prepare and commit.
    pub(super) participants: RankSet,
    /// Participants of the old view (their `next_seq` counts).
    pub(super) old: RankSet,
    /// Ranks being activated.
    pub(super) targets: RankSet,
    /// Participants that prepared with every link up.
    pub(super) ready: RankSet,
    /// The highest `next_seq` reported: where the new view starts.
    pub(super) next_seq: u64,
    pub(super) phase: Phase,
    pub(super) deadline: Instant,
    /// When the prepare is sent again to those not ready.
    pub(super) retry: Instant,
    /// Participants that acknowledged the commit.
    pub(super) acked: RankSet,
    /// Ranks dropped for failure, whose links members fence.
    pub(super) fence: RankSet,
}

/// A reconciliation of link reports.
pub(super) struct Recon {
    /// The window's end: decided then with the reports at hand.
    pub(super) deadline: Instant,
    /// Each reporter's dead links.
    pub(super) reports: HashMap<usize, RankSet>,
    /// Who reported.
    pub(super) reported: RankSet,
    /// Who asked for the decision (`sync_after_failure`, or a failed op of
    /// an `auto_sync_on_failure` group).
    pub(super) synced: RankSet,
    /// Members whose process ended.
    pub(super) offline: RankSet,
    pub(super) waiters: Vec<Waiter>,
}

/// A joiner's registration waiting for its group to be founded.
pub(super) struct PendingReg {
    pub(super) sess: u64,
    pub(super) req: u64,
    pub(super) rec: MemberRec,
    pub(super) deadline: Instant,
}

/// One group's membership.
pub(super) struct CGroup {
    pub(super) key: u64,
    pub(super) label: String,
    pub(super) capacity: usize,
    pub(super) founding_capacity: usize,
    pub(super) size: usize,
    pub(super) founded: RankSet,
    pub(super) auto: bool,
    pub(super) epoch: u64,
    pub(super) active: RankSet,
    pub(super) members: Vec<Option<CMember>>,
    pub(super) next_order: u64,
    pub(super) pending_regs: Vec<PendingReg>,
    pub(super) changes: VecDeque<Change>,
    pub(super) txn: Option<Txn>,
    pub(super) recon: Option<Recon>,
    /// Ranks the last reconciliation found unhealthy but kept in the view
    /// (framework-managed mode): further reports about them are answered at
    /// once.
    pub(super) known_bad: RankSet,
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
            founded: RankSet::EMPTY,
            auto: true,
            epoch: 0,
            active: RankSet::EMPTY,
            members: (0..capacity).map(|_| None).collect(),
            next_order: 0,
            pending_regs: Vec::new(),
            changes: VecDeque::new(),
            txn: None,
            recon: None,
            known_bad: RankSet::EMPTY,
        }
    }

    pub(super) fn grow(&mut self, capacity: usize) {
        self.capacity = self.capacity.max(capacity).min(RankSet::CAPACITY);
        while self.members.len() < self.capacity {
            self.members.push(None);
        }
    }

    pub(super) fn is_founded(&self) -> bool {
        self.size > 0 && self.founded == RankSet::first(self.size)
    }

    pub(super) fn alive(&self) -> RankSet {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.as_ref().is_some_and(|m| m.alive))
            .map(|(i, _)| i)
            .collect()
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

    pub(super) fn recs_of(&self, set: RankSet) -> Vec<MemberRec> {
        set.iter()
            .filter_map(|s| self.member(s).map(|m| m.rec.clone()))
            .collect()
    }

    pub(super) fn to(&self, set: RankSet, msg: &ToAgent, out: &mut Out) {
        for s in set.iter() {
            if let Some(m) = self.member(s).filter(|m| m.alive) {
                out.push((m.sess, msg.clone()));
            }
        }
    }

    pub(super) fn broadcast_except(&self, slot: usize, msg: &ToAgent, out: &mut Out) {
        self.to(self.alive() - RankSet::one(slot), msg, out);
    }
}

pub(super) fn reply(
    out: &mut Out,
    w: Waiter,
    status: ProposalStatus,
    epoch: u64,
    dropped: RankSet,
    reason: &str,
) {
    match w {
        Waiter::Propose(sess, req) => out.push((
            sess,
            ToAgent::Proposed {
                req,
                status,
                epoch,
                dropped: dropped.to_vec(),
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

/// Answers `w` that its change was rejected for `reason` at `epoch`.
pub(super) fn reject(out: &mut Out, w: Waiter, epoch: u64, reason: &str) {
    reply(
        out,
        w,
        ProposalStatus::Rejected,
        epoch,
        RankSet::EMPTY,
        reason,
    );
}

/// The largest set of candidates without a down link between any two of
/// them. Among sets of that size, the one that drops the most-accused ranks
/// wins (`votes[r]`: how many members reported `r` unreachable, so a rank
/// that reported a dead peer is not dropped in its place), then the one
/// whose lowest differing rank is kept.
pub(super) fn max_clique(
    cand: RankSet,
    down: &[(usize, usize)],
    votes: &[u32; RankSet::CAPACITY],
) -> RankSet {
    let accused = |set: RankSet| -> u32 { (cand - set).iter().map(|s| votes[s]).sum() };
    let better = |a: RankSet, b: RankSet| -> bool {
        let (ca, cb) = (a.len(), b.len());
        if ca != cb {
            return ca > cb;
        }
        let (va, vb) = (accused(a), accused(b));
        if va != vb {
            return va > vb;
        }
        // The lowest rank in which they differ is in `a`.
        let differ = (a - b) | (b - a);
        differ.lowest().is_some_and(|r| a.contains(r))
    };
    fn rec(
        set: RankSet,
        down: &[(usize, usize)],
        votes: &[u32; RankSet::CAPACITY],
        best: &mut Option<RankSet>,
        better: &dyn Fn(RankSet, RankSet) -> bool,
    ) {
        if best.is_some_and(|b| set.len() < b.len()) {
            return;
        }
        match down
            .iter()
            .find(|&&(a, b)| set.contains(a) && set.contains(b))
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
                rec(set - RankSet::one(first), down, votes, best, better);
                rec(set - RankSet::one(second), down, votes, best, better);
            }
        }
    }
    let mut best = None;
    rec(cand, down, votes, &mut best, &better);
    best.unwrap_or(RankSet::EMPTY)
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
    rec: MemberRec,
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
        g.active = RankSet::first(size);
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
    if g.member(slot).is_some_and(|m| m.alive) || g.founded.contains(slot) {
        out.push((
            sess,
            failed(
                req,
                &format!("rank {slot} of process group {} registered twice", g.label),
            ),
        ));
        return;
    }
    g.founded |= RankSet::one(slot);
    admit(g, sess, req, rec, MState::Active, out);
}

pub(super) fn register_joiner(g: &mut CGroup, sess: u64, req: u64, rec: MemberRec, out: &mut Out) {
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
    g.known_bad -= RankSet::one(slot);
    admit(g, sess, req, rec, MState::Inactive, out);
}

/// Seat a registrant in its slot (in `state`), announce it to the others
/// and answer it with the group as it stands.
fn admit(g: &mut CGroup, sess: u64, req: u64, mut rec: MemberRec, state: MState, out: &mut Out) {
    let slot = rec.slot;
    rec.order = g.next_order;
    g.next_order += 1;
    g.members[slot] = Some(CMember {
        sess,
        rec: rec.clone(),
        state,
        alive: true,
    });
    g.broadcast_except(slot, &ToAgent::Member { group: g.key, rec }, out);
    out.push((
        sess,
        ToAgent::Registered {
            req,
            capacity: g.capacity,
            epoch: g.epoch,
            active: g.active.bits(),
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
    let was_active = g.active.contains(slot);
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
            r.offline |= RankSet::one(slot);
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
        reported: RankSet::EMPTY,
        synced: RankSet::EMPTY,
        offline: RankSet::EMPTY,
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
    dead: RankSet,
    now: Instant,
    out: &mut Out,
) {
    let is_member = g
        .member(slot)
        .is_some_and(|m| m.rec.member_id == member_id && m.alive);
    if !is_member || !g.active.contains(slot) {
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
    let evidence = (dead & g.active) - RankSet::one(slot);
    if config::log_info() && !evidence.is_empty() {
        eprintln!(
            "mooncake-pg: process group {}: rank {slot} reports rank(s) {:?} unreachable",
            g.label,
            evidence.to_vec()
        );
    }
    let pending = g.recon.is_some() || g.changes.iter().any(|c| c.kind == Kind::Drop);
    if !pending && !evidence.is_empty() && evidence.is_subset(g.known_bad) {
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
    if evidence.is_empty() && !pending {
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
    if !evidence.is_empty() {
        open_recon(g, now, out);
    }
    let w = Waiter::Sync(sess, req);
    if let Some(r) = g.recon.as_mut() {
        r.reports.insert(slot, dead);
        r.reported |= RankSet::one(slot);
        if req != 0 {
            r.synced |= RankSet::one(slot);
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
    let refuse = |out: &mut Out, why: String| reject(out, w, g.epoch, &why);
    if !g.member(slot).is_some_and(|m| m.alive) {
        return refuse(
            out,
            format!(
                "rank {slot} is not a registered member of process group {}",
                g.label
            ),
        );
    }
    if ranks.is_empty() {
        return refuse(out, "no ranks given".into());
    }
    let mut mask = RankSet::EMPTY;
    for &r in ranks {
        if r >= g.capacity {
            return refuse(
                out,
                format!(
                    "rank {r} is outside process group {} (capacity {})",
                    g.label, g.capacity
                ),
            );
        }
        mask |= RankSet::one(r);
    }
    if activate {
        let absent: Vec<usize> = (mask - g.active)
            .iter()
            .filter(|&r| !g.member(r).is_some_and(|m| m.alive))
            .collect();
        if !absent.is_empty() {
            return refuse(
                out,
                format!(
                    "rank(s) {absent:?} of process group {} have no registered process (never \
                     initialized with is_extension=True, or the process ended)",
                    g.label
                ),
            );
        }
    } else if g.active.is_subset(mask) {
        return refuse(
            out,
            format!(
                "deactivating rank(s) {:?} would leave process group {} without an active rank",
                (mask & g.active).to_vec(),
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
        dropped: RankSet::EMPTY,
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
    let cand = (g.active & alive) - r.offline;
    let suspects = r.reports.values().fold(RankSet::EMPTY, |a, &d| a | d) & cand;
    let needed = cand - suspects;
    // Before the window ends, an auto-deactivating group decides once every
    // member it needs reported its links. A framework-managed group waits
    // until each of them also asked for the decision: its survivors call
    // `sync_after_failure` where their program is ready for a new view, and
    // a view change a survivor proposes after its own sync must not reach a
    // survivor that has not yet got that far.
    let heard = if g.auto { r.reported } else { r.synced };
    if !needed.is_subset(heard) && now < r.deadline {
        return;
    }
    let mut down = Vec::new();
    let mut votes = [0u32; RankSet::CAPACITY];
    for (&a, &d) in &r.reports {
        for b in (d & cand).iter() {
            if cand.contains(a) && a != b {
                down.push((a, b));
                votes[b] += 1;
            }
        }
    }
    let keep = max_clique(cand, &down, &votes);
    let drop = g.active - keep;
    if config::log_info() {
        eprintln!(
            "mooncake-pg: process group {}: reconciled: candidates {:?}, reports {:?}, keep {:?}, drop {:?}",
            g.label,
            cand.to_vec(),
            r.reports.iter().map(|(k, v)| (*k, v.to_vec())).collect::<Vec<_>>(),
            keep.to_vec(),
            drop.to_vec()
        );
    }
    let Some(r) = g.recon.take() else { return };
    if g.auto && !drop.is_empty() && !keep.is_empty() {
        push_urgent(
            g,
            Change {
                kind: Kind::Drop,
                ranks: drop,
                waiters: r.waiters,
                deadline: now,
                dropped: RankSet::EMPTY,
                reason: String::new(),
            },
        );
    } else {
        g.known_bad = drop;
        for w in r.waiters {
            reply(out, w, ProposalStatus::Applied, g.epoch, RankSet::EMPTY, "");
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
            let dead = t.participants - alive;
            if !g.auto && !dead.is_subset(t.targets) {
                // Framework-managed: a dead member stays in the view; go on without it.
                t.participants -= dead - t.targets;
                t.old &= alive;
            }
            let dead = t.participants - alive;
            if t.ready == t.participants && dead.is_empty() {
                t.phase = Phase::Commit;
                t.deadline = now + config::collective_timeout();
                let msg = ToAgent::Commit {
                    group: g.key,
                    view: ViewCommit {
                        txn: t.id,
                        epoch: g.epoch + 1,
                        active: t.new_active.bits(),
                        from_seq: t.next_seq,
                        capacity: g.capacity,
                        fence: t.fence.bits(),
                    },
                };
                let parts = t.participants;
                g.to(parts, &msg, out);
                return;
            }
            let missing = if now >= t.deadline {
                t.participants - t.ready
            } else {
                dead
            };
            if !missing.is_empty() {
                if config::log_info() {
                    eprintln!(
                        "mooncake-pg: process group {}: view change {} lacks rank(s) {:?} (dead {:?})",
                        g.label,
                        t.id,
                        missing.to_vec(),
                        dead.to_vec()
                    );
                }
                let targets = t.targets;
                abort_txn(g, out);
                let bad_targets = missing & targets;
                let bad_old = missing - targets;
                if !bad_targets.is_empty() {
                    if let Some(c) = g.changes.front_mut() {
                        c.dropped |= bad_targets;
                    }
                }
                if !bad_old.is_empty() {
                    if g.auto {
                        g.changes.push_front(Change {
                            kind: Kind::Drop,
                            ranks: bad_old,
                            waiters: Vec::new(),
                            deadline: now,
                            dropped: RankSet::EMPTY,
                            reason: String::new(),
                        });
                    } else if let Some(c) = g.changes.pop_front() {
                        let why = format!(
                            "rank(s) {:?} of process group {} did not acknowledge the view change",
                            bad_old.to_vec(),
                            g.label
                        );
                        for w in c.waiters {
                            reject(out, w, g.epoch, &why);
                        }
                    }
                }
                return;
            }
            if now >= t.retry && t.ready != t.participants {
                t.retry = now + PREPARE_RETRY;
                let (id, active, pending) = (t.id, t.new_active, t.participants - t.ready);
                let msg = ToAgent::Prepare {
                    group: g.key,
                    txn: id,
                    active: active.bits(),
                    members: g.recs_of(active),
                };
                g.to(pending, &msg, out);
            }
        }
        Phase::Commit => {
            if t.participants.is_subset(t.acked | !alive) || now >= t.deadline {
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
    for s in (t.new_active - prev).iter() {
        if let Some(Some(m)) = g.members.get_mut(s) {
            m.state = MState::Active;
        }
    }
    for s in (prev - t.new_active).iter() {
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
            g.to(prev - t.new_active, &fenced, out);
        }
        let (status, dropped) = if !c.dropped.is_empty() {
            (ProposalStatus::AppliedWithDroppedRanks, c.dropped)
        } else {
            (ProposalStatus::Applied, RankSet::EMPTY)
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
            g.active.to_vec()
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
                if eff.is_empty() || ((g.active - eff) & alive).is_empty() {
                    if let Some(c) = g.changes.pop_front() {
                        for w in c.waiters {
                            reply(out, w, ProposalStatus::Applied, g.epoch, RankSet::EMPTY, "");
                        }
                    }
                    continue;
                }
                (g.active - eff, RankSet::EMPTY, eff)
            }
            Kind::Deactivate => {
                let eff = c.ranks & g.active;
                let why = g.active.is_subset(eff).then(|| {
                    format!(
                        "deactivating rank(s) {:?} would leave process group {} without an active rank",
                        eff.to_vec(),
                        g.label
                    )
                });
                if eff.is_empty() || why.is_some() {
                    if let Some(c) = g.changes.pop_front() {
                        let (st, why) = match &why {
                            Some(w) => (ProposalStatus::Rejected, w.as_str()),
                            None => (ProposalStatus::Applied, ""),
                        };
                        for w in c.waiters {
                            reply(out, w, st, g.epoch, RankSet::EMPTY, why);
                        }
                    }
                    continue;
                }
                (g.active - eff, RankSet::EMPTY, RankSet::EMPTY)
            }
            Kind::Activate => {
                let mut targets = c.ranks - g.active - c.dropped;
                for s in targets.iter() {
                    if !g
                        .members
                        .get(s)
                        .and_then(|m| m.as_ref())
                        .is_some_and(|m| m.alive)
                    {
                        c.dropped.insert(s);
                        targets.remove(s);
                    }
                }
                let waiting: RankSet = targets
                    .iter()
                    .filter(|&s| {
                        g.members
                            .get(s)
                            .and_then(|m| m.as_ref())
                            .is_some_and(|m| m.state != MState::Awaiting)
                    })
                    .collect();
                if !waiting.is_empty() {
                    if now < c.deadline {
                        return;
                    }
                    c.dropped |= waiting;
                    if c.reason.is_empty() {
                        c.reason = format!(
                            "rank(s) {:?} did not call join_group within the admission timeout",
                            waiting.to_vec()
                        );
                    }
                    continue;
                }
                if targets.is_empty() {
                    if let Some(c) = g.changes.pop_front() {
                        let activated = c.ranks - c.dropped;
                        let (st, why) = if c.dropped.is_empty() {
                            (ProposalStatus::Applied, String::new())
                        } else if activated.is_empty() {
                            let why = if c.reason.is_empty() {
                                format!(
                                    "rank(s) {:?} left before they could be activated",
                                    c.dropped.to_vec()
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
                (g.active | targets, targets, RankSet::EMPTY)
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
            ready: RankSet::EMPTY,
            next_seq: 0,
            phase: Phase::Prepare,
            deadline: now + config::collective_timeout(),
            retry: now + PREPARE_RETRY,
            acked: RankSet::EMPTY,
            fence,
        };
        let msg = ToAgent::Prepare {
            group: g.key,
            txn: t.id,
            active: new_active.bits(),
            members: g.recs_of(new_active),
        };
        g.to(participants, &msg, out);
        g.txn = Some(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(bits: u64) -> RankSet {
        RankSet::from_bits(bits)
    }

    #[test]
    fn clique_keeps_the_connected_majority_and_lower_ranks_on_ties() {
        let mut v = [0u32; 64];
        // 0-1 broken, each accusing the other: keep {0, 2}.
        v[0] = 1;
        v[1] = 1;
        assert_eq!(max_clique(set(0b111), &[(0, 1), (1, 0)], &v), set(0b101));
        // 3 cut from everyone: keep {0, 1, 2}.
        let mut v = [0u32; 64];
        v[3] = 3;
        assert_eq!(
            max_clique(set(0b1111), &[(0, 3), (1, 3), (2, 3)], &v),
            set(0b0111)
        );
        // Only 3 noticed that 1 is gone: drop the accused 1, not 3.
        let mut v = [0u32; 64];
        v[1] = 1;
        assert_eq!(max_clique(set(0b1111), &[(3, 1)], &v), set(0b1101));
        // Two ranks that cannot see each other, no accusation: keep the lower.
        assert_eq!(max_clique(set(0b11), &[(1, 0)], &[0; 64]), set(0b01));
        assert_eq!(max_clique(set(0b1011), &[], &[0; 64]), set(0b1011));
        // A report naming a rank beyond the capacity is ignored.
        assert_eq!(max_clique(set(0b11), &[(0, 99)], &[0; 64]), set(0b11));
    }
}
