//! The dummy client (`setup_dummy`): a store client without a segment or a
//! master connection of its own. Every store method is one request to the
//! `mooncake_client` daemon on this host, whose client does the work.
//!
//! It implements `StoreApi`: the plain-value queries and the
//! memory-moving calls are generated from their lists (`queries`,
//! `moves`); the others are its inherent methods, most of them generated
//! by `daemon_calls!` from their signature, the request they send and how
//! caller memory is handed over.
//!
//! Payloads stay in shared memory. A caller pointer inside a region of this
//! process's shared memory (`MooncakeHostMemAllocator`, `alloc_from_mem_pool`)
//! goes to the daemon as (region, offset, length), the region's memfd having
//! been handed over once; the daemon's client then reads or writes those
//! bytes in place. Any other pointer (a Python `bytes` value, a plain
//! tensor) is copied through staging memory that the daemon maps: the
//! local buffer of `local_buffer_size` bytes, or a temporary region when a
//! value does not fit there.
//!
//! Failures keep the daemon's codes. A daemon that is gone (killed,
//! restarted) fails each call with RPC_FAIL (-900), one that does not
//! answer within `MC_STANDALONE_TIMEOUT_MS` (default 60 s) with RPC_TIMEOUT
//! (-901): a dummy never hangs on a dead daemon, and `setup_dummy` to the
//! new daemon makes it work again.

use crate::bufs::Buf;
use crate::moves::{dummy_moves, Hand, Move};
use crate::queries::{dummy_queries, Query};
use crate::shm::{self, Carver, Region};
use crate::wire::{
    self, Attached, Call, Control, Open, Service, WireDest, WireOutput, WireRead, WireRoute,
    WireWrite,
};
use mooncake_client::{
    store_forward_to_inherent, Error, ErrorCode, OwnedValues, Ranges, ReplicateConfig, Result,
    StagedValue, StoreApi, TensorAlloc, TensorDest, TensorWrite, WriteMode, HEALTH_CLOSED,
    HEALTH_PING_FAILED,
};
use mooncake_common::framing::{client_handshake, encode};
use mooncake_common::AuthKey;
use mooncake_tensor::{numel, ReadOutput, ReadRequest, WriteRoute};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use std::collections::HashSet;
use std::io;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How long a call waits for the daemon's answer (ms), unless
/// `MC_STANDALONE_TIMEOUT_MS` says otherwise.
const DEFAULT_TIMEOUT_MS: u64 = 60_000;

/// Most idle connections a dummy keeps open to its daemon.
const MAX_IDLE_CONNS: usize = 32;

/// Calls moving fewer bytes than this are copied by one thread of the
/// daemon (its client spreads larger local copies over every core).
const SPIN_PAYLOAD_MAX: u64 = 8 << 20;

/// How long a dummy polls for the reply to a call moving fewer than
/// [`SPIN_PAYLOAD_MAX`] bytes before it blocks (µs), unless
/// `MC_STANDALONE_SPIN_US` says otherwise.
const DEFAULT_REPLY_SPIN_US: u64 = 1000;

/// How long to poll for the reply to `call` before blocking.
///
/// An in-process client's calling thread does the work itself and never
/// sleeps; a dummy's thread waits for the daemon, and waking it once the
/// reply is there costs tens of microseconds on a VM's idle core, several
/// per call counting the daemon's thread, which then parks too. So a dummy
/// polls for the reply of a call the daemon serves on one thread (metadata
/// calls, and payloads below [`SPIN_PAYLOAD_MAX`]), yielding the core
/// between polls, for up to `MC_STANDALONE_SPIN_US` (default 1 ms), and
/// blocks as soon as a yield shows another thread wants the core (see
/// `wire::recv_within`). Larger calls keep the core free for the daemon's
/// copy threads and poll only `MC_RPC_SPIN_US`.
fn reply_spin(call: &Call) -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    let spin = *SPIN.get_or_init(|| {
        let us = std::env::var("MC_STANDALONE_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_REPLY_SPIN_US);
        Duration::from_micros(us)
    });
    match call.payload() {
        Some(n) if n < SPIN_PAYLOAD_MAX => spin,
        _ => Duration::ZERO,
    }
}

fn call_timeout() -> Duration {
    let ms = std::env::var("MC_STANDALONE_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&v| v > 0)
        .unwrap_or(DEFAULT_TIMEOUT_MS);
    Duration::from_millis(ms)
}

/// The port of `host:port` (a dummy's daemon always runs on this host).
fn parse_port(address: &str) -> Result<u16> {
    let port = address
        .rsplit_once(':')
        .map(|(_, p)| p)
        .ok_or_else(|| Error::internal(format!("server_address {address:?} has no port")))?;
    port.parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| Error::internal(format!("server_address {address:?} has an invalid port")))
}

