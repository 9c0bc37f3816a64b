//! The membership coordinator: one per process tree, hosted by the process
//! that hosts torch's rendezvous store (global rank 0), reached by every
//! process's agent over a control session. It owns each group's member
//! states and active set, serializes membership changes, and publishes them
//! as epoch-numbered views that every member applies at the same collective
//! sequence number (as upstream's coordinator does: rank and member states,
//! reconciliation, the three failure-handling modes).
//!
//! How a view change runs (two phases, so every member switches at one
//! point of the op stream):
//! 1. `Prepare(new view)` to every live participant. Each answers with the
//!    number of collectives it has issued (`next_seq`) and whether its links
//!    to every member of the new view are up, and starts no collective at or
//!    past that number until phase two.
//! 2. `Commit(view, from_seq = max next_seq)`: ops with seq >= from_seq run
//!    under the new view everywhere, earlier ones under the old one.
//!
//! Failures: a member whose control session closes is dead at once (its
//! process ended). Link reports (`Sync`, answers to `Query`) open a
//! reconciliation; the coordinator decides as soon as every active member
//! that nobody suspects has reported, or when the window closes, keeping
//! the largest set of members that are all connected to each other (ties
//! keep lower ranks). With auto-deactivation the others are dropped in a
//! view change and, if alive, fenced.
//!
//! Everything runs on one thread fed by a channel (sessions' reader threads
//! and the acceptor post events), so the state needs no locks.

use crate::config;
use crate::error::PgError;
use crate::membership::admission;
use crate::membership::control::{self, MemberRec, ProposalStatus, SyncStatus, ToAgent, ToCoord};
use crate::membership::handshake;
use mooncake_common::limits::ConnPermit;
use mooncake_common::AuthKey;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::BufReader;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a prepare is re-sent to members that were not ready yet.
const PREPARE_RETRY: Duration = Duration::from_millis(20);
/// How long a joiner's registration may wait for its group to be founded.
const FOUNDING_WAIT: Duration = Duration::from_secs(600);

enum Event {
    Open(u64, TcpStream),
    Msg(u64, ToCoord),
    Closed(u64),
    Stop,
}

/// A running coordinator (stopped when dropped).
pub(crate) struct Coordinator {
    endpoint: String,
    port: u16,
    tx: parking_lot::Mutex<Sender<Event>>,
    stopped: Arc<AtomicBool>,
}

