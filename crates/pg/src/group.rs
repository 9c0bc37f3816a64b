//! The group model: slot, reserved capacity vs. active set, visible size, the
//! links to peers, the op sequence. A [`Group`] owns the shared state and the
//! threads that run on it (executor, watchdog, sync thread, one reader per
//! link) and is what the bindings use.
//!
//! The active set is a `u64` (capacity ≤ 64). Each collective runs over the
//! view that governs its sequence number; ranks found dead during the op are
//! reported in its failed set. Membership changes (activation, deactivation,
//! failure) are decided by the coordinator and applied at one sequence
//! number on every member; without a reachable coordinator a member falls
//! back to clearing failed ranks locally.

use crate::collectives::p2p::{self, P2p, PostOutcome, PostedRecv};
use crate::collectives::plan::{kind_code, OpKind};
use crate::completion::Completion;
use crate::config::{self, Config, Transport};
use crate::dtype::check_reduction;
use crate::error::PgError;
use crate::fault;
use crate::membership::agent::{Agent, GroupSink};
use crate::membership::control::{MemberRec, ProposalStatus, SyncStatus, ToAgent, ToCoord};
use crate::membership::engine::{self, Engine};
use crate::membership::handshake::{self, LinkHello};
use crate::runtime::executor::executor_loop;
use crate::runtime::member::{attach_link, offer_shm, Acceptor};
use crate::runtime::progress::run_op;
use crate::runtime::shared::{Op, Shared, View, MAX_CAPACITY};
use crate::runtime::syncer::sync_loop;
use crate::runtime::watchdog::watchdog_loop;
use crate::transport::futex::Doorbell;
use crate::transport::shm::{self, Segment};
use crate::transport::wire::{Hdr, KIND_BYE};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

/// Parameters of a new group member.
#[derive(Clone, Debug)]
pub struct GroupParams {
    /// Our slot.
    pub rank: usize,
    /// Declared group size (torch `group_size`).
    pub size: usize,
    /// Reserved capacity (≥ size, ≤ 64).
    pub capacity: usize,
    /// Joining/replacement member (starts local-only).
    pub is_extension: bool,
    /// Unique group name shared by all members (e.g. store prefix + id).
    pub key: String,
    /// Failed ranks leave the active set (`auto_deactivate_on_failure`).
    pub auto_deactivate: bool,
    /// A failed op completes only after the reconciled view is applied
    /// (`auto_sync_on_failure`; requires `auto_deactivate`).
    pub auto_sync: bool,
    /// Host identity (hostname and boot id); equal identities share memory.
    pub host: String,
}

/// What a member published about itself (founding members read these from
/// torch's store).
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// The peer's slot.
    pub slot: usize,
    /// `host:port` of its engine.
    pub endpoint: String,
    /// Its member id.
    pub member_id: u64,
    /// Same hostname and boot id as us.
    pub same_host: bool,
    /// Its shared-memory segment name ("" if none).
    pub shm_name: String,
}

/// Answer to a membership proposal (upstream `ProposeViewUpdateResponse`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProposeOutcome {
    /// Outcome.
    pub status: ProposalStatus,
    /// The group's epoch afterwards.
    pub epoch: u64,
    /// Ranks left out.
    pub dropped: Vec<usize>,
    /// Why it was rejected ("" otherwise).
    pub reason: String,
}

/// Answer to `sync_after_failure` (upstream `SyncAfterFailureResponse`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Outcome.
    pub status: SyncStatus,
    /// The group's epoch afterwards.
    pub epoch: u64,
    /// Why it was rejected ("" otherwise).
    pub reason: String,
}

/// A member of one process group.
pub struct Group {
    shared: Arc<Shared>,
    engine: Arc<Engine>,
    closed: AtomicBool,
}

