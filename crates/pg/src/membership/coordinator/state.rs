//! The coordinator's state machine: every group's members, queued
//! changes, running view-change transaction and reconciliation, driven by
//! [`Input`]s and explicit times.

use super::group::{
    bit, failed, member_gone, propose, register_founder, register_joiner, reply, sync, tick_group,
    CGroup, MState, Out, PendingReg, Phase, Waiter,
};
use crate::membership::control::{ProposalStatus, SyncStatus, ToAgent, ToCoord};
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
            if g.alive() == 0 {
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
                    .or_insert_with(|| CGroup::new(group, label, capacity.min(64)));
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
                if g.alive() == 0 {
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
                    reply(
                        out,
                        w,
                        ProposalStatus::Rejected,
                        0,
                        0,
                        "the group is unknown to the coordinator",
                    );
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
                sync(g, sess, req, slot, member_id, dead, now, out);
            }
            ToCoord::Links { group, slot, dead } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    if let Some(r) = g.recon.as_mut() {
                        r.reports.insert(slot, dead);
                        r.reported |= bit(slot);
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
                        if t.participants >> slot & 1 == 1 {
                            if ready {
                                t.ready |= bit(slot);
                            }
                            if t.old >> slot & 1 == 1 {
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
                        t.acked |= bit(slot);
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
