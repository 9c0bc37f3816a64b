//! A process's session with a membership coordinator (upstream calls it the
//! Agent): one control connection per coordinator, shared by every group of
//! the process that the coordinator governs. It sends requests and waits
//! for their answers, and dispatches the coordinator's pushes (member
//! records, two-phase view changes, link queries, fencing) to the group
//! they name through [`GroupSink`]. Losing the session (the coordinator's
//! process ended) is reported to every group, which then falls back to
//! local failure handling.

use crate::error::PgError;
use crate::membership::control::{self, ToAgent, ToCoord};
use crate::membership::engine;
use crate::membership::handshake;
use mooncake_common::AuthKey;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::HashMap;
use std::io::BufReader;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// What a group does with the coordinator's pushes. Called on the agent's
/// reader thread, in the order the coordinator sent them.
pub(crate) trait GroupSink: Send + Sync {
    /// A member registered (expect its link).
    fn on_member(&self, rec: control::MemberRec);
    /// A member left or its process ended.
    fn on_member_gone(&self, slot: usize, member_id: u64);
    /// Phase one of a view change: returns `(next_seq, ready)` and gates
    /// collectives at `next_seq` until the commit or abort.
    fn on_prepare(&self, txn: u64, active: u64, members: Vec<control::MemberRec>) -> (u64, bool);
    /// Phase two: apply the view to collectives from `from_seq` on.
    fn on_commit(&self, view: control::ViewCommit);
    /// The view change was abandoned.
    fn on_abort(&self, txn: u64);
    /// `(our slot, slots whose links are dead)`.
    fn dead_links(&self) -> (usize, u64);
    /// We were dropped for failure.
    fn on_fenced(&self, epoch: u64);
    /// The coordinator is gone.
    fn on_agent_lost(&self);
}

struct Core {
    endpoint: String,
    /// Fingerprint of the cluster secret the session proved.
    auth: Option<u64>,
    writer: Mutex<TcpStream>,
    closer: TcpStream,
    alive: AtomicBool,
    next_req: AtomicU64,
    replies: Mutex<HashMap<u64, Option<ToAgent>>>,
    replies_cv: Condvar,
    groups: RwLock<HashMap<u64, Weak<dyn GroupSink>>>,
}

/// A live control session (closed when the last group drops it).
pub(crate) struct Agent {
    core: Arc<Core>,
}

static AGENTS: Mutex<Vec<Weak<Agent>>> = parking_lot::const_mutex(Vec::new());

impl Agent {
    /// The process's session with the coordinator at `endpoint`, opened on
    /// first use.
    /// The session proves `auth` (the group's cluster secret, if any); a
    /// session opened with another secret is not shared.
    pub(crate) fn connect(
        endpoint: &str,
        auth: Option<&AuthKey>,
        timeout: Duration,
    ) -> Result<Arc<Agent>, PgError> {
        let fingerprint = auth.map(AuthKey::fingerprint);
        let mut all = AGENTS.lock();
        all.retain(|w| w.strong_count() > 0);
        for w in all.iter() {
            if let Some(a) = w.upgrade() {
                if a.core.endpoint == endpoint && a.core.auth == fingerprint && a.is_alive() {
                    return Ok(a);
                }
            }
        }
        let a = Arc::new(Self::dial(endpoint, auth, timeout)?);
        all.push(Arc::downgrade(&a));
        Ok(a)
    }