impl Coordinator {
    /// Starts a coordinator listening on all interfaces; peers reach it at
    /// `advertise:port`.
    pub(crate) fn start(advertise: &str) -> Result<Arc<Coordinator>, PgError> {
        let auth = PgError::load_auth()?;
        let listener = TcpListener::bind(("0.0.0.0", 0))
            .map_err(|e| PgError::io("bind the membership coordinator", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| PgError::io("coordinator address", e))?
            .port();
        let (tx, rx) = channel::<Event>();
        let stopped = Arc::new(AtomicBool::new(false));
        let (acc_tx, acc_stop) = (tx.clone(), stopped.clone());
        std::thread::Builder::new()
            .name("mcpg-coord-acc".into())
            .spawn(move || accept_loop(listener, auth, acc_tx, acc_stop))
            .map_err(|e| PgError::io("spawn coordinator acceptor", e))?;
        std::thread::Builder::new()
            .name("mcpg-coord".into())
            .spawn(move || {
                let mut st = State::default();
                loop {
                    let wait = st
                        .next_wake()
                        .map(|w| w.saturating_duration_since(Instant::now()));
                    let ev = match wait {
                        Some(w) => rx.recv_timeout(w),
                        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    };
                    match ev {
                        Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                        Ok(ev) => st.handle(ev),
                        Err(RecvTimeoutError::Timeout) => {}
                    }
                    st.tick();
                }
                st.close_all();
            })
            .map_err(|e| PgError::io("spawn coordinator", e))?;
        Ok(Arc::new(Coordinator {
            endpoint: format!("{advertise}:{port}"),
            port,
            tx: parking_lot::Mutex::new(tx),
            stopped,
        }))
    }

    /// Where agents connect.
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Stops serving (idempotent); sessions see their connection close.
    pub(crate) fn stop(&self) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.tx.lock().send(Event::Stop);
        // Unblock the acceptor.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A membership coordinator hosted by this process (the bindings start one
/// in the process that hosts torch's rendezvous store). Stopped on drop.
pub struct CoordinatorHandle(Arc<Coordinator>);

impl CoordinatorHandle {
    /// Starts a coordinator; agents reach it at `advertise:port`.
    pub fn start(advertise: &str) -> Result<Self, PgError> {
        Coordinator::start(advertise).map(CoordinatorHandle)
    }

    /// Where agents connect (`host:port`).
    pub fn endpoint(&self) -> &str {
        self.0.endpoint()
    }

    /// Stops serving (idempotent).
    pub fn stop(&self) {
        self.0.stop()
    }
}

fn accept_loop(
    listener: TcpListener,
    auth: Option<AuthKey>,
    tx: Sender<Event>,
    stopped: Arc<AtomicBool>,
) {
    let tx = Mutex::new(tx);
    admission::serve(
        listener,
        "mcpg-coord-rd",
        move || stopped.load(Ordering::Acquire),
        move |s, permit| {
            let tx = tx.lock().clone();
            serve_session(s, permit, auth.as_ref(), tx);
        },
    );
}

/// One control session: its handshake (on its own thread, see
/// `admission`), then this thread reads the agent's messages until the
/// session closes.
fn serve_session(mut s: TcpStream, permit: ConnPermit, auth: Option<&AuthKey>, tx: Sender<Event>) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let shook = handshake::control_accept(&mut s, auth);
    drop(permit);
    match shook {
        Ok(Some(_)) => {}
        Ok(None) => return,
        Err(e) => {
            if handshake::is_auth_refusal(&e) {
                let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                eprintln!("mooncake-pg: membership coordinator refused {peer}: {e}");
            }
            return;
        }
    }
    let _ = s.set_read_timeout(None);
    let _ = s.set_nodelay(true);
    let Ok(reader) = s.try_clone() else { return };
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    if tx.send(Event::Open(id, s)).is_err() {
        return;
    }
    let mut r = BufReader::new(reader);
    while let Ok(msg) = control::read_msg::<ToCoord>(&mut r) {
        if tx.send(Event::Msg(id, msg)).is_err() {
            return;
        }
    }
    let _ = tx.send(Event::Closed(id));
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MState {
    /// Registered, not ready for activation.
    Inactive,
    /// Called `join_group`.
    Awaiting,
    /// In the active set.
    Active,
}

struct CMember {
    sess: u64,
    rec: MemberRec,
    state: MState,
    alive: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Activate,
    Deactivate,
    Drop,
}

#[derive(Clone, Copy, Debug)]
enum Waiter {
    Propose(u64, u64),
    Sync(u64, u64),
}

struct Change {
    kind: Kind,
    ranks: u64,
    waiters: Vec<Waiter>,
    deadline: Instant,
    dropped: u64,
    reason: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prepare,
    Commit,
}

struct Txn {
    id: u64,
    new_active: u64,
    participants: u64,
    old: u64,
    targets: u64,
    ready: u64,
    next_seq: u64,
    phase: Phase,
    deadline: Instant,
    retry: Instant,
    acked: u64,
    fence: u64,
}

struct Recon {
    deadline: Instant,
    reports: HashMap<usize, u64>,
    reported: u64,
    offline: u64,
    waiters: Vec<Waiter>,
}

struct PendingReg {
    sess: u64,
    req: u64,
    rec: MemberRec,
    deadline: Instant,
}

struct CGroup {
    key: u64,
    label: String,
    capacity: usize,
    founding_capacity: usize,
    size: usize,
    founded: u64,
    auto: bool,
    epoch: u64,
    active: u64,
    members: Vec<Option<CMember>>,
    next_order: u64,
    pending_regs: Vec<PendingReg>,
    changes: VecDeque<Change>,
    txn: Option<Txn>,
    recon: Option<Recon>,
    /// Ranks the last reconciliation found unhealthy but kept in the view
    /// (framework-managed mode): further reports about them are answered at
    /// once.
    known_bad: u64,
}

fn bit(slot: usize) -> u64 {
    1u64 << slot
}

fn full(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

fn slots(mask: u64) -> impl Iterator<Item = usize> {
    (0..64).filter(move |i| mask >> i & 1 == 1)
}

fn list(mask: u64) -> Vec<usize> {
    slots(mask).collect()
}

/// Messages to send once the state change is done.
type Out = Vec<(u64, ToAgent)>;

impl CGroup {
    fn new(key: u64, label: String, capacity: usize) -> Self {
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

    fn grow(&mut self, capacity: usize) {
        self.capacity = self.capacity.max(capacity).min(64);
        while self.members.len() < self.capacity {
            self.members.push(None);
        }
    }

    fn is_founded(&self) -> bool {
        self.size > 0 && self.founded == full(self.size)
    }

    fn alive(&self) -> u64 {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.as_ref().is_some_and(|m| m.alive))
            .fold(0, |acc, (i, _)| acc | bit(i))
    }

    fn member(&self, slot: usize) -> Option<&CMember> {
        self.members.get(slot).and_then(|m| m.as_ref())
    }

    fn live_recs(&self) -> Vec<MemberRec> {
        self.members
            .iter()
            .flatten()
            .filter(|m| m.alive)
            .map(|m| m.rec.clone())
            .collect()
    }

    fn recs_of(&self, mask: u64) -> Vec<MemberRec> {
        slots(mask)
            .filter_map(|s| self.member(s).map(|m| m.rec.clone()))
            .collect()
    }

    fn to(&self, mask: u64, msg: &ToAgent, out: &mut Out) {
        for s in slots(mask) {
            if let Some(m) = self.member(s).filter(|m| m.alive) {
                out.push((m.sess, msg.clone()));
            }
        }
    }

    fn broadcast_except(&self, slot: usize, msg: &ToAgent, out: &mut Out) {
        self.to(self.alive() & !bit(slot), msg, out);
    }
}

fn reply(out: &mut Out, w: Waiter, status: ProposalStatus, epoch: u64, dropped: u64, reason: &str) {
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
fn max_clique(cand: u64, down: &[(usize, usize)], votes: &[u32; 64]) -> u64 {
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

#[derive(Default)]
struct State {
    sessions: HashMap<u64, TcpStream>,
    groups: HashMap<u64, CGroup>,
    tombstones: HashSet<u64>,
    next_txn: u64,
}

impl State {
    fn send_all(&mut self, out: Out) {
        for (sess, msg) in out {
            let failed = match self.sessions.get_mut(&sess) {
                Some(w) => control::write_msg(w, &msg).is_err(),
                None => false,
            };
            if failed {
                if let Some(w) = self.sessions.remove(&sess) {
                    let _ = w.shutdown(Shutdown::Both);
                }
            }
        }
    }

    fn close_all(&mut self) {
        for (_, w) in self.sessions.drain() {
            let _ = w.shutdown(Shutdown::Both);
        }
    }

    fn next_wake(&self) -> Option<Instant> {
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

    fn handle(&mut self, ev: Event) {
        let mut out = Out::new();
        let now = Instant::now();
        match ev {
            Event::Open(id, s) => {
                let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
                self.sessions.insert(id, s);
            }
            Event::Msg(id, msg) => self.on_msg(id, msg, now, &mut out),
            Event::Closed(id) => self.on_closed(id, now, &mut out),
            Event::Stop => {}
        }
        self.send_all(out);
    }

    fn tick(&mut self) {
        let now = Instant::now();
        let mut out = Out::new();
        let keys: Vec<u64> = self.groups.keys().copied().collect();
        for k in keys {
            if let Some(g) = self.groups.get_mut(&k) {
                tick_group(g, now, &mut self.next_txn, &mut out);
            }
        }
        self.send_all(out);
    }

    fn on_closed(&mut self, sess: u64, now: Instant, out: &mut Out) {
        if let Some(w) = self.sessions.remove(&sess) {
            let _ = w.shutdown(Shutdown::Both);
        }
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

/// Queues a failure-driven change ahead of proposals (behind the change a
/// running transaction belongs to, which is always the queue's front).
fn push_urgent(g: &mut CGroup, c: Change) {
    let at = if g.txn.is_some() {
        1.min(g.changes.len())
    } else {
        0
    };
    g.changes.insert(at, c);
}

fn failed(req: u64, reason: &str) -> ToAgent {
    ToAgent::Failed {
        req,
        reason: reason.to_string(),
    }
}

#[allow(clippy::too_many_arguments)]
fn register_founder(
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

fn register_joiner(g: &mut CGroup, sess: u64, req: u64, mut rec: MemberRec, out: &mut Out) {
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
fn member_gone(g: &mut CGroup, slot: usize, crashed: bool, now: Instant, out: &mut Out) {
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

fn open_recon(g: &mut CGroup, now: Instant, out: &mut Out) {
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
fn sync(
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
fn propose(
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

fn tick_group(g: &mut CGroup, now: Instant, next_txn: &mut u64, out: &mut Out) {
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

fn try_decide(g: &mut CGroup, now: Instant, out: &mut Out) {
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

fn abort_txn(g: &mut CGroup, out: &mut Out) {
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

fn step_txn(g: &mut CGroup, now: Instant, out: &mut Out) {
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

fn finalize(g: &mut CGroup, out: &mut Out) {
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

fn pump(g: &mut CGroup, now: Instant, next_txn: &mut u64, out: &mut Out) {
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