/// A dummy client attached to a daemon. Thread-safe; calls from several
/// threads run at once, each on a connection of its own.
pub(crate) struct DummyClient {
    id: String,
    address: String,
    port: u16,
    key: Option<AuthKey>,
    attached: Attached,
    timeout: Duration,
    control: Mutex<Option<UnixStream>>,
    idle: Mutex<Vec<UnixStream>>,
    /// Regions the daemon has mapped.
    mapped: Mutex<HashSet<u64>>,
    /// The local buffer (staging), when `local_buffer_size > 0`.
    local: Option<Carver>,
    /// The memory pool `alloc_from_mem_pool` carves, made on first use.
    pool: Mutex<Option<Carver>>,
    mem_pool_size: u64,
    closed: AtomicBool,
    staged_bytes: AtomicU64,
    shared_bytes: AtomicU64,
    staged_note: std::sync::Once,
}

/// A region of staging memory held for one call.
enum Lease {
    /// Bytes of the local buffer.
    Local(u64, u64),
    /// A temporary region (unmapped when the call is done).
    Temp(Arc<Region>),
}

/// The caller memory one call hands to the daemon: staging leases, and the
/// staged destinations to copy back once the daemon has written them.
pub(crate) struct Handoff<'a> {
    dummy: &'a DummyClient,
    leases: Vec<Lease>,
    /// (caller pointer, staging pointer, length).
    back: Vec<(usize, usize, u64)>,
    /// The shared region the last in-place buffer lay in (base, size, id),
    /// mapped by the daemon: the next buffers of a call usually lie there too.
    last: Option<(usize, u64, u64)>,
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        for lease in self.leases.drain(..) {
            match lease {
                Lease::Local(off, len) => {
                    if let Some(c) = &self.dummy.local {
                        c.give(off, len);
                    }
                }
                Lease::Temp(r) => self.dummy.unmap(r.id),
            }
        }
    }
}

impl Handoff<'_> {
    /// `len` bytes of staging memory: (the daemon's name for them, their address here).
    fn stage(&mut self, len: u64) -> Result<(Buf, usize)> {
        let d = self.dummy;
        d.staged_note.call_once(|| {
            tracing::info!(
                "the dummy client copies memory outside shared memory through its staging \
                 buffer; allocate buffers with MooncakeHostMemAllocator or alloc_from_mem_pool \
                 to hand them to the daemon in place"
            )
        });
        if let Some(c) = &d.local {
            if let Some(off) = c.take(len) {
                self.leases.push(Lease::Local(off, len));
                let r = c.region();
                let buf = Buf {
                    region: r.id,
                    offset: off,
                    len,
                };
                return Ok((buf, r.base() + off as usize));
            }
        }
        let r = shm::create(len).map_err(|e| {
            Error::internal(format!(
                "cannot allocate {len} bytes of staging memory: {e}"
            ))
        })?;
        d.map(&r)?;
        let buf = Buf {
            region: r.id,
            offset: 0,
            len,
        };
        let at = r.base();
        self.leases.push(Lease::Temp(r));
        Ok((buf, at))
    }

    /// Hand `ptr..ptr+len` in place when it lies in shared memory, else
    /// staged: copied in first when `copy_in`, copied back after the call
    /// when `copy_back`. A null pointer or an empty range goes as is (the
    /// daemon's client applies its rules to it).
    fn place(&mut self, ptr: usize, len: u64, copy_in: bool, copy_back: bool) -> Result<Buf> {
        if ptr == 0 || len == 0 {
            return Ok(Buf {
                region: 0,
                offset: if ptr == 0 { 0 } else { 1 },
                len,
            });
        }
        if let Some((base, size, region)) = self.last {
            let off = ptr.wrapping_sub(base) as u64;
            if ptr >= base && off.checked_add(len).is_some_and(|end| end <= size) {
                self.dummy.shared_bytes.fetch_add(len, Ordering::Relaxed);
                return Ok(Buf {
                    region,
                    offset: off,
                    len,
                });
            }
        }
        if let Some((r, off)) = shm::find(ptr, len) {
            self.dummy.ensure_mapped(&r)?;
            self.dummy.shared_bytes.fetch_add(len, Ordering::Relaxed);
            self.last = Some((r.base(), r.size(), r.id));
            return Ok(Buf {
                region: r.id,
                offset: off,
                len,
            });
        }
        let (buf, at) = self.stage(len)?;
        if copy_in {
            // SAFETY: the caller vouches for `ptr..ptr+len`; `at` is `len`
            // bytes of staging memory this call holds.
            unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, at as *mut u8, len as usize) };
        }
        if copy_back {
            self.back.push((ptr, at, len));
        }
        self.dummy.staged_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(buf)
    }

    /// A source the daemon reads.
    fn src(&mut self, ptr: usize, len: u64) -> Result<Buf> {
        self.place(ptr, len, true, false)
    }

    /// A destination the daemon writes (`keep`: bytes it may leave
    /// untouched keep their value).
    fn dst(&mut self, ptr: usize, len: u64, keep: bool) -> Result<Buf> {
        self.place(ptr, len, keep, true)
    }

    /// Copy staged destinations back to the caller's memory.
    fn finish(&mut self) {
        for (ptr, at, len) in self.back.drain(..) {
            // SAFETY: `ptr..ptr+len` is the caller's writable destination
            // (vouched for when it was placed); `at` is staging memory this
            // call still holds.
            unsafe { std::ptr::copy_nonoverlapping(at as *const u8, ptr as *mut u8, len as usize) };
        }
    }
}

