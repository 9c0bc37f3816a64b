//! The group model: slot, reserved capacity vs. active mask, visible size,
//! per-peer links and liveness, the op sequence and its executor thread.
//!
//! The active mask is a `u64` (capacity ≤ 64). Each collective snapshots it
//! when it starts executing; ranks found dead during the op are reported in
//! its failed set and, in auto mode, cleared from the mask before the op's
//! completion is signalled.

use crate::completion::Completion;
use crate::config::{Config, Transport};
use crate::dtype::check_reduction;
use crate::engine::{self, Engine, Incoming};
use crate::error::PgError;
use crate::fault;
use crate::futex::Doorbell;
use crate::link::{now_ns, reader_loop, PeerLink, ShmPair};
use crate::p2p::{self, P2p};
use crate::plan::{kind_code, OpKind};
use crate::progress::{run_op, Op};
use crate::shm::{self, Segment};
use crate::wire::{Hdr, KIND_BYE, KIND_MAPPED, KIND_PING};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest supported capacity (mask width).
pub const MAX_CAPACITY: usize = 64;

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
    /// Clear failed ranks from the mask automatically.
    pub auto_deactivate: bool,
}

/// What a member published about itself.
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

/// State shared by the group's threads.
pub struct Shared {
    /// Our slot.
    pub rank: usize,
    /// Declared size.
    pub size: usize,
    capacity: usize,
    is_extension: bool,
    auto_deactivate: bool,
    key: u64,
    member_id: u64,
    mask: AtomicU64,
    links: RwLock<Arc<Vec<Option<Arc<PeerLink>>>>>,
    heap_bell: Doorbell,
    /// Rung when an op is queued (the idle executor sleeps on it).
    submit_bell: Doorbell,
    /// Held by whichever thread is running ops (executor or an inline waiter).
    exec_lock: Mutex<()>,
    seg: Option<Arc<Segment>>,
    queue: Mutex<VecDeque<Op>>,
    next_seq: AtomicU64,
    shutdown: AtomicBool,
    /// P2P matching state.
    pub p2p: P2p,
    ctrl: Mutex<u64>,
    ctrl_cv: Condvar,
    mask_out: Mutex<Option<(usize, usize)>>,
    spin_us: AtomicU64,
    /// Torch group id (the key's first component), used by fault rules.
    pub label: Arc<str>,
    /// Peers the running collective involves (the watchdog probes them).
    pub waiting_coll: AtomicU64,
    watch: Mutex<()>,
    watch_cv: Condvar,
    /// Tunables.
    pub cfg: Config,
}

impl Shared {
    /// Our doorbell (in our shm segment when there is one).
    pub fn bell(&self) -> &Doorbell {
        match &self.seg {
            Some(s) => s.bell(),
            None => &self.heap_bell,
        }
    }

    /// Bounded spin before sleeping on the doorbell.
    pub fn spin(&self) -> Duration {
        Duration::from_micros(self.spin_us.load(Ordering::Relaxed))
    }

    /// Current active mask.
    pub fn mask(&self) -> u64 {
        self.mask.load(Ordering::Acquire)
    }

    /// True once shutdown started.
    pub fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// True if the link to `slot` is known broken (or absent).
    pub fn peer_dead(&self, slot: usize) -> bool {
        match self.links.read().get(slot) {
            Some(Some(l)) => l.is_dead(),
            _ => true,
        }
    }

    /// The links (indexed by slot).
    pub fn links(&self) -> Arc<Vec<Option<Arc<PeerLink>>>> {
        self.links.read().clone()
    }

    /// Wakes threads waiting for control frames.
    pub fn notify_ctrl(&self) {
        *self.ctrl.lock() += 1;
        self.ctrl_cv.notify_all();
    }