    fn dial(endpoint: &str, auth: Option<&AuthKey>, timeout: Duration) -> Result<Agent, PgError> {
        let ctx = || format!("connect to the membership coordinator at {endpoint}");
        let addr = endpoint
            .to_socket_addrs()
            .map_err(|e| PgError::io(ctx(), e))?
            .next()
            .ok_or_else(|| PgError::io(ctx(), std::io::Error::other("no address")))?;
        let deadline = Instant::now() + timeout;
        let mut s = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(
                &addr,
                left.clamp(Duration::from_millis(10), Duration::from_secs(2)),
            ) {
                Ok(s) => break s,
                Err(e) if left.is_zero() => return Err(PgError::io(ctx(), e)),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let io = |e| PgError::io(ctx(), e);
        s.set_nodelay(true).map_err(io)?;
        s.set_read_timeout(Some(timeout.max(Duration::from_secs(1))))
            .map_err(io)?;
        let instance = engine::engine()?.instance_id();
        handshake::control_dial(&mut s, instance, auth).map_err(|e| {
            if handshake::is_auth_refusal(&e) {
                PgError::Auth {
                    reason: format!("the membership coordinator at {endpoint}: {e}"),
                }
            } else {
                io(e)
            }
        })?;
        s.set_read_timeout(None).map_err(io)?;
        let reader = s.try_clone().map_err(io)?;
        let closer = s.try_clone().map_err(io)?;
        let core = Arc::new(Core {
            endpoint: endpoint.to_string(),
            auth: auth.map(AuthKey::fingerprint),
            writer: Mutex::new(s),
            closer,
            alive: AtomicBool::new(true),
            next_req: AtomicU64::new(1),
            replies: Mutex::new(HashMap::new()),
            replies_cv: Condvar::new(),
            groups: RwLock::new(HashMap::new()),
        });
        let c = core.clone();
        std::thread::Builder::new()
            .name("mcpg-agent".into())
            .spawn(move || reader_loop(c, reader))
            .map_err(|e| PgError::io("spawn agent reader", e))?;
        Ok(Agent { core })
    }

    /// False once the session ended.
    pub(crate) fn is_alive(&self) -> bool {
        self.core.alive.load(Ordering::Acquire)
    }

    /// Routes the coordinator's pushes for group `key` to `sink`.
    pub(crate) fn attach_group(&self, key: u64, sink: Weak<dyn GroupSink>) {
        self.core.groups.write().insert(key, sink);
    }

    /// Stops routing pushes for group `key`.
    pub(crate) fn detach_group(&self, key: u64) {
        self.core.groups.write().remove(&key);
    }

    /// Sends a message that needs no answer; false when the session is gone.
    pub(crate) fn send(&self, msg: &ToCoord) -> bool {
        self.core.send(msg)
    }

    /// [`Agent::request`] that also gives up (with `Shutdown`) as soon as
    /// `cancelled` returns true (checked every 100 ms).
    pub(crate) fn request_until(
        &self,
        build: impl FnOnce(u64) -> ToCoord,
        timeout: Duration,
        cancelled: impl Fn() -> bool,
    ) -> Result<ToAgent, PgError> {
        self.request_inner(build, Some(timeout), &cancelled)
    }

    /// Sends the request `build(req_id)` and waits for its answer, for at
    /// most `timeout` (None: until the session ends).
    pub(crate) fn request(
        &self,
        build: impl FnOnce(u64) -> ToCoord,
        timeout: Option<Duration>,
    ) -> Result<ToAgent, PgError> {
        self.request_inner(build, timeout, &|| false)
    }

    fn request_inner(
        &self,
        build: impl FnOnce(u64) -> ToCoord,
        timeout: Option<Duration>,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<ToAgent, PgError> {
        let core = &self.core;
        let req = core.next_req.fetch_add(1, Ordering::Relaxed);
        core.replies.lock().insert(req, None);
        if !core.send(&build(req)) {
            core.replies.lock().remove(&req);
            return Err(lost(&core.endpoint));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut replies = core.replies.lock();
        loop {
            if let Some(Some(_)) = replies.get(&req) {
                return replies
                    .remove(&req)
                    .flatten()
                    .ok_or_else(|| lost(&core.endpoint));
            }
            if !core.alive.load(Ordering::Acquire) {
                replies.remove(&req);
                return Err(lost(&core.endpoint));
            }
            if cancelled() {
                replies.remove(&req);
                return Err(PgError::Shutdown);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                replies.remove(&req);
                return Err(PgError::CoordinatorTimeout {
                    secs: timeout.unwrap_or_default().as_secs_f64(),
                });
            }
            let slice = now + Duration::from_millis(100);
            let until = deadline.map_or(slice, |d| d.min(slice));
            core.replies_cv.wait_until(&mut replies, until);
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.core.closer.shutdown(Shutdown::Both);
    }
}

fn lost(endpoint: &str) -> PgError {
    PgError::CoordinatorLost {
        endpoint: endpoint.to_string(),
    }
}

impl Core {
    fn send(&self, msg: &ToCoord) -> bool {
        if !self.alive.load(Ordering::Acquire) {
            return false;
        }
        let mut w = self.writer.lock();
        control::write_msg(&mut *w, msg).is_ok()
    }

    fn sink(&self, key: u64) -> Option<Arc<dyn GroupSink>> {
        self.groups.read().get(&key).and_then(|w| w.upgrade())
    }
}

fn reader_loop(core: Arc<Core>, stream: TcpStream) {
    let mut r = BufReader::new(stream);
    while let Ok(msg) = control::read_msg::<ToAgent>(&mut r) {
        crate::fault::park_if_frozen();
        match msg {
            ToAgent::Registered { req, .. }
            | ToAgent::Failed { req, .. }
            | ToAgent::Done { req }
            | ToAgent::Proposed { req, .. }
            | ToAgent::Synced { req, .. } => {
                let mut replies = core.replies.lock();
                if let Some(slot) = replies.get_mut(&req) {
                    *slot = Some(msg);
                    core.replies_cv.notify_all();
                }
            }
            ToAgent::Member { group, rec } => {
                if let Some(s) = core.sink(group) {
                    s.on_member(rec);
                }
            }
            ToAgent::MemberGone {
                group,
                slot,
                member_id,
            } => {
                if let Some(s) = core.sink(group) {
                    s.on_member_gone(slot, member_id);
                }
            }
            ToAgent::Prepare {
                group,
                txn,
                active,
                members,
            } => {
                if let Some(s) = core.sink(group) {
                    let (slot, _) = s.dead_links();
                    let (next_seq, ready) = s.on_prepare(txn, active, members);
                    core.send(&ToCoord::PrepareAck {
                        group,
                        txn,
                        slot,
                        next_seq,
                        ready,
                    });
                }
            }
            ToAgent::Commit { group, view } => {
                if let Some(s) = core.sink(group) {
                    s.on_commit(view);
                    let (slot, _) = s.dead_links();
                    core.send(&ToCoord::CommitAck {
                        group,
                        txn: view.txn,
                        slot,
                    });
                }
            }
            ToAgent::Abort { group, txn } => {
                if let Some(s) = core.sink(group) {
                    s.on_abort(txn);
                }
            }
            ToAgent::Query { group } => {
                if let Some(s) = core.sink(group) {
                    let (slot, dead) = s.dead_links();
                    core.send(&ToCoord::Links { group, slot, dead });
                }
            }
            ToAgent::Fenced { group, epoch } => {
                if let Some(s) = core.sink(group) {
                    s.on_fenced(epoch);
                }
            }
        }
    }
    core.alive.store(false, Ordering::Release);
    {
        let _g = core.replies.lock();
        core.replies_cv.notify_all();
    }
    let sinks: Vec<Arc<dyn GroupSink>> = core
        .groups
        .read()
        .values()
        .filter_map(|w| w.upgrade())
        .collect();
    for s in sinks {
        s.on_agent_lost();
    }
}