/// Caller memory of a memory-moving call: a source, or a destination
/// (`writes`) whose bytes the daemon leaves untouched keep their value.
impl Hand for Handoff<'_> {
    unsafe fn mem(&mut self, ptr: usize, len: u64, writes: bool) -> Result<Buf> {
        self.place(ptr, len, true, writes)
    }
}

impl DummyClient {
    /// `setup_dummy(mem_pool_size, local_buffer_size, server_address)`:
    /// attach to the daemon serving `server_address`'s port on this host.
    /// Every failure is INTERNAL_ERROR (-1, upstream's code) with its reason.
    pub(crate) fn setup(
        mem_pool_size: u64,
        local_buffer_size: u64,
        server_address: &str,
    ) -> Result<Arc<DummyClient>> {
        let port = parse_port(server_address)?;
        let key = AuthKey::from_env()
            .map_err(|e| Error::internal(format!("cannot load the cluster token: {e}")))?;
        let id = uuid::Uuid::new_v4().to_string();
        let timeout = call_timeout();
        let mut control = connect(port, key.as_ref(), timeout).map_err(|e| {
            Error::internal(format!(
                "no mooncake_client daemon answers for {server_address} on this host \
                 (abstract socket @{}): {e}",
                wire::socket_name(port)
            ))
        })?;
        let open = Open::Attach {
            dummy: id.clone(),
            pid: std::process::id(),
            cluster_id: mooncake_common::ha::client_cluster_id(),
            mem_pool_size,
            local_buffer_size,
        };
        let attached: Result<Attached> = wire::send(&mut control, &open)
            .and_then(|()| wire::recv(&mut control))
            .map_err(|e| {
                Error::internal(format!(
                    "the mooncake_client daemon at {server_address} broke off attaching: {e}"
                ))
            })?;
        let attached = attached.map_err(|e| Error::new(ErrorCode::InternalError, e.to_string()))?;
        let local = if local_buffer_size > 0 {
            let r = shm::create(local_buffer_size).map_err(|e| {
                Error::internal(format!(
                    "cannot allocate a local buffer of {local_buffer_size} bytes: {e}"
                ))
            })?;
            Some(Carver::new(r))
        } else {
            None
        };
        let dummy = Arc::new(DummyClient {
            id,
            address: server_address.to_string(),
            port,
            key,
            attached,
            timeout,
            control: Mutex::new(Some(control)),
            idle: Mutex::new(Vec::new()),
            mapped: Mutex::new(HashSet::new()),
            local,
            pool: Mutex::new(None),
            mem_pool_size,
            closed: AtomicBool::new(false),
            staged_bytes: AtomicU64::new(0),
            shared_bytes: AtomicU64::new(0),
            staged_note: std::sync::Once::new(),
        });
        if let Some(c) = &dummy.local {
            dummy.map(c.region())?;
        }
        let weak: Weak<DummyClient> = Arc::downgrade(&dummy);
        shm::on_free(move |region| match weak.upgrade() {
            Some(d) => {
                d.unmap(region);
                !d.is_closed()
            }
            None => false,
        });
        tracing::info!(daemon = %dummy.address, "dummy client attached");
        Ok(dummy)
    }