    /// Applies an op's outcome to the mask (auto mode): slots in `failed`
    /// are cleared before the op's completion is signalled (collectives
    /// and P2P alike).
    pub fn after_op(&self, failed: u64) {
        if !self.auto_deactivate {
            return;
        }
        let drop_mask = failed & !(1u64 << self.rank);
        if drop_mask != 0 {
            self.mask.fetch_and(!drop_mask, Ordering::AcqRel);
            self.write_mask();
        }
    }

    fn write_mask(&self) {
        let out = *self.mask_out.lock();
        if let Some((ptr, len)) = out {
            let m = self.mask();
            for i in 0..len.min(MAX_CAPACITY) {
                // SAFETY: the Python side registered an int32 tensor of `len`
                // elements and keeps it alive while registered.
                unsafe { (ptr as *mut i32).add(i).write_volatile((m >> i & 1) as i32) };
            }
        }
    }
}

/// A member of one process group.
pub struct Group {
    shared: Arc<Shared>,
    engine: Arc<Engine>,
    incoming: Mutex<Option<Receiver<Incoming>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Group {
    /// Creates the member: registers with the engine and, unless TCP is
    /// forced, creates its shared-memory segment.
    pub fn new(p: GroupParams) -> Result<Self, PgError> {
        if p.size == 0 || p.rank >= p.size {
            return Err(PgError::InvalidArgument(format!(
                "rank {} is outside a group of size {}",
                p.rank, p.size
            )));
        }
        if p.capacity < p.size || p.capacity > MAX_CAPACITY {
            return Err(PgError::InvalidArgument(format!(
                "capacity must satisfy group size ({}) <= capacity <= {MAX_CAPACITY}, got {}",
                p.size, p.capacity
            )));
        }
        let cfg = Config::from_env();
        fault::load_env().map_err(PgError::InvalidArgument)?;
        let engine = engine::engine()?;
        let member_id = engine::random_u64();
        let key = engine::stable_hash(&p.key);
        let incoming = engine.register(key, member_id)?;
        let seg = if cfg.transport == Transport::Auto && p.size > 1 {
            match Segment::create(&shm::unique_name(member_id), p.capacity) {
                Ok(s) => Some(Arc::new(s)),
                Err(_) => None,
            }
        } else {
            None
        };
        let mask = if p.is_extension {
            1u64 << p.rank
        } else if p.size == 64 {
            u64::MAX
        } else {
            (1u64 << p.size) - 1
        };
        let shared = Arc::new(Shared {
            rank: p.rank,
            size: p.size,
            capacity: p.capacity,
            is_extension: p.is_extension,
            auto_deactivate: p.auto_deactivate,
            key,
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
            cfg,
        });
        let g = Group {
            shared,
            engine,
            incoming: Mutex::new(Some(incoming)),
            threads: Mutex::new(Vec::new()),
        };
        let sh = g.shared.clone();
        let h = std::thread::Builder::new()
            .name("mcpg-exec".into())
            .spawn(move || executor_loop(sh))
            .map_err(|e| PgError::io("spawn executor", e))?;
        g.threads.lock().push(h);
        let sh = g.shared.clone();
        let h = std::thread::Builder::new()
            .name("mcpg-watch".into())
            .spawn(move || watchdog_loop(sh))
            .map_err(|e| PgError::io("spawn watchdog", e))?;
        g.threads.lock().push(h);
        Ok(g)
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
        self.shared.capacity
    }

    /// Active mask as a bitmap.
    pub fn mask(&self) -> u64 {
        self.shared.mask()
    }

    /// Visible size V: 1 + highest active slot (declared size for an
    /// extension member that has not joined).
    pub fn visible_size(&self) -> usize {
        if self.shared.is_extension {
            return self.shared.size;
        }
        64 - self.shared.mask().leading_zeros() as usize
    }

    /// Sets the bounded spin (µs) before sleeping; 0 disables spinning.
    pub fn set_spin_us(&self, us: u64) {
        self.shared.spin_us.store(us.min(1000), Ordering::Relaxed);
    }

    /// Registers the int32 tensor mirroring the mask and writes it.
    pub fn set_mask_tensor(&self, ptr: usize, len: usize) {
        *self.shared.mask_out.lock() = Some((ptr, len));
        self.shared.write_mask();
    }

    /// Number of peers whose shm rings are in use (for tests and logs).
    pub fn shm_peer_count(&self) -> usize {
        self.shared
            .links
            .read()
            .iter()
            .flatten()
            .filter(|l| l.uses_shm())
            .count()
    }

    /// Connects to every listed peer (all initially active slots but ours),
    /// then sets up shared memory with same-host peers.
    pub fn connect(&self, peers: Vec<PeerInfo>, timeout: Duration) -> Result<(), PgError> {
        let deadline = Instant::now() + timeout;
        let me = self.shared.rank;
        let mut streams: Vec<Option<std::net::TcpStream>> =
            (0..self.shared.capacity).map(|_| None).collect();
        let mut backoff = Duration::from_millis(5);
        // Outbound to lower slots.
        for p in peers.iter().filter(|p| p.slot < me) {
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                if fault::fail_connect(&self.shared.label, p.slot) {
                    std::thread::sleep(left.min(Duration::from_millis(100)));
                    continue;
                }
                match engine::dial(
                    &p.endpoint,
                    self.shared.key,
                    me as u32,
                    self.shared.member_id,
                    p.member_id,
                    left.min(Duration::from_secs(2)),
                ) {
                    Ok(Some(s)) => {
                        streams[p.slot] = Some(s);
                        break;
                    }
                    _ => {
                        std::thread::sleep(backoff.min(left));
                        backoff = (backoff * 2).min(Duration::from_millis(200));
                    }
                }
            }
        }
        // Inbound from higher slots.
        let rx = self.incoming.lock().take();
        if let Some(rx) = rx.as_ref() {
            let want = |s: &[Option<std::net::TcpStream>]| {
                peers
                    .iter()
                    .any(|p| p.slot > me && s.get(p.slot).is_none_or(|x| x.is_none()))
            };
            while want(&streams) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                if let Ok(inc) = rx.recv_timeout(left) {
                    let slot = inc.slot as usize;
                    let ok = peers
                        .iter()
                        .any(|p| p.slot == slot && p.slot > me && p.member_id == inc.member_id);
                    if ok {
                        streams[slot] = Some(inc.stream);
                    }
                }
            }
        }
        *self.incoming.lock() = rx;
        let missing: Vec<usize> = peers
            .iter()
            .filter(|p| streams.get(p.slot).is_none_or(|s| s.is_none()))
            .map(|p| p.slot)
            .collect();
        if !missing.is_empty() {
            return Err(PgError::Timeout(format!(
                "timed out after {:.1}s connecting to rank(s) {missing:?}",
                timeout.as_secs_f64()
            )));
        }
        // Links and readers.
        let mut links: Vec<Option<Arc<PeerLink>>> = (*self.shared.links.read().clone()).clone();
        let mut new_links = Vec::new();
        for p in &peers {
            let Some(s) = streams.get_mut(p.slot).and_then(|s| s.take()) else {
                continue;
            };
            let rs = s.try_clone().map_err(|e| PgError::io("clone socket", e))?;
            let closer = s.try_clone().map_err(|e| PgError::io("clone socket", e))?;
            let l = Arc::new(PeerLink::new(
                p.slot,
                me,
                p.member_id,
                s,
                closer,
                self.shared.label.clone(),
            ));
            links[p.slot] = Some(l.clone());
            new_links.push((l, rs));
        }
        *self.shared.links.write() = Arc::new(links);
        for (l, rs) in new_links {
            let sh = self.shared.clone();
            let h = std::thread::Builder::new()
                .name("mcpg-read".into())
                .spawn(move || reader_loop(sh, l, rs))
                .map_err(|e| PgError::io("spawn reader", e))?;
            self.threads.lock().push(h);
        }
        self.setup_shm(&peers, deadline);
        Ok(())
    }

    fn setup_shm(&self, peers: &[PeerInfo], deadline: Instant) {
        let Some(own) = self.shared.seg.clone() else {
            return;
        };
        let links = self.shared.links.read().clone();
        let mut opened: Vec<(usize, Option<Arc<Segment>>)> = Vec::new();
        for p in peers
            .iter()
            .filter(|p| p.same_host && !p.shm_name.is_empty())
        {
            let seg = Segment::open(&p.shm_name)
                .ok()
                .filter(|s| s.capacity() > self.shared.rank)
                .map(Arc::new);
            if let Some(Some(l)) = links.get(p.slot) {
                let hdr = Hdr {
                    kind: KIND_MAPPED,
                    aux: u32::from(seg.is_some()),
                    ..Default::default()
                };
                let _ = l.write_frame(&hdr, &[]);
                opened.push((p.slot, seg));
            }
        }
        let mut ctrl = self.shared.ctrl.lock();
        loop {
            let all = opened.iter().all(|(slot, _)| match links.get(*slot) {
                Some(Some(l)) => l.mapped.load(Ordering::Acquire) != 0 || l.is_dead(),
                _ => true,
            });
            if all || Instant::now() >= deadline {
                break;
            }
            self.shared.ctrl_cv.wait_until(&mut ctrl, deadline);
        }
        drop(ctrl);
        for (slot, seg) in opened {
            if let (Some(Some(l)), Some(seg)) = (links.get(slot), seg) {
                if l.mapped.load(Ordering::Acquire) == 1 {
                    l.attach_shm(ShmPair {
                        peer: seg,
                        own: own.clone(),
                    });
                }
            }
        }
        own.unlink();
    }

    /// Queues a collective; the executor runs it in sequence order.
    pub fn submit(
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
                let op = self.shared.queue.lock().pop_front();
                let Some(op) = op else { break };
                let links = self.shared.links.read().clone();
                run_op(&self.shared, &links, op);
                drop(guard);
                if !self.shared.queue.lock().is_empty() {
                    self.shared.submit_bell.ring();
                }
            }
        }
        done.wait(timeout)
    }

    fn active_link(&self, slot: usize) -> Result<Option<Arc<PeerLink>>, PgError> {
        if slot >= self.shared.capacity || slot == self.shared.rank {
            return Err(PgError::InvalidArgument(format!(
                "peer rank {slot} is invalid for rank {} in a group of capacity {}",
                self.shared.rank, self.shared.capacity
            )));
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
                    std::slice::from_raw_parts(ptr as *const u8, len)
                };
                if p2p::send(&l, self.shared.cfg.p2p_frame, data).is_err() {
                    l.mark_dead();
                    self.shared.after_op(1u64 << dst);
                    done.complete(None, 1u64 << dst);
                } else {
                    done.complete(None, 0);
                }
            }
            _ => {
                self.shared.after_op(1u64 << dst);
                done.complete(None, 1u64 << dst)
            }
        }
        Ok(done)
    }

    /// Posts a receive of `len` bytes into `ptr` from `src` (any if `None`).
    pub fn recv(
        &self,
        src: Option<usize>,
        ptr: usize,
        len: usize,
    ) -> Result<Arc<Completion>, PgError> {
        let done = Arc::new(Completion::new());
        if let Some(s) = src {
            if self.active_link(s)?.is_none() {
                done.set_source(s);
                self.shared.after_op(1u64 << s);
                done.complete(None, 1u64 << s);
                return Ok(done);
            }
        }
        p2p::post_recv(&self.shared, src, ptr, len, done.clone());
        Ok(done)
    }

    /// Stops the executor, says goodbye to peers and closes every link.
    pub fn shutdown(&self) {
        if self.shared.shutdown.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.bell().ring();
        self.shared.submit_bell.ring();
        {
            let _g = self.shared.watch.lock();
            self.shared.watch_cv.notify_all();
        }
        let links = self.shared.links.read().clone();
        let bye = Hdr {
            kind: KIND_BYE,
            ..Default::default()
        };
        let threads: Vec<JoinHandle<()>> = self.threads.lock().drain(..).collect();
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
        p2p::fail_all(&self.shared);
        self.engine
            .unregister(self.shared.key, self.shared.member_id);
        if let Some(s) = &self.shared.seg {
            s.unlink();
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn executor_loop(shared: Arc<Shared>) {
    loop {
        let seen = shared.submit_bell.observe();
        if let Some(_guard) = shared.exec_lock.try_lock() {
            let op = shared.queue.lock().pop_front();
            if let Some(op) = op {
                if shared.is_shutdown() {
                    op.done
                        .complete(Some("process group has been shut down".into()), 0);
                } else {
                    let links = shared.links.read().clone();
                    run_op(&shared, &links, op);
                }
                continue;
            }
        }
        if shared.is_shutdown() && shared.queue.lock().is_empty() {
            return;
        }
        shared
            .submit_bell
            .wait(seen, Duration::from_millis(500), Duration::ZERO);
    }
}

/// Liveness watchdog (spec §5.2): while anything waits on a peer (a running
/// collective, a posted receive, a blocked write), PINGs that peer every
/// `min(T/4, 100 ms)` and fences it once it has been silent for T (no frame
/// received, no write completed). Live peers answer from their reader
/// threads, so a slow but live peer is never fenced. While nothing waits it
/// sleeps for `min(T/2, 1 s)` (only shutdown wakes it early), so a failure is
/// declared within `T + min(T/2, 1 s) + min(T/4, 100 ms)` < 2·T.
fn watchdog_loop(shared: Arc<Shared>) {
    let cap = shared.capacity;
    let mut since: Vec<Option<u64>> = vec![None; cap];
    let mut pinged: Vec<u64> = vec![0; cap];
    loop {
        if shared.is_shutdown() {
            return;
        }
        fault::park_if_frozen();
        let links = shared.links();
        let coll = shared.waiting_coll.load(Ordering::Acquire);
        let waited = coll | shared.p2p.waited_mask(cap);
        let mut watching = false;
        let now = now_ns();
        let (tc, tp) = (shared.cfg.coll_timeout(), shared.cfg.p2p_timeout());
        for (slot, l) in links.iter().enumerate() {
            let Some(l) = l.as_ref().filter(|l| !l.is_dead()) else {
                since[slot] = None;
                continue;
            };
            if waited >> slot & 1 == 0 && !l.writing() {
                since[slot] = None;
                continue;
            }
            watching = true;
            let t = if coll >> slot & 1 == 1 { tc } else { tp };
            let start = *since[slot].get_or_insert(now);
            let heard = l.last_heard_ns().max(start);
            let silent = now.saturating_sub(heard);
            if silent > t.as_nanos() as u64 {
                if crate::config::log_info() {
                    eprintln!(
                        "mooncake-pg: group {} rank {}: rank {slot} silent for {:.1}s; declared failed",
                        shared.label,
                        shared.rank,
                        silent as f64 / 1e9
                    );
                }
                l.fence();
                shared.bell().ring();
                shared.notify_ctrl();
                since[slot] = None;
                continue;
            }
            let every = (t / 4).min(Duration::from_millis(100)).as_nanos() as u64;
            if now.saturating_sub(pinged[slot]) >= every && l.try_write_ctrl(KIND_PING) {
                pinged[slot] = now;
            }
        }
        let tick = (tc.min(tp) / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
        let mut g = shared.watch.lock();
        if shared.is_shutdown() {
            return;
        }
        if watching {
            shared.watch_cv.wait_for(&mut g, tick);
        } else {
            // Ops do not wake us (that would cost each op a thread wakeup);
            // a new wait is noticed within this bound instead.
            let idle = (tc.min(tp) / 2).clamp(Duration::from_millis(1), Duration::from_secs(1));
            shared.watch_cv.wait_for(&mut g, idle);
        }
    }
}