fn full(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

impl Group {
    /// Creates the member: registers with the engine and, unless TCP is
    /// forced, creates its shared-memory segment.
    pub fn new(p: GroupParams) -> Result<Self, PgError> {
        if p.size == 0 || p.rank >= p.size {
            return Err(PgError::RankOutOfRange {
                rank: p.rank,
                size: p.size,
            });
        }
        if p.capacity < p.size || p.capacity > MAX_CAPACITY {
            return Err(PgError::BadCapacity {
                size: p.size,
                capacity: p.capacity,
                max: MAX_CAPACITY,
            });
        }
        let cfg = Config::from_env();
        fault::load_env()?;
        let auth = PgError::load_auth()?;
        static SWEEP: Once = Once::new();
        SWEEP.call_once(shm::sweep_stale);
        let engine = engine::engine()?;
        let member_id = engine::random_u64();
        let key = engine::stable_hash(&p.key);
        let seg = if cfg.transport == Transport::Auto && p.capacity > 1 {
            Segment::create(&shm::unique_name(member_id), p.capacity)
                .ok()
                .map(Arc::new)
        } else {
            None
        };
        let me = 1u64 << p.rank;
        let mask = if p.is_extension { me } else { full(p.size) };
        let shared = Arc::new(Shared {
            rank: p.rank,
            size: p.size,
            capacity: AtomicUsize::new(p.capacity),
            is_extension: p.is_extension,
            auto_deactivate: p.auto_deactivate,
            auto_sync: p.auto_sync && p.auto_deactivate,
            active: AtomicBool::new(!p.is_extension),
            joining: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            founding: AtomicBool::new(!p.is_extension),
            epoch: AtomicU64::new(0),
            views: Mutex::new(vec![View { from_seq: 0, mask }]),
            fenced_before: Mutex::new(None),
            gate: Mutex::new(None),
            members: RwLock::new(vec![None; p.capacity]),
            order: AtomicU64::new(0),
            host: Mutex::new(p.host.clone()),
            agent: RwLock::new(None),
            deferred: Mutex::new(Vec::new()),
            deferred_cv: Condvar::new(),
            syncer: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            key,
            auth: auth.clone(),
            auth_failures: Mutex::new(HashMap::new()),
            member_id,
            mask: AtomicU64::new(mask),
            links: RwLock::new(Arc::new(vec![None; p.capacity])),
            heap_bell: Doorbell::default(),
            submit_bell: Doorbell::default(),
            exec_lock: Mutex::new(()),
            seg,
            queue: Mutex::new(VecDeque::new()),
            next_seq: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            p2p: P2p::new(p.capacity),
            ctrl: Mutex::new(0),
            ctrl_cv: Condvar::new(),
            mask_out: Mutex::new(None),
            spin_us: AtomicU64::new(cfg.spin.as_micros() as u64),
            label: p.key.split('/').next().unwrap_or_default().into(),
            waiting_coll: AtomicU64::new(0),
            watch: Mutex::new(()),
            watch_cv: Condvar::new(),
            retain: Arc::default(),
            cfg,
            clock: Arc::new(crate::clock::Monotonic),
        });
        engine.register(
            key,
            member_id,
            auth,
            Arc::new(Acceptor(Arc::downgrade(&shared))),
        )?;
        let g = Group {
            shared,
            engine,
            closed: AtomicBool::new(false),
        };
        g.spawn("mcpg-exec", executor_loop)?;
        g.spawn("mcpg-watch", watchdog_loop)?;
        Ok(g)
    }

    fn spawn(&self, name: &str, body: fn(Arc<Shared>)) -> Result<(), PgError> {
        let sh = self.shared.clone();
        let h = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(sh))
            .map_err(|e| PgError::io(format!("spawn {name}"), e))?;
        self.shared.threads.lock().push(h);
        Ok(())
    }

    /// Our engine's TCP port.
    pub fn port(&self) -> u16 {
        self.engine.port()
    }

    /// Our member id.
    pub fn member_id(&self) -> u64 {
        self.shared.member_id
    }

    /// Our engine's instance id.
    pub fn instance_id(&self) -> u64 {
        self.engine.instance_id()
    }

    /// Our shm segment name, or "" when shm is off.
    pub fn shm_name(&self) -> String {
        self.shared
            .seg
            .as_ref()
            .map(|s| s.name().to_string())
            .unwrap_or_default()
    }

    /// Our slot.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// Reserved capacity.
    pub fn capacity(&self) -> usize {
        self.shared.capacity()
    }

    /// Committed active mask as a bitmap (`{self}` while local-only).
    pub fn mask(&self) -> u64 {
        self.shared.mask()
    }

    /// True while this member is in the group's active set.
    pub fn is_active(&self) -> bool {
        self.shared.active.load(Ordering::Acquire)
    }

    /// Epoch of the last membership view this member applied.
    pub fn epoch(&self) -> u64 {
        self.shared.epoch.load(Ordering::Acquire)
    }

    /// Visible size V: 1 + highest active slot; the declared size while
    /// this member is local-only (extension not joined yet, deactivated or
    /// fenced), because torch validates ranks against it.
    pub fn visible_size(&self) -> usize {
        if !self.is_active() {
            return self.shared.size;
        }
        64 - self.shared.mask().leading_zeros() as usize
    }

    /// Sets the bounded spin (µs) before sleeping; 0 disables spinning.
    pub fn set_spin_us(&self, us: u64) {
        self.shared.spin_us.store(us.min(1000), Ordering::Relaxed);
    }

    /// Registers the int32 tensor mirroring the mask and writes it; the
    /// core rewrites it in place whenever the mask changes.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` int32 values (and aligned for
    /// them) until another tensor is registered, [`Group::clear_mask_tensor`]
    /// or [`Group::shutdown`] returned, or the group is dropped.
    pub unsafe fn set_mask_tensor(&self, ptr: usize, len: usize) {
        *self.shared.mask_out.lock() = Some((ptr, len));
        self.shared.write_mask();
    }

    /// Forgets the registered mask tensor: once this returns, the core never
    /// writes to it again (a write in progress finishes first). Call it
    /// before the tensor's memory is freed or resized.
    pub fn clear_mask_tensor(&self) {
        *self.shared.mask_out.lock() = None;
    }

    /// Number of peers whose shm rings are in use (for tests and logs).
    pub fn shm_peer_count(&self) -> usize {
        self.shared
            .links
            .read()
            .iter()
            .flatten()
            .filter(|l| !l.is_dead() && l.uses_shm())
            .count()
    }

    /// Joins the membership coordinator at `coordinator` and registers this
    /// member. Founding members become active members of epoch 0; joining
    /// members learn the group's members (and stay local-only until
    /// [`Group::join`]). Fails with the coordinator's reason when the
    /// registration is refused (rank beyond capacity, rank still alive,
    /// founding members that disagree on the group's shape).
    /// `my_endpoint` is where peers dial this member (`host:port`).
    pub fn attach_coordinator(
        &self,
        coordinator: &str,
        my_endpoint: &str,
        timeout: Duration,
    ) -> Result<(), PgError> {
        let sh = &self.shared;
        let agent = Agent::connect(coordinator, sh.auth.as_ref(), timeout)?;
        let sink: Arc<dyn GroupSink> = sh.clone();
        agent.attach_group(sh.key, Arc::downgrade(&sink));
        let rec = MemberRec {
            slot: sh.rank,
            member_id: sh.member_id,
            endpoint: my_endpoint.to_string(),
            host: sh.host.lock().clone(),
            shm: self.shm_name(),
            order: 0,
        };
        let reply = agent.request(
            |req| ToCoord::Register {
                req,
                group: sh.key,
                label: sh.label.to_string(),
                rec,
                capacity: sh.capacity(),
                size: sh.size,
                extension: sh.is_extension,
                auto_deactivate: sh.auto_deactivate,
            },
            Some(timeout),
        );
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                agent.detach_group(sh.key);
                return Err(e);
            }
        };
        match reply {
            ToAgent::Registered {
                capacity,
                members,
                closed,
                ..
            } => {
                if closed {
                    sh.fenced.store(true, Ordering::Release);
                }
                sh.grow(capacity);
                for rec in members {
                    if rec.slot == sh.rank {
                        sh.order.store(rec.order, Ordering::Release);
                    } else {
                        sh.remember(rec);
                    }
                }
            }
            ToAgent::Failed { reason, .. } => {
                agent.detach_group(sh.key);
                return Err(PgError::Membership { reason });
            }
            other => {
                agent.detach_group(sh.key);
                return Err(PgError::Membership {
                    reason: format!("unexpected coordinator answer {other:?}"),
                });
            }
        }
        *sh.agent.write() = Some(agent);
        if sh.auto_sync && !sh.syncer.swap(true, Ordering::AcqRel) {
            self.spawn("mcpg-sync", sync_loop)?;
        }
        Ok(())
    }

    /// Connects to every listed founding peer (all initially active slots
    /// but ours): dials lower slots, waits for higher ones, then negotiates
    /// shared memory with same-host peers.
    pub fn connect(&self, peers: Vec<PeerInfo>, timeout: Duration) -> Result<(), PgError> {
        let sh = &self.shared;
        let deadline = Instant::now() + timeout;
        let me = sh.rank;
        let my_host = sh.host.lock().clone();
        let recs: Vec<MemberRec> = peers
            .iter()
            .map(|p| MemberRec {
                slot: p.slot,
                member_id: p.member_id,
                endpoint: p.endpoint.clone(),
                host: if p.same_host {
                    my_host.clone()
                } else {
                    format!("{my_host}/other")
                },
                shm: p.shm_name.clone(),
                order: 0,
            })
            .collect();
        for rec in &recs {
            sh.remember(rec.clone());
            // A provisional link from an earlier member of this slot: drop it.
            if let Some(l) = sh.live_link(rec.slot) {
                if l.member_id != rec.member_id {
                    l.close();
                }
            }
        }
        let hello = LinkHello {
            key: sh.key,
            slot: me as u32,
            member_id: sh.member_id,
        };
        let mut backoff = Duration::from_millis(5);
        for rec in recs.iter().filter(|r| r.slot < me) {
            loop {
                if sh
                    .live_link(rec.slot)
                    .is_some_and(|l| l.member_id == rec.member_id)
                {
                    break;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                if fault::fail_connect(&sh.label, rec.slot) {
                    std::thread::sleep(left.min(Duration::from_millis(100)));
                    continue;
                }
                match engine::dial(
                    &rec.endpoint,
                    &hello,
                    rec.member_id,
                    sh.auth.as_ref(),
                    left.min(Duration::from_secs(2)),
                ) {
                    Ok(Some(s)) => {
                        attach_link(sh, rec.slot, rec.member_id, s, None)?;
                        break;
                    }
                    // The peer is the one we expect but the cluster
                    // secrets differ: retrying cannot help.
                    Err(e) if handshake::is_auth_refusal(&e) => {
                        return Err(PgError::Auth {
                            reason: format!("rank {} at {}: {e}", rec.slot, rec.endpoint),
                        });
                    }
                    _ => {
                        std::thread::sleep(backoff.min(left));
                        backoff = (backoff * 2).min(Duration::from_millis(200));
                    }
                }
            }
        }
        // A peer has joined once a link from the member we expect was
        // attached, even if that link is gone again: a peer may finish its
        // own connect and leave (destroy the group, or die) before this
        // thread looks, and its departure is then a failure of the running
        // group, not a connect timeout.
        let joined = |r: &MemberRec| {
            sh.links
                .read()
                .get(r.slot)
                .and_then(Option::as_ref)
                .is_some_and(|l| l.member_id == r.member_id)
        };
        let mut ctrl = sh.ctrl.lock();
        while !recs.iter().all(joined) && Instant::now() < deadline {
            sh.ctrl_cv.wait_until(&mut ctrl, deadline);
        }
        drop(ctrl);
        let missing: Vec<usize> = recs.iter().filter(|r| !joined(r)).map(|r| r.slot).collect();
        if !missing.is_empty() {
            let failures = sh.auth_failures.lock();
            let refused: Vec<String> = missing
                .iter()
                .filter_map(|r| failures.get(r).map(|why| format!("rank {r}: {why}")))
                .collect();
            if !refused.is_empty() {
                return Err(PgError::Auth {
                    reason: format!(
                        "timed out after {:.1}s connecting to rank(s) {missing:?}; refused {}",
                        timeout.as_secs_f64(),
                        refused.join("; ")
                    ),
                });
            }
            return Err(PgError::ConnectTimeout {
                secs: timeout.as_secs_f64(),
                missing,
            });
        }
        for rec in &recs {
            if let Some(l) = sh.live_link(rec.slot) {
                offer_shm(sh, &l, rec);
            }
        }
        let mut ctrl = sh.ctrl.lock();
        loop {
            let done = recs.iter().all(|r| {
                sh.links
                    .read()
                    .get(r.slot)
                    .cloned()
                    .flatten()
                    .is_none_or(|l| l.is_dead() || l.settled())
            });
            if done || Instant::now() >= deadline {
                break;
            }
            sh.ctrl_cv.wait_until(&mut ctrl, deadline);
        }
        drop(ctrl);
        sh.founding.store(false, Ordering::Release);
        Ok(())
    }

    /// `join_group`: blocks until an activation of this member commits (or
    /// `timeout`). Drains this member's local-only work, links to every
    /// member registered before it (later ones dial us), tells the
    /// coordinator it awaits activation, then waits for the commit.
    pub fn join(&self, timeout: Duration) -> Result<(), PgError> {
        let sh = &self.shared;
        if sh.is_shutdown() {
            return Err(PgError::Shutdown);
        }
        if sh.active.load(Ordering::Acquire) {
            return Err(PgError::NotJoinable {
                reason: "this rank is already an active member of the group (only a rank created \
                         with is_extension=True, or a deactivated one, can join)",
            });
        }
        if sh.fenced.load(Ordering::Acquire) {
            return Err(PgError::NotJoinable {
                reason: "this member was dropped from the group (or the group was destroyed); \
                         start a replacement process to rejoin",
            });
        }
        let Some(agent) = sh.agent() else {
            return Err(PgError::NotJoinable {
                reason: "no membership coordinator is reachable",
            });
        };
        let start = Instant::now();
        let deadline = start + timeout;
        // Drain local-only work: the activation renumbers our op sequence.
        loop {
            let idle = sh.queue.lock().is_empty() && !sh.exec_lock.is_locked();
            if idle {
                break;
            }
            if Instant::now() >= deadline {
                return Err(PgError::JoinTimeout {
                    secs: timeout.as_secs_f64(),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        sh.joining.store(true, Ordering::Release);
        self.dial_earlier(Duration::from_millis(200));
        let left = deadline.saturating_duration_since(Instant::now());
        let reply = agent.request_until(
            |req| ToCoord::Join {
                req,
                group: sh.key,
                slot: sh.rank,
                member_id: sh.member_id,
            },
            left.max(Duration::from_millis(100)),
            || sh.is_shutdown(),
        );
        match reply {
            Ok(ToAgent::Done { .. }) => {}
            Ok(ToAgent::Failed { reason, .. }) => {
                sh.joining.store(false, Ordering::Release);
                return Err(PgError::Membership { reason });
            }
            Ok(other) => {
                sh.joining.store(false, Ordering::Release);
                return Err(PgError::Membership {
                    reason: format!("unexpected coordinator answer {other:?}"),
                });
            }
            Err(e) => {
                sh.joining.store(false, Ordering::Release);
                return Err(e);
            }
        }
        loop {
            if sh.active.load(Ordering::Acquire) {
                return Ok(());
            }
            if sh.is_shutdown() {
                return Err(PgError::Shutdown);
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.dial_earlier(Duration::from_millis(200));
            let mut ctrl = sh.ctrl.lock();
            if !sh.active.load(Ordering::Acquire) {
                sh.ctrl_cv
                    .wait_until(&mut ctrl, (now + Duration::from_millis(50)).min(deadline));
            }
        }
        sh.joining.store(false, Ordering::Release);
        agent.send(&ToCoord::Unjoin {
            group: sh.key,
            slot: sh.rank,
            member_id: sh.member_id,
        });
        // A commit may already be on its way for a prepare we acknowledged.
        let grace = Instant::now() + config::collective_timeout().min(Duration::from_secs(2));
        while sh.gate.lock().is_some() && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(5));
        }
        if sh.active.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(PgError::JoinTimeout {
            secs: timeout.as_secs_f64(),
        })
    }

    /// Dials every known member registered before us that we have no live
    /// link to (one attempt each; refusals are retried by the caller).
    fn dial_earlier(&self, each: Duration) {
        let sh = &self.shared;
        let mine = sh.order.load(Ordering::Acquire);
        let hello = LinkHello {
            key: sh.key,
            slot: sh.rank as u32,
            member_id: sh.member_id,
        };
        let recs: Vec<MemberRec> = sh.members.read().iter().flatten().cloned().collect();
        for rec in recs {
            if rec.slot == sh.rank || rec.order >= mine || rec.endpoint.is_empty() {
                continue;
            }
            if sh
                .live_link(rec.slot)
                .is_some_and(|l| l.member_id == rec.member_id)
            {
                continue;
            }
            if fault::fail_connect(&sh.label, rec.slot) {
                continue;
            }
            match engine::dial(&rec.endpoint, &hello, rec.member_id, sh.auth.as_ref(), each) {
                Ok(Some(s)) => {
                    let _ = attach_link(sh, rec.slot, rec.member_id, s, Some(&rec));
                }
                Err(e) if handshake::is_auth_refusal(&e) => {
                    sh.auth_failures.lock().insert(rec.slot, e.to_string());
                }
                _ => {}
            }
        }
    }

    /// `activate_ranks` (`activate == true`) or `deactivate_ranks`: one call
    /// from any member suffices; the coordinator validates, waits for the
    /// targets (activation), and commits the view on every member before
    /// answering.
    pub fn propose(&self, activate: bool, ranks: &[usize]) -> Result<ProposeOutcome, PgError> {
        let sh = &self.shared;
        let cap = sh.capacity();
        if let Some(&bad) = ranks.iter().find(|&&r| r >= cap) {
            return Err(PgError::RankOutOfRange {
                rank: bad,
                size: cap,
            });
        }
        let Some(agent) = sh.agent() else {
            return Ok(ProposeOutcome {
                status: ProposalStatus::Rejected,
                epoch: self.epoch(),
                dropped: Vec::new(),
                reason: "no membership coordinator is reachable".into(),
            });
        };
        let admission = config::admission_timeout();
        let limit = admission + 3 * config::collective_timeout() + Duration::from_secs(5);
        let reply = agent.request_until(
            |req| ToCoord::Propose {
                req,
                group: sh.key,
                slot: sh.rank,
                activate,
                ranks: ranks.to_vec(),
                admission_ms: admission.as_millis() as u64,
            },
            limit,
            || sh.is_shutdown(),
        )?;
        match reply {
            ToAgent::Proposed {
                status,
                epoch,
                dropped,
                reason,
                ..
            } => Ok(ProposeOutcome {
                status,
                epoch: epoch.max(self.epoch()),
                dropped,
                reason,
            }),
            other => Err(PgError::Membership {
                reason: format!("unexpected coordinator answer {other:?}"),
            }),
        }
    }

    /// `sync_after_failure`: reports this member's dead links, waits for any
    /// pending reconciliation and returns once the resulting view is applied.
    pub fn sync(&self) -> Result<SyncOutcome, PgError> {
        let sh = &self.shared;
        let Some(agent) = sh.agent() else {
            return Ok(SyncOutcome {
                status: SyncStatus::Rejected,
                epoch: self.epoch(),
                reason: "no membership coordinator is reachable".into(),
            });
        };
        let dead = if self.is_active() { sh.dead_links() } else { 0 };
        let reply = sh.request_sync(&agent, dead)?;
        match reply {
            ToAgent::Synced { status, reason, .. } => Ok(SyncOutcome {
                status,
                epoch: self.epoch(),
                reason,
            }),
            other => Err(PgError::Membership {
                reason: format!("unexpected coordinator answer {other:?}"),
            }),
        }
    }

    /// `get_peer_state`: local and communication-free; per rank, whether it
    /// is ready for the data plane with us (ourselves, or a live link to the
    /// member currently registered at that rank).
    pub fn peer_state(&self, ranks: &[usize]) -> Result<Vec<bool>, PgError> {
        let cap = self.capacity();
        ranks
            .iter()
            .map(|&r| {
                if r >= cap {
                    Err(PgError::RankOutOfRange { rank: r, size: cap })
                } else {
                    Ok(r == self.shared.rank || self.shared.linked(r))
                }
            })
            .collect()
    }

    /// `get_num_synced_ranks`: how many slots [`Group::peer_state`] reports
    /// ready.
    pub fn num_synced(&self) -> usize {
        (0..self.capacity())
            .filter(|&r| r == self.shared.rank || self.shared.linked(r))
            .count()
    }

    /// `extend_group_size_to`: raises the capacity (local; the visible size
    /// does not change). A smaller size or one above 64 is an error; the
    /// same size is a no-op.
    pub fn extend(&self, capacity: usize) -> Result<(), PgError> {
        let cur = self.capacity();
        if capacity < cur || capacity > MAX_CAPACITY {
            return Err(PgError::BadCapacity {
                size: cur,
                capacity,
                max: MAX_CAPACITY,
            });
        }
        if capacity == cur {
            return Ok(());
        }
        self.shared.grow(capacity);
        if let Some(a) = self.shared.agent() {
            a.send(&ToCoord::Extend {
                group: self.shared.key,
                capacity,
            });
        }
        Ok(())
    }

    /// Queues a collective; the executor runs it in sequence order.
    ///
    /// # Safety
    /// Every address in `kind` must stay valid, for reads (inputs) or
    /// writes (outputs) of the sizes `kind` names, until the returned
    /// completion is done; outputs must not overlap memory anything else
    /// uses meanwhile.
    pub unsafe fn submit(
        &self,
        kind: OpKind,
        dtype_code: u32,
        op_code: u32,
    ) -> Result<Arc<Completion>, PgError> {
        if self.shared.is_shutdown() {
            return Err(PgError::Shutdown);
        }
        if let Some((dtype, op)) = kind.reduction() {
            check_reduction(dtype, op)?;
        }
        let done = Arc::new(Completion::new());
        let sig = kind_code(&kind) << 16 | (dtype_code & 0xff) << 8 | (op_code & 0xff);
        {
            let mut q = self.shared.queue.lock();
            let seq = self.shared.next_seq.fetch_add(1, Ordering::AcqRel);
            q.push_back(Op {
                seq,
                kind,
                sig,
                done: done.clone(),
            });
        }
        self.shared.submit_bell.ring();
        Ok(done)
    }

    /// Waits for `done`. With no timeout, the calling thread runs queued ops
    /// itself (in order) when the executor is idle, saving two thread
    /// hand-offs per synchronous collective.
    pub fn wait(&self, done: &Completion, timeout: Option<Duration>) -> bool {
        if timeout.is_none() && self.shared.cfg.inline_wait {
            while !done.is_done() {
                let Some(guard) = self.shared.exec_lock.try_lock() else {
                    break;
                };
                let Some(op) = self.shared.pop_runnable() else {
                    break;
                };
                let links = self.shared.links();
                run_op(&self.shared, &links, op);
                drop(guard);
                if !self.shared.queue.lock().is_empty() {
                    self.shared.submit_bell.ring();
                }
            }
        }
        done.wait(timeout)
    }

    fn active_link(
        &self,
        slot: usize,
    ) -> Result<Option<Arc<crate::transport::link::PeerLink>>, PgError> {
        let cap = self.capacity();
        if slot >= cap || slot == self.shared.rank {
            return Err(PgError::BadPeer {
                peer: slot,
                rank: self.shared.rank,
                capacity: cap,
            });
        }
        if self.shared.mask() >> slot & 1 == 0 {
            return Ok(None);
        }
        Ok(self.shared.links.read().get(slot).cloned().flatten())
    }

    /// Sends `len` bytes at `ptr` to `dst` from the calling thread.
    ///
    /// # Safety
    /// `ptr` must be valid for `len` bytes for the duration of the call.
    pub unsafe fn send(
        &self,
        dst: usize,
        ptr: usize,
        len: usize,
    ) -> Result<Arc<Completion>, PgError> {
        let done = Arc::new(Completion::new());
        match self.active_link(dst)? {
            Some(l) if !l.is_dead() => {
                let data: &[u8] = if len == 0 {
                    &[]
                } else {
                    // SAFETY: the caller guarantees `len` readable bytes at
                    // `ptr` for the duration of this call.
                    unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
                };
                if p2p::send(&l, self.shared.cfg.p2p_frame, data, done.clone()).is_err() {
                    l.fence();
                }
                // The link's reader fails unacknowledged sends when it ends;
                // one that ended before this send was registered left it to us.
                if l.is_dead() {
                    self.shared.fail_sends(dst, l.take_sends());
                }
            }
            _ => self.shared.finish(&done, None, 1u64 << dst),
        }
        Ok(done)
    }

    /// Posts a receive of `len` bytes into `ptr` from `src` (any if `None`).
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes until the returned
    /// completion is done.
    pub unsafe fn recv(
        &self,
        src: Option<usize>,
        ptr: usize,
        len: usize,
    ) -> Result<Arc<Completion>, PgError> {
        let done = Arc::new(Completion::new());
        if let Some(s) = src {
            if self.active_link(s)?.is_none() {
                done.set_source(s);
                self.shared.finish(&done, None, 1u64 << s);
                return Ok(done);
            }
        }
        // SAFETY: forwarded from this function's contract.
        let recv = unsafe { PostedRecv::new(ptr, len, done.clone()) };
        let sh = &self.shared;
        if let PostOutcome::Dead(failed) = sh.p2p.post_recv(src, recv, |s| sh.peer_dead(s)) {
            sh.fail_recvs(src.unwrap_or(0), vec![failed]);
        }
        Ok(done)
    }

    /// Leaves the group (tells the coordinator), stops the threads, says
    /// goodbye to peers and closes every link. Idempotent.
    pub fn shutdown(&self) {
        let sh = &self.shared;
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // The owner may free the mask tensor as soon as this returns, while
        // threads holding this group (a coordinator session's reader, a
        // `Work`) can still outlive it.
        self.clear_mask_tensor();
        if let Some(agent) = sh.agent.write().take() {
            agent.send(&ToCoord::Leave {
                group: sh.key,
                slot: sh.rank,
                member_id: sh.member_id,
            });
            agent.detach_group(sh.key);
        }
        sh.shutdown.store(true, Ordering::Release);
        sh.bell().ring();
        sh.submit_bell.ring();
        sh.deferred_cv.notify_all();
        {
            let _g = sh.watch.lock();
            sh.watch_cv.notify_all();
        }
        let links = sh.links();
        let bye = Hdr {
            kind: KIND_BYE,
            ..Default::default()
        };
        let threads: Vec<std::thread::JoinHandle<()>> = sh.threads.lock().drain(..).collect();
        let mut it = threads.into_iter();
        // The executor is always the first thread.
        if let Some(exec) = it.next() {
            let _ = exec.join();
        }
        for l in links.iter().flatten() {
            let _ = l.write_frame(&bye, &[]);
            l.close();
        }
        for h in it {
            let _ = h.join();
        }
        // Readers attached while we were joining the others.
        let late: Vec<std::thread::JoinHandle<()>> = sh.threads.lock().drain(..).collect();
        for l in sh.links().iter().flatten() {
            l.close();
        }
        for h in late {
            let _ = h.join();
        }
        for r in sh.p2p.take_all() {
            r.done().complete(Some(PgError::Shutdown), 0);
        }
        for d in std::mem::take(&mut *sh.deferred.lock()) {
            d.done.complete(d.error, d.failed);
        }
        self.engine.unregister(sh.key, sh.member_id);
        if let Some(s) = &sh.seg {
            s.unlink();
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank 0 of a founding group of `size` with `capacity` slots, on its
    /// own key.
    fn rank0(name: &str, size: usize, capacity: usize) -> Group {
        Group::new(GroupParams {
            rank: 0,
            size,
            capacity,
            is_extension: false,
            key: format!("{name}-{}", std::process::id()),
            auto_deactivate: true,
            auto_sync: true,
            host: String::new(),
        })
        .expect("group")
    }

    #[test]
    fn no_mask_write_reaches_a_tensor_after_clear_or_shutdown() {
        for shut in [false, true] {
            let g = rank0("mask-test", 1, 4);
            let mut mask = vec![-1i32; 4];
            // SAFETY: `mask` outlives the registration (cleared below
            // before it is read or dropped).
            unsafe { g.set_mask_tensor(mask.as_mut_ptr() as usize, 4) };
            g.shared.write_mask();
            assert_eq!(mask[0], 1, "our own slot is active");
            assert!(mask[1..].iter().all(|&v| v == 0 || v == 1));
            if shut {
                g.shutdown();
            } else {
                g.clear_mask_tensor();
            }
            mask.fill(7);
            // What a coordinator session's reader does when the session
            // ends after the owner freed the tensor (on_agent_lost).
            g.shared.write_mask();
            assert_eq!(mask, vec![7; 4], "shutdown={shut}: the tensor was written");
        }
    }

    /// Polls `cond` until it holds (a socket test: the acceptor runs on its
    /// own thread).
    fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Rank 0 of a founding group of two, on its own key.
    fn founding_rank0(name: &str) -> Group {
        rank0(name, 2, 2)
    }

    /// A founding peer that linked to us and left again before our own
    /// connect looked (it finished its connect and destroyed the group at
    /// once, or it died) has joined: our connect returns, and the peer's
    /// departure is the running group's failure, not a connect timeout.
    #[test]
    fn a_founding_peer_that_linked_and_left_has_joined() {
        let g = founding_rank0("linked-and-left");
        let peer_member = 0x5eed;
        let hello = LinkHello {
            key: g.shared.key,
            slot: 1,
            member_id: peer_member,
        };
        let endpoint = format!("127.0.0.1:{}", g.port());
        let s = engine::dial(
            &endpoint,
            &hello,
            g.member_id(),
            None,
            Duration::from_secs(5),
        )
        .expect("dial")
        .expect("a founding peer is admitted before its record is known");
        until("the link is attached", || {
            g.shared.links.read()[1].is_some()
        });
        drop(s);
        until("the link is dead", || g.shared.live_link(1).is_none());
        let started = Instant::now();
        let peer = PeerInfo {
            slot: 1,
            endpoint: endpoint.clone(),
            member_id: peer_member,
            same_host: true,
            shm_name: String::new(),
        };
        g.connect(vec![peer], Duration::from_secs(5))
            .expect("a peer that linked and left has joined");
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "connect waited for its deadline"
        );
        assert!(
            g.shared.live_link(1).is_none(),
            "the departed peer has no live link"
        );
        // A peer that never linked still times out, naming it.
        let g2 = founding_rank0("never-linked");
        let absent = PeerInfo {
            slot: 1,
            endpoint,
            member_id: 0xabc,
            same_host: true,
            shm_name: String::new(),
        };
        match g2.connect(vec![absent], Duration::from_millis(300)) {
            Err(PgError::ConnectTimeout { missing, .. }) => assert_eq!(missing, vec![1]),
            other => panic!("expected a connect timeout naming rank 1, got {other:?}"),
        }
    }
}