    /// Whether `close` was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Detach: the daemon forgets this dummy's memory, buffers and sessions.
    /// Idempotent.
    pub(crate) fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.idle.lock().clear();
        // Closing the control connection is the detach.
        drop(self.control.lock().take());
        self.mapped.lock().clear();
    }

    /// `get_hostname()` of a dummy client: `""` (upstream: a dummy has no segment).
    pub(crate) fn hostname(&self) -> String {
        String::new()
    }

    /// `health_check()`: healthy while the daemon answers, 2 when it does
    /// not, 1 after `close`.
    pub(crate) fn health(&self) -> i32 {
        if self.is_closed() {
            return HEALTH_CLOSED;
        }
        match self.control_call::<i32>(&Control::Ping, None) {
            Ok(h) => h,
            Err(_) => HEALTH_PING_FAILED,
        }
    }

    fn lost(&self, e: &io::Error) -> Error {
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            return Error::new(
                ErrorCode::RpcTimeout,
                format!(
                    "the mooncake_client daemon at {} did not answer within {} ms",
                    self.address,
                    self.timeout.as_millis()
                ),
            );
        }
        Error::new(
            ErrorCode::RpcFail,
            format!(
                "the mooncake_client daemon at {} is unreachable ({e}); if it restarted, call \
                 setup_dummy again",
                self.address
            ),
        )
    }

    fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            Err(Error::not_set_up())
        } else {
            Ok(())
        }
    }

    /// One request on the control connection.
    fn control_call<T: DeserializeOwned>(&self, req: &Control, fd: Option<i32>) -> Result<T> {
        self.check_open()?;
        let mut guard = self.control.lock();
        let Some(c) = guard.as_mut() else {
            return Err(Error::not_set_up());
        };
        let r = wire::send(c, req)
            .and_then(|()| fd.map_or(Ok(()), |fd| wire::send_fd(c, fd)))
            .and_then(|()| wire::recv::<T>(c));
        r.map_err(|e| self.lost(&e))
    }

    /// Have the daemon map `r`.
    fn map(&self, r: &Arc<Region>) -> Result<()> {
        let req = Control::Map {
            region: r.id,
            size: r.size(),
        };
        let done: Result<()> = self.control_call(&req, Some(r.seg.fd().as_raw_fd()))?;
        done?;
        self.mapped.lock().insert(r.id);
        Ok(())
    }

    fn ensure_mapped(&self, r: &Arc<Region>) -> Result<()> {
        if self.mapped.lock().contains(&r.id) {
            return Ok(());
        }
        self.map(r)
    }

    /// Have the daemon drop region `id` (if it mapped it).
    fn unmap(&self, id: u64) {
        if !self.mapped.lock().remove(&id) {
            return;
        }
        let r: Result<Result<()>> = self.control_call(&Control::Unmap { region: id }, None);
        if let Err(e) | Ok(Err(e)) = r {
            tracing::debug!(region = id, error = %e, "daemon could not unmap a region");
        }
    }

    /// A connection for one call (an idle one, or a new one).
    fn conn(&self) -> Result<UnixStream> {
        self.check_open()?;
        if let Some(c) = self.idle.lock().pop() {
            return Ok(c);
        }
        let mut c =
            connect(self.port, self.key.as_ref(), self.timeout).map_err(|e| self.lost(&e))?;
        let open = Open::Join {
            dummy: self.id.clone(),
        };
        let joined: Result<Attached> = wire::send(&mut c, &open)
            .and_then(|()| wire::recv(&mut c))
            .map_err(|e| self.lost(&e))?;
        let joined = joined.map_err(|e| Error::new(ErrorCode::RpcFail, e.reason().to_string()))?;
        if joined.daemon != self.attached.daemon {
            return Err(Error::new(
                ErrorCode::RpcFail,
                format!(
                    "the mooncake_client daemon at {} restarted; call setup_dummy again",
                    self.address
                ),
            ));
        }
        Ok(c)
    }

    fn put_back(&self, c: UnixStream) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE_CONNS && !self.is_closed() {
            idle.push(c);
        }
    }

    /// One call and its reply.
    fn call<T: DeserializeOwned>(&self, call: &Call) -> Result<T> {
        let mut c = self.conn()?;
        let r = wire::send(&mut c, call)
            .and_then(|()| wire::recv_within::<T>(&mut c, reply_spin(call)));
        match r {
            Ok(v) => {
                self.put_back(c);
                Ok(v)
            }
            Err(e) => Err(self.lost(&e)),
        }
    }

    /// A two-phase call: the daemon's first answer `A` decides the
    /// dummy's second frame (`next(a)`), then the final reply `T`.
    fn call2<A, N, T, F>(&self, call: &Call, next: F) -> Result<T>
    where
        A: DeserializeOwned,
        N: serde::Serialize,
        T: DeserializeOwned,
        F: FnOnce(A) -> N,
    {
        let mut c = self.conn()?;
        let r = wire::send(&mut c, call)
            .and_then(|()| wire::recv::<A>(&mut c))
            .and_then(|a| wire::send(&mut c, &next(a)))
            .and_then(|()| wire::recv::<T>(&mut c));
        match r {
            Ok(v) => {
                self.put_back(c);
                Ok(v)
            }
            Err(e) => Err(self.lost(&e)),
        }
    }

    /// One query (see `queries`): its arguments encoded, its reply decoded.
    pub(crate) fn query<A: serde::Serialize, T: DeserializeOwned>(
        &self,
        query: Query,
        args: &A,
    ) -> Result<T> {
        let args = encode(args).map_err(|e| {
            Error::internal(format!("cannot encode the arguments of {query:?}: {e}"))
        })?;
        self.call::<T>(&Call::Query { query, args })
    }

    /// One memory-moving call (see `moves`): its carried arguments
    /// encoded, naming `payload` bytes of shared memory; its reply decoded.
    pub(crate) fn moving<A: serde::Serialize, T: DeserializeOwned>(
        &self,
        mv: Move,
        args: &A,
        payload: u64,
    ) -> Result<T> {
        let args = encode(args)
            .map_err(|e| Error::internal(format!("cannot encode the arguments of {mv:?}: {e}")))?;
        self.call::<T>(&Call::Move { mv, args, payload })
    }

    pub(crate) fn handoff(&self) -> Handoff<'_> {
        Handoff {
            dummy: self,
            leases: Vec::new(),
            back: Vec::new(),
            last: None,
        }
    }

    /// `register_buffer`: the buffer must lie in this process's shared
    /// memory (upstream's rule for dummy clients: -1 otherwise).
    pub(crate) fn register_buffer(&self, ptr: usize, size: usize) -> Result<()> {
        let Some((r, off)) = shm::find(ptr, size as u64) else {
            return Err(Error::internal(format!(
                "buffer {ptr:#x} size {size} is not in shared memory; a dummy client registers \
                 only memory from MooncakeHostMemAllocator or alloc_from_mem_pool"
            )));
        };
        self.ensure_mapped(&r)?;
        let buf = Buf {
            region: r.id,
            offset: off,
            len: size as u64,
        };
        self.control_call::<Result<()>>(&Control::Register(buf), None)?
    }

    /// `unregister_buffer`.
    pub(crate) fn unregister_buffer(&self, ptr: usize) -> Result<()> {
        let Some((r, off)) = shm::find(ptr, 0) else {
            return Err(Error::invalid(format!(
                "no registered buffer starts at {ptr:#x}"
            )));
        };
        let buf = Buf {
            region: r.id,
            offset: off,
            len: 0,
        };
        self.control_call::<Result<()>>(&Control::Unregister(buf), None)?
    }

    /// `alloc_from_mem_pool(size)`: shared memory the daemon reads and
    /// writes in place, carved from the pool of `mem_pool_size` bytes (a
    /// request that does not fit gets a region of its own); 0 on failure.
    pub(crate) fn alloc_from_mem_pool(&self, size: u64) -> u64 {
        if size == 0 || self.is_closed() {
            return 0;
        }
        let mut pool = self.pool.lock();
        if pool.is_none() && self.mem_pool_size >= size {
            match shm::create(self.mem_pool_size) {
                Ok(r) => {
                    shm::insert(&r);
                    *pool = Some(Carver::new(r));
                }
                Err(e) => {
                    tracing::warn!(size = self.mem_pool_size, error = %e, "cannot allocate the memory pool")
                }
            }
        }
        if let Some(c) = pool.as_ref() {
            if let Some(off) = c.take(size) {
                return (c.region().base() + off as usize) as u64;
            }
        }
        drop(pool);
        shm::host_alloc(size) as u64
    }

    /// Whole values (`get`, `get_batch`, `get_buffer`): the daemon reads them
    /// into staging memory, copied from there into owned vectors.
    pub(crate) fn get_batch(&self, keys: &[String]) -> Vec<Result<StagedValue>> {
        let mut vals = OwnedValues::default();
        let sizes = self.get_batch_with(keys, |sizes| vals.alloc(sizes));
        vals.finish(sizes)
            .map(|r| r.map(StagedValue::owned))
            .collect()
    }

    /// `get`.
    pub(crate) fn get(&self, key: &str) -> Result<StagedValue> {
        self.get_batch(&[key.to_string()])
            .pop()
            .unwrap_or_else(|| Err(Error::internal("no result")))
    }

    /// Whole values into memory `alloc` gives once the sizes are known
    /// (see `mooncake_client::Client::get_batch_with`).
    pub(crate) fn get_batch_with<A>(&self, keys: &[String], alloc: A) -> Vec<Result<u64>>
    where
        A: FnOnce(&[Result<u64>]) -> Vec<Option<usize>>,
    {
        let fail = |e: Error| vec![Err(e); keys.len()];
        let mut h = self.handoff();
        let mut staged: Vec<Option<(usize, usize)>> = Vec::new();
        let mut why: Option<Error> = None;
        let r = self.call2::<Vec<Result<u64>>, Vec<Option<Buf>>, Vec<Result<u64>>, _>(
            &Call::GetValues {
                keys: keys.to_vec(),
            },
            |sizes| {
                let mut dsts = alloc(&sizes);
                dsts.resize(sizes.len(), None);
                sizes
                    .iter()
                    .zip(dsts)
                    .map(|(s, d)| {
                        let (Ok(n), Some(ptr)) = (s, d) else {
                            staged.push(None);
                            return None;
                        };
                        match h.stage(*n) {
                            Ok((buf, at)) => {
                                staged.push(Some((ptr, at)));
                                Some(buf)
                            }
                            Err(e) => {
                                why = Some(e);
                                staged.push(None);
                                None
                            }
                        }
                    })
                    .collect()
            },
        );
        let results = match r {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        results
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let n = r.map_err(|e| match (&why, e.code()) {
                    (Some(w), ErrorCode::InvalidParams) => w.clone(),
                    _ => e,
                })?;
                if let Some(Some((ptr, at))) = staged.get(i) {
                    // SAFETY: the destination `alloc` gave is writable for the
                    // value's size; `at` holds the `n` bytes the daemon wrote.
                    unsafe {
                        std::ptr::copy_nonoverlapping(*at as *const u8, *ptr as *mut u8, n as usize)
                    };
                    self.staged_bytes.fetch_add(n, Ordering::Relaxed);
                }
                Ok(n)
            })
            .collect()
    }

    /// Caller byte slices for the daemon, as sources.
    fn slices(h: &mut Handoff<'_>, values: &[&[u8]]) -> Result<Vec<Buf>> {
        values
            .iter()
            .map(|v| h.src(v.as_ptr() as usize, v.len() as u64))
            .collect()
    }

    /// `get_into_ranges`: each buffer must start in a registered buffer (in
    /// shared memory); it goes to the daemon as the rest of its region.
    ///
    /// # Safety
    /// The registered buffers must stay valid and writable for the call.
    pub(crate) unsafe fn get_into_ranges(
        &self,
        buffer_ptrs: &[usize],
        keys: &[Vec<String>],
        dst_offsets: &[Vec<Vec<u64>>],
        src_offsets: &[Vec<Vec<u64>>],
        sizes: &[Vec<Vec<u64>>],
    ) -> Ranges {
        let buffers: Result<Vec<Buf>> = buffer_ptrs
            .iter()
            .map(|&p| match shm::find(p, 0) {
                Some((r, off)) => {
                    self.ensure_mapped(&r)?;
                    Ok(Buf {
                        region: r.id,
                        offset: off,
                        len: r.size() - off,
                    })
                }
                None => Ok(Buf {
                    region: 0,
                    offset: u64::from(p != 0),
                    len: 0,
                }),
            })
            .collect();
        let call = buffers.map(|buffers| Call::GetRanges {
            buffers,
            keys: keys.to_vec(),
            dst_offsets: dst_offsets.to_vec(),
            src_offsets: src_offsets.to_vec(),
            sizes: sizes.to_vec(),
        });
        match call.and_then(|c| self.call::<Ranges>(&c)) {
            Ok(r) => r,
            Err(e) => mooncake_client::ranges_failed(dst_offsets, buffer_ptrs.len(), &e),
        }
    }

    /// Tensor writes (see `mooncake_client::Client::write_tensors`).
    ///
    /// # Safety
    /// For every item, its source bytes (the tensor's payload, or the whole
    /// object of a `_from` buffer) must be readable for the call.
    pub(crate) unsafe fn write_tensors(
        &self,
        items: Vec<Result<TensorWrite>>,
        cfg: &ReplicateConfig,
        mode: WriteMode,
    ) -> Result<Vec<Result<()>>> {
        let mut h = self.handoff();
        let mut wire_items = Vec::with_capacity(items.len());
        for it in items {
            let w = match it {
                Ok(w) => w,
                Err(e) => {
                    wire_items.push(Err(e));
                    continue;
                }
            };
            let payload = numel(&w.source.shape)
                .map_or(u64::MAX, |n| n.saturating_mul(w.source.dtype.itemsize()));
            let mut extent = w.source.payload_offset.saturating_add(payload);
            if let WriteRoute::Verbatim { size } = w.route {
                extent = extent.max(size);
            }
            wire_items.push(h.src(w.ptr, extent).map(|src| WireWrite {
                key: w.key,
                dtype: w.source.dtype.code(),
                shape: w.source.shape,
                payload_offset: w.source.payload_offset,
                src,
                route: WireRoute::from_route(&w.route),
            }));
        }
        self.call::<Result<Vec<Result<()>>>>(&Call::WriteTensors {
            items: wire_items,
            cfg: cfg.clone(),
            mode,
        })?
    }

    /// Tensor reads: the daemon plans them, `alloc` names a destination per
    /// planned output, then the daemon reads into them (see
    /// `mooncake_client::Client::read_tensors`).
    ///
    /// # Safety
    /// Every destination `alloc` returns must be writable for its size
    /// (a payload's `nbytes`, an `_into` buffer's `size`) for the call.
    pub(crate) unsafe fn read_tensors(
        &self,
        reqs: Vec<Result<ReadRequest>>,
        alloc: TensorAlloc<'_>,
    ) -> Vec<Result<ReadOutput>> {
        let n = reqs.len();
        let wire_reqs: Vec<Result<WireRead>> = reqs
            .iter()
            .map(|r| r.as_ref().map(WireRead::from_request).map_err(Clone::clone))
            .collect();
        let mut h = self.handoff();
        let mut why: Option<Error> = None;
        let r = self
            .call2::<Vec<Result<WireOutput>>, Vec<Option<WireDest>>, Vec<Result<WireOutput>>, _>(
                &Call::ReadTensors { reqs: wire_reqs },
                |outs| {
                    let outs: Vec<Result<ReadOutput>> = outs
                        .into_iter()
                        .map(|o| o.and_then(|o| o.to_output()))
                        .collect();
                    let dests = alloc(&outs);
                    dests
                        .into_iter()
                        .zip(&outs)
                        .map(|(d, o)| {
                            let placed = match (d, o) {
                                (Some(TensorDest::Payload(ptr)), Ok(o)) => {
                                    h.dst(ptr, o.nbytes, false).map(WireDest::Payload)
                                }
                                (Some(TensorDest::Into { ptr, size }), Ok(_)) => {
                                    h.dst(ptr, size, true).map(WireDest::Into)
                                }
                                _ => return None,
                            };
                            match placed {
                                Ok(d) => Some(d),
                                Err(e) => {
                                    why = Some(e);
                                    None
                                }
                            }
                        })
                        .collect()
                },
            );
        let outs = match r {
            Ok(v) => v,
            Err(e) => return vec![Err(e); n],
        };
        h.finish();
        outs.into_iter()
            .map(|o| {
                o.and_then(|o| o.to_output()).map_err(|e| match &why {
                    Some(w) if e.code() == ErrorCode::InvalidParams => w.clone(),
                    _ => e,
                })
            })
            .collect()
    }

    /// The daemon client's counters, with this dummy's own:
    /// `dummy_shared_bytes` (handed to the daemon in place) and
    /// `dummy_staged_bytes` (copied through staging memory).
    pub(crate) fn stats(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .call::<Vec<(String, u64)>>(&Call::Stats)
            .unwrap_or_default();
        v.push((
            "dummy_shared_bytes".into(),
            self.shared_bytes.load(Ordering::Relaxed),
        ));
        v.push((
            "dummy_staged_bytes".into(),
            self.staged_bytes.load(Ordering::Relaxed),
        ));
        v
    }
}

