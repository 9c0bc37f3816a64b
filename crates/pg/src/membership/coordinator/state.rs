//! The coordinator's state machine: every group's members, queued
//! changes, running view-change transaction and reconciliation, driven by
//! [`Input`]s and explicit times.

use super::group::{
    failed, member_gone, propose, register_founder, register_joiner, reject, sync, tick_group,
    CGroup, MState, Out, PendingReg, Phase, Waiter,
};
use super::rankset::RankSet;
use crate::membership::control::{SyncStatus, ToAgent, ToCoord};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long a joiner's registration may wait for its group to be founded.
const FOUNDING_WAIT: Duration = Duration::from_secs(600);

/// What happened on the coordinator's sessions.
#[derive(Debug)]
pub(super) enum Input {
    /// A message from the agent on session `.0`.
    Msg(u64, ToCoord),
    /// Session `.0` closed (its process ended, or it left).
    Closed(u64),
}

/// Every group's membership state: fed inputs and the time, it answers
/// with the messages to send (`(session, message)` pairs). It opens no
/// socket and reads no clock, so tests drive it with explicit times.
#[derive(Default)]
pub(super) struct State {
    groups: HashMap<u64, CGroup>,
    tombstones: HashSet<u64>,
    next_txn: u64,
}

impl State {
    /// When [`State::tick`] has work next (none: only an input brings
    /// any).
    pub(super) fn next_wake(&self) -> Option<Instant> {
        let mut wake: Option<Instant> = None;
        let mut at = |t: Instant| wake = Some(wake.map_or(t, |w: Instant| w.min(t)));
        for g in self.groups.values() {
            if let Some(r) = &g.recon {
                at(r.deadline);
            }
            if let Some(t) = &g.txn {
                at(t.deadline);
                if t.phase == Phase::Prepare && t.ready != t.participants {
                    at(t.retry);
                }
            }
            if let Some(c) = g.changes.front() {
                at(c.deadline);
            }
            for p in &g.pending_regs {
                at(p.deadline);
            }
        }
        wake
    }

    /// Apply `input`, received at `now`; the messages it causes.
    pub(super) fn handle(&mut self, input: Input, now: Instant) -> Out {
        let mut out = Out::new();
        match input {
            Input::Msg(id, msg) => self.on_msg(id, msg, now, &mut out),
            Input::Closed(id) => self.on_closed(id, now, &mut out),
        }
        out
    }

    /// Run what is due at `now` (deadlines, retries, queued changes); the
    /// messages it causes.
    pub(super) fn tick(&mut self, now: Instant) -> Out {
        let mut out = Out::new();
        let keys: Vec<u64> = self.groups.keys().copied().collect();
        for k in keys {
            if let Some(g) = self.groups.get_mut(&k) {
                tick_group(g, now, &mut self.next_txn, &mut out);
            }
        }
        out
    }

    fn on_closed(&mut self, sess: u64, now: Instant, out: &mut Out) {
        let mut empty = Vec::new();
        for (key, g) in self.groups.iter_mut() {
            g.pending_regs.retain(|p| p.sess != sess);
            let gone: Vec<usize> = g
                .members
                .iter()
                .enumerate()
                .filter(|(_, m)| m.as_ref().is_some_and(|m| m.sess == sess && m.alive))
                .map(|(i, _)| i)
                .collect();
            for slot in gone {
                member_gone(g, slot, true, now, out);
            }
            if g.alive().is_empty() {
                empty.push(*key);
            }
        }
        for k in empty {
            self.groups.remove(&k);
            self.tombstones.insert(k);
        }
    }

