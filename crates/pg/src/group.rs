//! The group model (pg spec, group model): slot, reserved capacity vs.
//! active mask, visible size, the links to peers, the op sequence. A
//! [`Group`] owns the shared state and the threads that run on it
//! (executor, watchdog, one reader per link) and is what the bindings use.
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
use crate::executor::executor_loop;
use crate::fault;
use crate::futex::Doorbell;
use crate::link::{PeerLink, ShmPair};
use crate::p2p::{self, P2p, PostedRecv};
use crate::plan::{kind_code, OpKind};
use crate::progress::run_op;
use crate::reader::reader_loop;
use crate::shared::{Op, Shared, MAX_CAPACITY};
use crate::shm::{self, Segment};
use crate::watchdog::watchdog_loop;
use crate::wire::{Hdr, KIND_BYE, KIND_MAPPED};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::thread::JoinHandle;
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

    /// Registers the int32 tensor mirroring the mask and writes it; the
    /// core rewrites it in place whenever the mask changes.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` int32 values (and aligned for
    /// them) until another tensor is registered or the group is dropped.
    pub unsafe fn set_mask_tensor(&self, ptr: usize, len: usize) {
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
            return Err(PgError::ConnectTimeout {
                secs: timeout.as_secs_f64(),
                missing,
            });
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
            return Err(PgError::BadPeer {
                peer: slot,
                rank: self.shared.rank,
                capacity: self.shared.capacity,
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
                self.shared.after_op(1u64 << s);
                done.complete(None, 1u64 << s);
                return Ok(done);
            }
        }
        // SAFETY: forwarded from this function's contract.
        let recv = unsafe { PostedRecv::new(ptr, len, done.clone()) };
        let sh = &self.shared;
        if let Some(failed) = sh.p2p.post_recv(src, recv, |s| sh.peer_dead(s)) {
            let s = src.unwrap_or(0);
            sh.fail_recvs(s, vec![failed]);
        }
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
        for r in self.shared.p2p.take_all() {
            r.done().complete(Some(PgError::Shutdown), 0);
        }
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