/// A dummy client is a store: a query is sent to the daemon as it is
/// (`queries`), a memory-moving call with its memory handed over
/// (`moves`); every other method is its inherent method of the same name,
/// one request to the daemon.
impl StoreApi for DummyClient {
    mooncake_client::store_queries!(dummy_queries);
    mooncake_client::store_moves!(dummy_moves);
    mooncake_client::store_calls!(store_forward_to_inherent);

    fn stats(&self) -> Vec<(String, u64)> {
        DummyClient::stats(self)
    }

    fn alloc_from_mem_pool(&self, size: u64) -> Result<u64> {
        Ok(DummyClient::alloc_from_mem_pool(self, size))
    }
}

/// `setup_dummy(mem_pool_size, local_buffer_size, server_address)`: a
/// dummy client attached to the daemon serving `server_address`'s port on
/// this host (see [`DummyClient::setup`]).
pub fn setup_dummy(
    mem_pool_size: u64,
    local_buffer_size: u64,
    server_address: &str,
) -> Result<Arc<dyn StoreApi>> {
    let dummy: Arc<dyn StoreApi> =
        DummyClient::setup(mem_pool_size, local_buffer_size, server_address)?;
    Ok(dummy)
}

impl Drop for DummyClient {
    fn drop(&mut self) {
        self.close();
    }
}