    fn on_msg(&mut self, sess: u64, msg: ToCoord, now: Instant, out: &mut Out) {
        match msg {
            ToCoord::Register {
                req,
                group,
                label,
                rec,
                capacity,
                size,
                extension,
                auto_deactivate,
            } => {
                if self.tombstones.contains(&group) {
                    out.push((
                        sess,
                        ToAgent::Registered {
                            req,
                            capacity,
                            epoch: 0,
                            active: 0,
                            members: Vec::new(),
                            closed: true,
                        },
                    ));
                    return;
                }
                let g = self
                    .groups
                    .entry(group)
                    .or_insert_with(|| CGroup::new(group, label, capacity.min(RankSet::CAPACITY)));
                if extension {
                    if g.is_founded() {
                        register_joiner(g, sess, req, rec, out);
                    } else {
                        g.pending_regs.push(PendingReg {
                            sess,
                            req,
                            rec,
                            deadline: now + FOUNDING_WAIT,
                        });
                    }
                } else {
                    register_founder(g, sess, req, rec, capacity, size, auto_deactivate, out);
                    if g.is_founded() {
                        for p in std::mem::take(&mut g.pending_regs) {
                            register_joiner(g, p.sess, p.req, p.rec, out);
                        }
                    }
                }
            }
            ToCoord::Leave {
                group,
                slot,
                member_id,
            } => {
                let Some(g) = self.groups.get_mut(&group) else {
                    return;
                };
                if g.member(slot)
                    .is_some_and(|m| m.rec.member_id == member_id && m.alive)
                {
                    member_gone(g, slot, false, now, out);
                }
                if g.alive().is_empty() {
                    self.groups.remove(&group);
                    self.tombstones.insert(group);
                }
            }
            ToCoord::Join {
                req,
                group,
                slot,
                member_id,
            } => {
                let Some(g) = self.groups.get_mut(&group) else {
                    out.push((
                        sess,
                        failed(req, "join_group: the group is unknown to the coordinator"),
                    ));
                    return;
                };
                let label = g.label.clone();
                match g.members.get_mut(slot).and_then(|m| m.as_mut()) {
                    Some(m) if m.rec.member_id == member_id && m.alive => match m.state {
                        MState::Active => out.push((
                            sess,
                            failed(
                                req,
                                &format!("rank {slot} is already active in group {label}"),
                            ),
                        )),
                        _ => {
                            m.state = MState::Awaiting;
                            out.push((sess, ToAgent::Done { req }));
                        }
                    },
                    _ => out.push((
                        sess,
                        failed(
                            req,
                            &format!("rank {slot} is not registered in group {label}"),
                        ),
                    )),
                }
            }
            ToCoord::Unjoin {
                group,
                slot,
                member_id,
            } => {
                if let Some(m) = self
                    .groups
                    .get_mut(&group)
                    .and_then(|g| g.members.get_mut(slot))
                    .and_then(|m| m.as_mut())
                {
                    if m.rec.member_id == member_id && m.state == MState::Awaiting {
                        m.state = MState::Inactive;
                    }
                }
            }
            ToCoord::Propose {
                req,
                group,
                slot,
                activate,
                ranks,
                admission_ms,
            } => {
                let w = Waiter::Propose(sess, req);
                let Some(g) = self.groups.get_mut(&group) else {
                    reject(out, w, 0, "the group is unknown to the coordinator");
                    return;
                };
                propose(g, slot, activate, &ranks, admission_ms, w, now, out);
            }
            ToCoord::Sync {
                req,
                group,
                slot,
                member_id,
                dead,
            } => {
                let Some(g) = self.groups.get_mut(&group) else {
                    if req != 0 {
                        out.push((
                            sess,
                            ToAgent::Synced {
                                req,
                                status: SyncStatus::Rejected,
                                epoch: 0,
                                reason: "the group is unknown to the coordinator".into(),
                            },
                        ));
                    }
                    return;
                };
                let dead = RankSet::from_bits(dead);
                sync(g, sess, req, slot, member_id, dead, now, out);
            }
            ToCoord::Links { group, slot, dead } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    // Only a live member's own session reports its links.
                    let own = g.member(slot).is_some_and(|m| m.alive && m.sess == sess);
                    if let Some(r) = g.recon.as_mut().filter(|_| own) {
                        r.reports.insert(slot, RankSet::from_bits(dead));
                        r.reported |= RankSet::one(slot);
                    }
                }
            }
            ToCoord::PrepareAck {
                group,
                txn,
                slot,
                next_seq,
                ready,
            } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    if let Some(t) = g
                        .txn
                        .as_mut()
                        .filter(|t| t.id == txn && t.phase == Phase::Prepare)
                    {
                        if t.participants.contains(slot) {
                            if ready {
                                t.ready |= RankSet::one(slot);
                            }
                            if t.old.contains(slot) {
                                t.next_seq = t.next_seq.max(next_seq);
                            }
                        }
                    }
                }
            }
            ToCoord::CommitAck { group, txn, slot } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    if let Some(t) = g
                        .txn
                        .as_mut()
                        .filter(|t| t.id == txn && t.phase == Phase::Commit)
                    {
                        t.acked |= RankSet::one(slot);
                    }
                }
            }
            ToCoord::Extend { group, capacity } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.grow(capacity);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The state machine driven without sockets or a clock: each test feeds
    //! inputs at explicit times and checks the messages that come out.

    use super::*;
    use crate::config;
    use crate::membership::control::{MemberRec, ProposalStatus, ViewCommit};

    const G: u64 = 77;

    fn rec(slot: usize) -> MemberRec {
        MemberRec {
            slot,
            member_id: 1000 + slot as u64,
            endpoint: format!("10.0.0.{slot}:5000"),
            host: format!("h{slot}"),
            ..MemberRec::default()
        }
    }

    /// Session ids: rank `r` talks on session `r + 1`.
    fn sess(r: usize) -> u64 {
        r as u64 + 1
    }

    /// Rank `r`'s registration in a group of `size` with `cap` slots.
    fn registration(r: usize, size: usize, cap: usize, auto_deactivate: bool) -> ToCoord {
        ToCoord::Register {
            req: 10 + r as u64,
            group: G,
            label: "g".into(),
            rec: rec(r),
            capacity: cap,
            size,
            extension: r >= size,
            auto_deactivate,
        }
    }

    fn register(st: &mut State, r: usize, size: usize, cap: usize, t: Instant) -> Out {
        msg(st, r, registration(r, size, cap, true), t)
    }

    /// A group founded by ranks `0..size` at `t`.
    fn founded(size: usize, cap: usize, t: Instant) -> State {
        let mut st = State::default();
        for r in 0..size {
            let out = register(&mut st, r, size, cap, t);
            assert!(
                out.iter()
                    .any(|(s, m)| *s == sess(r) && matches!(m, ToAgent::Registered { .. })),
                "rank {r} not registered: {out:?}"
            );
        }
        st
    }

    fn to(out: &Out, r: usize) -> Vec<&ToAgent> {
        out.iter()
            .filter(|(s, _)| *s == sess(r))
            .map(|(_, m)| m)
            .collect()
    }

    fn msg(st: &mut State, r: usize, m: ToCoord, t: Instant) -> Out {
        st.handle(Input::Msg(sess(r), m), t)
    }

    /// Rank `r`'s report of its dead links.
    fn links(r: usize, dead: RankSet) -> ToCoord {
        ToCoord::Links {
            group: G,
            slot: r,
            dead: dead.bits(),
        }
    }

    /// Rank `r`'s `sync_after_failure` (request `req`) with its dead links.
    fn sync(r: usize, req: u64, dead: RankSet) -> ToCoord {
        ToCoord::Sync {
            req,
            group: G,
            slot: r,
            member_id: 1000 + r as u64,
            dead: dead.bits(),
        }
    }

    /// The prepare every rank of `ranks` got, as `(txn, active mask)`.
    fn prepared(out: &Out, ranks: &[usize]) -> (u64, u64) {
        let mut seen = None;
        for &r in ranks {
            let p = to(out, r).into_iter().find_map(|m| match m {
                ToAgent::Prepare { txn, active, .. } => Some((*txn, *active)),
                _ => None,
            });
            let p = p.unwrap_or_else(|| panic!("rank {r} got no prepare: {out:?}"));
            assert!(seen.is_none_or(|s| s == p));
            seen = Some(p);
        }
        seen.unwrap_or_default()
    }

    fn ack_prepare(st: &mut State, ranks: &[(usize, u64)], txn: u64, t: Instant) {
        for &(r, next_seq) in ranks {
            let m = ToCoord::PrepareAck {
                group: G,
                txn,
                slot: r,
                next_seq,
                ready: true,
            };
            assert!(msg(st, r, m, t).is_empty());
        }
    }

    fn ack_commit(st: &mut State, ranks: &[usize], txn: u64, t: Instant) {
        for &r in ranks {
            let m = ToCoord::CommitAck {
                group: G,
                txn,
                slot: r,
            };
            assert!(msg(st, r, m, t).is_empty());
        }
    }

    #[test]
    fn founders_register_once_and_with_one_shape() {
        let t = Instant::now();
        let mut st = founded(2, 4, t);
        // The second founder was announced to the first.
        let mut again = State::default();
        register(&mut again, 0, 2, 4, t);
        let out = register(&mut again, 1, 2, 4, t);
        assert!(to(&out, 0)
            .iter()
            .any(|m| matches!(m, ToAgent::Member { rec, .. } if rec.slot == 1)));
        // A rank registering twice, and a founder with another shape, fail.
        let out = register(&mut st, 1, 2, 4, t);
        assert!(
            matches!(to(&out, 1)[..], [ToAgent::Failed { reason, .. }] if reason.contains("twice"))
        );
        let mut st = State::default();
        register(&mut st, 0, 2, 4, t);
        let out = register(&mut st, 1, 3, 4, t);
        assert!(
            matches!(to(&out, 1)[..], [ToAgent::Failed { reason, .. }] if reason.contains("disagree"))
        );
        assert_eq!(st.next_wake(), None);
    }

    #[test]
    fn a_crash_is_reconciled_and_committed_at_the_highest_issued_seq() {
        let t0 = Instant::now();
        let mut st = founded(3, 3, t0);
        // Rank 2's process ends: the others are asked for their links, and
        // the window's end is the next wake-up.
        let out = st.handle(Input::Closed(sess(2)), t0);
        for r in [0, 1] {
            assert!(to(&out, r)
                .iter()
                .any(|m| matches!(m, ToAgent::Query { .. })));
        }
        let window = config::reconciliation_window();
        assert_eq!(st.next_wake(), Some(t0 + window));
        // One report: nothing is decided before the window closes.
        let t1 = t0 + Duration::from_millis(5);
        let report = |r: usize| links(r, RankSet::one(2));
        assert!(msg(&mut st, 0, report(0), t1).is_empty());
        assert!(st.tick(t1).is_empty());
        // Every unsuspected member reported: decided at once, well inside
        // the window; the view without rank 2 is prepared.
        assert!(msg(&mut st, 1, report(1), t1).is_empty());
        let out = st.tick(t1);
        let (txn, active) = prepared(&out, &[0, 1]);
        assert_eq!(active, 0b011);
        assert!(to(&out, 2).is_empty());
        // Prepared: the commit starts at the highest seq either issued.
        ack_prepare(&mut st, &[(0, 5), (1, 7)], txn, t1);
        let out = st.tick(t1);
        for r in [0, 1] {
            match to(&out, r)[..] {
                [ToAgent::Commit {
                    view:
                        ViewCommit {
                            epoch,
                            active,
                            from_seq,
                            fence,
                            ..
                        },
                    ..
                }] => {
                    assert_eq!((*epoch, *active, *from_seq), (1, 0b011, 7));
                    assert_eq!(*fence, 0b100);
                }
                ref other => panic!("rank {r}: {other:?}"),
            }
        }
        ack_commit(&mut st, &[0, 1], txn, t1);
        assert!(st.tick(t1).is_empty());
        assert_eq!(st.next_wake(), None);
        assert_eq!(st.groups[&G].epoch, 1);
        assert_eq!(st.groups[&G].active, RankSet::from_bits(0b011));
    }

    #[test]
    fn without_every_report_the_window_decides() {
        let t0 = Instant::now();
        let mut st = founded(3, 3, t0);
        st.handle(Input::Closed(sess(2)), t0);
        msg(&mut st, 0, links(0, RankSet::one(2)), t0);
        let window = config::reconciliation_window();
        let almost = t0 + window - Duration::from_millis(1);
        assert!(st.tick(almost).is_empty());
        let (_, active) = prepared(&st.tick(t0 + window), &[0, 1]);
        assert_eq!(active, 0b011);
    }

    #[test]
    fn a_framework_managed_group_decides_once_every_survivor_asked() {
        let t0 = Instant::now();
        let mut st = State::default();
        for r in 0..4 {
            msg(&mut st, r, registration(r, 4, 4, false), t0);
        }
        // Rank 1's process ends; rank 3's failed op reports it, and rank 3
        // asks for the decision. Ranks 0 and 2 answer the query before they
        // noticed anything.
        st.handle(Input::Closed(sess(1)), t0);
        msg(&mut st, 3, sync(3, 0, RankSet::one(1)), t0);
        msg(&mut st, 3, sync(3, 53, RankSet::one(1)), t0);
        msg(&mut st, 0, links(0, RankSet::EMPTY), t0);
        msg(&mut st, 2, links(2, RankSet::EMPTY), t0);
        let synced = |out: &Out, r: usize| {
            to(out, r).iter().any(|m| {
                matches!(
                    m,
                    ToAgent::Synced {
                        status: SyncStatus::Reconciled,
                        ..
                    }
                )
            })
        };
        // Every member reported, but only rank 3 asked: no answer yet.
        let t1 = t0 + Duration::from_millis(10);
        assert!(!synced(&st.tick(t1), 3));
        msg(&mut st, 2, sync(2, 52, RankSet::one(1)), t1);
        assert!(!synced(&st.tick(t1), 3));
        // The last survivor asks: all three get the decision at once, and
        // the view keeps every rank (only deactivate_ranks evicts).
        msg(&mut st, 0, sync(0, 50, RankSet::one(1)), t1);
        let out = st.tick(t1);
        for r in [0, 2, 3] {
            assert!(synced(&out, r), "rank {r}: {out:?}");
            assert!(!to(&out, r)
                .iter()
                .any(|m| matches!(m, ToAgent::Prepare { .. })));
        }
        // A survivor that never asks is waited for until the window ends.
        st.handle(Input::Closed(sess(2)), t1);
        msg(&mut st, 3, sync(3, 63, RankSet::one(2)), t1);
        let window = config::reconciliation_window();
        assert!(!synced(&st.tick(t1 + window - Duration::from_millis(1)), 3));
        assert!(synced(&st.tick(t1 + window), 3));
    }

    #[test]
    fn two_ranks_that_lost_each_other_keep_the_lower_and_fence_the_other() {
        let t0 = Instant::now();
        let mut st = founded(2, 2, t0);
        // Both alive, each reports the other dead (with a wait, req != 0).
        let lost = |r: usize, other: usize| sync(r, 50 + r as u64, RankSet::one(other));
        let out = msg(&mut st, 0, lost(0, 1), t0);
        assert!(to(&out, 1)
            .iter()
            .any(|m| matches!(m, ToAgent::Query { .. })));
        msg(&mut st, 1, lost(1, 0), t0);
        let out = st.tick(t0);
        let (txn, active) = prepared(&out, &[0]);
        assert_eq!(active, 0b01);
        assert!(to(&out, 1).is_empty(), "the dropped rank takes no part");
        ack_prepare(&mut st, &[(0, 3)], txn, t0);
        let out = st.tick(t0);
        assert!(matches!(
            to(&out, 0)[..],
            [ToAgent::Commit {
                view: ViewCommit { fence: 0b10, .. },
                ..
            }]
        ));
        ack_commit(&mut st, &[0], txn, t0);
        let out = st.tick(t0);
        // The dropped rank is fenced; both waiters learn the outcome.
        assert!(to(&out, 1)
            .iter()
            .any(|m| matches!(m, ToAgent::Fenced { epoch: 1, .. })));
        assert!(to(&out, 0).iter().any(|m| matches!(
            m,
            ToAgent::Synced {
                req: 50,
                status: SyncStatus::Reconciled,
                epoch: 1,
                ..
            }
        )));
        assert!(to(&out, 1)
            .iter()
            .any(|m| matches!(m, ToAgent::Synced { req: 51, .. })));
    }

    #[test]
    fn an_activation_waits_for_join_and_times_out_without_it() {
        let t0 = Instant::now();
        let mut st = founded(2, 4, t0);
        let out = register(&mut st, 2, 2, 4, t0);
        assert!(matches!(
            to(&out, 2)[..],
            [ToAgent::Registered { active: 0b11, .. }]
        ));
        let propose = |req: u64, rank: usize| ToCoord::Propose {
            req,
            group: G,
            slot: 0,
            activate: true,
            ranks: vec![rank],
            admission_ms: 100,
        };
        // Rank 2 has not called join_group: nothing starts before it does.
        assert!(msg(&mut st, 0, propose(60, 2), t0).is_empty());
        assert!(st.tick(t0 + Duration::from_millis(50)).is_empty());
        let join = ToCoord::Join {
            req: 61,
            group: G,
            slot: 2,
            member_id: 1002,
        };
        let out = msg(&mut st, 2, join, t0 + Duration::from_millis(60));
        assert!(matches!(to(&out, 2)[..], [ToAgent::Done { req: 61 }]));
        let t1 = t0 + Duration::from_millis(60);
        let out = st.tick(t1);
        let (txn, active) = prepared(&out, &[0, 1, 2]);
        assert_eq!(active, 0b111);
        ack_prepare(&mut st, &[(0, 9), (1, 9), (2, 0)], txn, t1);
        st.tick(t1);
        ack_commit(&mut st, &[0, 1, 2], txn, t1);
        let out = st.tick(t1);
        assert!(matches!(
            to(&out, 0)[..],
            [ToAgent::Proposed {
                req: 60,
                status: ProposalStatus::Applied,
                epoch: 1,
                ..
            }]
        ));
        // Rank 3 registers but never joins: rejected once the admission
        // time has passed, and the view stays.
        register(&mut st, 3, 2, 4, t1);
        assert!(msg(&mut st, 0, propose(62, 3), t1).is_empty());
        assert!(st.tick(t1 + Duration::from_millis(99)).is_empty());
        let out = st.tick(t1 + Duration::from_millis(100));
        match to(&out, 0)[..] {
            [ToAgent::Proposed {
                req: 62,
                status: ProposalStatus::Rejected,
                reason,
                ..
            }] => assert!(reason.contains("join_group"), "{reason}"),
            ref other => panic!("{other:?}"),
        }
        assert_eq!(st.groups[&G].active, RankSet::from_bits(0b111));
    }

    #[test]
    fn an_unready_member_gets_the_prepare_again_then_the_change_aborts() {
        let t0 = Instant::now();
        let mut st = founded(3, 3, t0);
        let propose = ToCoord::Propose {
            req: 70,
            group: G,
            slot: 0,
            activate: false,
            ranks: vec![2],
            admission_ms: 0,
        };
        msg(&mut st, 0, propose, t0);
        let (txn, active) = prepared(&st.tick(t0), &[0, 1, 2]);
        assert_eq!(active, 0b011);
        // Rank 1 is not ready: after the retry interval only it is asked again.
        ack_prepare(&mut st, &[(0, 1), (2, 1)], txn, t0);
        let retry = t0 + Duration::from_millis(20);
        assert!(st.tick(retry - Duration::from_millis(1)).is_empty());
        let out = st.tick(retry);
        assert_eq!(prepared(&out, &[1]).0, txn);
        assert!(to(&out, 0).is_empty() && to(&out, 2).is_empty());
        // It never answers: at the collective timeout the transaction aborts
        // and, in this auto-deactivating group, rank 1 is dropped first.
        let late = t0 + config::collective_timeout();
        let out = st.tick(late);
        for r in [0, 1, 2] {
            assert!(
                to(&out, r)
                    .iter()
                    .any(|m| matches!(m, ToAgent::Abort { txn: x, .. } if *x == txn)),
                "rank {r}: {out:?}"
            );
        }
        let (_, active) = prepared(&out, &[0, 2]);
        assert_eq!(active, 0b101);
    }

    #[test]
    fn messages_naming_ranks_beyond_the_capacity_change_nothing() {
        let t0 = Instant::now();
        let mut st = founded(3, 3, t0);
        // A reconciliation waiting for rank 1's links.
        msg(&mut st, 0, sync(0, 0, RankSet::one(2)), t0);
        assert!(st.tick(t0).is_empty());
        let bad = [
            links(99, RankSet::from_bits(u64::MAX)),
            ToCoord::PrepareAck {
                group: G,
                txn: 1,
                slot: 99,
                next_seq: 1,
                ready: true,
            },
            ToCoord::CommitAck {
                group: G,
                txn: 1,
                slot: 200,
            },
            ToCoord::Leave {
                group: G,
                slot: 1000,
                member_id: 1,
            },
        ];
        for m in bad {
            assert!(msg(&mut st, 0, m, t0).is_empty());
        }
        // Rank 1's links reported from another member's session.
        let forged = links(1, RankSet::EMPTY);
        assert!(msg(&mut st, 0, forged, t0).is_empty());
        assert!(st.tick(t0).is_empty(), "still waiting for rank 1");
        assert_eq!(st.groups[&G].active, RankSet::from_bits(0b111));
        // Its own report decides.
        msg(&mut st, 1, links(1, RankSet::one(2)), t0);
        assert_eq!(prepared(&st.tick(t0), &[0, 1]).1, 0b011);
    }
}