/// Connect to the daemon of `port` and run the handshake.
fn connect(port: u16, key: Option<&AuthKey>, timeout: Duration) -> io::Result<UnixStream> {
    let addr = SocketAddr::from_abstract_name(wire::socket_name(port).as_bytes())?;
    let mut c = UnixStream::connect_addr(&addr)?;
    c.set_read_timeout(Some(timeout))?;
    c.set_write_timeout(Some(timeout))?;
    client_handshake(&mut c, Service::Standalone, key)?;
    Ok(c)
}

/// Store methods that are one request to the daemon, generated from their
/// signature and the request they send:
/// - `one`: the reply is the result; a daemon that cannot be reached is the
///   method's error.
/// - `per_key`: one result per key of `$k`; a daemon that cannot be reached
///   fails every key.
/// - `handoff`: the caller's byte slices go to the daemon first (the
///   statements place them through handoff `$h`, binding the names the
///   request uses).
macro_rules! daemon_calls {
    (
        one { $($(#[$om:meta])* fn $on:ident(&self $(, $oa:ident: $ot:ty)*) -> $or:ty
            = $oc:expr;)* }
        per_key { $($(#[$pm:meta])* fn $pn:ident(&self, $pk:ident: &[String] $(, $pa:ident: $pt:ty)*)
            -> $pr:ty = $pc:expr;)* }
        handoff { $($(#[$hm:meta])* fn $hn:ident(&self $(, $ha:ident: $ht:ty)*)
            -> $hr:ty = |$h:ident| { $($body:tt)* } $hc:expr;)* }
    ) => {
        impl DummyClient {
            $($(#[$om])* pub(crate) fn $on(&self $(, $oa: $ot)*) -> $or {
                self.call::<$or>(&$oc)?
            })*
            $($(#[$pm])* pub(crate) fn $pn(&self, $pk: &[String] $(, $pa: $pt)*) -> $pr {
                self.call::<$pr>(&$pc).unwrap_or_else(|e| vec![Err(e); $pk.len()])
            })*
            $($(#[$hm])* pub(crate) fn $hn(&self $(, $ha: $ht)*) -> $hr {
                let mut $h = self.handoff();
                $($body)*
                let r = self.call::<$hr>(&$hc)?;
                $h.finish();
                r
            })*
        }
    };
}

daemon_calls! {
    one {
        /// `batch_put_session_start`.
        fn batch_put_session_start(&self, keys: &[String], sizes: &[u64], cfg: &ReplicateConfig)
            -> Result<Vec<Result<()>>>
            = Call::PutSessionStart { keys: keys.to_vec(), sizes: sizes.to_vec(), cfg: cfg.clone() };
        /// `batch_get_session_end`.
        fn batch_get_session_end(&self, keys: &[String]) -> Result<()>
            = Call::GetSessionEnd { keys: keys.to_vec() };
    }
    per_key {
        /// `batch_put_session_end`.
        fn batch_put_session_end(&self, keys: &[String]) -> Vec<Result<()>>
            = Call::PutSessionEnd { keys: keys.to_vec(), revoke: false };
        /// `batch_put_session_revoke`.
        fn batch_put_session_revoke(&self, keys: &[String]) -> Vec<Result<()>>
            = Call::PutSessionEnd { keys: keys.to_vec(), revoke: true };
        /// `batch_get_session_start`.
        fn batch_get_session_start(&self, keys: &[String]) -> Vec<Result<()>>
            = Call::GetSessionStart { keys: keys.to_vec() };
    }
    handoff {
        /// `put`/`upsert`.
        fn put(&self, key: &str, value: &[u8], cfg: &ReplicateConfig, upsert: bool) -> Result<()>
            = |h| { let src = h.src(value.as_ptr() as usize, value.len() as u64)?; }
            Call::Put { key: key.to_string(), src, cfg: cfg.clone(), upsert };
        /// `put_parts`/`upsert_parts`: the bytes stored.
        fn put_parts(&self, key: &str, parts: &[&[u8]], cfg: &ReplicateConfig, upsert: bool)
            -> Result<u64>
            = |h| { let parts = Self::slices(&mut h, parts)?; }
            Call::PutParts { key: key.to_string(), parts, cfg: cfg.clone(), upsert };
        /// `put_batch`/`upsert_batch`.
        fn put_batch(&self, keys: &[String], values: &[&[u8]], cfg: &ReplicateConfig,
            upsert: bool) -> Result<()>
            = |h| { let values = Self::slices(&mut h, values)?; }
            Call::PutBatch { keys: keys.to_vec(), values, cfg: cfg.clone(), upsert };
    }
}
