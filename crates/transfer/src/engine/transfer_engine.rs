//! [`TransferEngine`]: one engine of a process. It owns the registered
//! memory, serves peers on its RPC port (and its Unix socket for engines of
//! this host), and moves the bytes of transfers it initiates:
//!
//! - to an engine of this host, by one request on its Unix socket, after
//!   which the target copies between its registered memory and ours with
//!   `process_vm_readv`/`process_vm_writev` (no socket carries the bytes);
//!   when the kernel refuses those calls (`EPERM`: a ptrace policy), this
//!   and every later transfer of the process uses TCP, said once in the log;
//! - to any other engine, over TCP to its RPC port, one request per batch
//!   and connection, large batches split over parallel connections.
//!
//! `MC_FORCE_TCP`, set to anything (even empty, as upstream reads it),
//! turns the same-host path off. `MC_TRANSFER_TIMEOUT` (seconds, default
//! 30) bounds every wait on a peer.
//!
//! Every method takes `&self` and may be called from many threads at once.

use crate::engine::batches::{BatchState, Batches};
use crate::engine::error::{EngineError, ErrorKind, Result};
use crate::engine::log::{emit, Level};
use crate::engine::metadata::{Metadata, P2PHANDSHAKE};
use crate::engine::peers::{refused, Pool, SharedOutcome};
use crate::engine::registry::{is_mapped, Registry};
use crate::engine::server::{bind_unix, vm_status, Server, Shared};
use crate::engine::wire::{self, Descriptor, Request};
use crate::net::streams::{local_tcp_streams, tcp_parts, tcp_streams};
use crate::op::Op;
use crate::same_host::process_vm::{self as vm, Direction};
use mooncake_common::AuthKey;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Which way a transfer moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// From the target into local memory.
    Read,
    /// From local memory into the target.
    Write,
}

/// One entry of a transfer: `(local address, target address, length)`.
pub type Item = (u64, u64, u64);

/// Bytes below which a TCP transfer is never split.
const SPLIT_MIN: u64 = 512 << 10;

/// Whether the kernel refused a cross-process copy in this process (a
/// ptrace policy applies to the whole process).
static VM_DENIED: AtomicBool = AtomicBool::new(false);

/// Bytes from which a same-host transfer is shared: the target copies the
/// first half while this process copies the second (two cores instead of
/// one, for one more message each way).
const SHARE_MIN: u64 = 512 << 10;

/// Whether the kernel refused this process's own part of a shared copy
/// (a ptrace policy may allow one direction only); the target then copies
/// alone.
static HELP_DENIED: AtomicBool = AtomicBool::new(false);

/// How a same-host copy request ended.
enum Local {
    /// Every byte moved.
    Done,
    /// The kernel refused the cross-process copy: use TCP from now on.
    Denied,
    /// A target range is device memory: send this request over the
    /// socket path, where the target stages it.
    Device,
}

/// How a peer is reached.
#[derive(Debug)]
struct PeerRoute {
    /// `host:port` of its RPC port.
    endpoint: String,
    /// Its Unix socket, when it runs on this host and the path is allowed.
    unix: Option<String>,
}

/// An initialized engine.
struct Running {
    name: String,
    rpc_port: u16,
    metadata: Metadata,
    server: Server,
    shared: Arc<Shared>,
    key: Option<AuthKey>,
    host_id: String,
    same_host: bool,
    timeout: Duration,
    routes: Mutex<HashMap<String, Arc<PeerRoute>>>,
    pool: Pool,
}

/// A transfer engine (see the module documentation).
#[derive(Default)]
pub struct TransferEngine {
    registry: Arc<Registry>,
    running: RwLock<Option<Arc<Running>>>,
    init: Mutex<()>,
    batches: Batches,
    /// Managed buffers: address -> mapped length.
    managed: Mutex<HashMap<u64, u64>>,
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some()
}

/// `MC_TRANSFER_TIMEOUT` in seconds (default 30, at least 1).
fn transfer_timeout() -> Duration {
    let s = std::env::var("MC_TRANSFER_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(30)
        .max(1);
    Duration::from_secs(s)
}

/// `local_hostname` as host and optional port: `host`, `host:port`,
/// `[v6]:port`, a bare IPv6 address, or Ascend's `host:port:npu_N`.
pub fn split_hostname(s: &str) -> Result<(String, Option<u16>)> {
    let bad = |why: &str| {
        EngineError::new(
            ErrorKind::InvalidArgument,
            format!("local_hostname {s:?}: {why}"),
        )
    };
    let port = |p: &str| p.parse::<u16>().map_err(|_| bad("invalid port"));
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
        match after.strip_prefix(':') {
            Some(p) => (h.to_string(), Some(port(p)?)),
            None if after.is_empty() => (h.to_string(), None),
            None => return Err(bad("junk after ']'")),
        }
    } else {
        let parts: Vec<&str> = s.split(':').collect();
        match parts.as_slice() {
            [h] => (h.to_string(), None),
            [h, p] => (h.to_string(), Some(port(p)?)),
            [h, p, npu] if npu.starts_with("npu_") => (h.to_string(), Some(port(p)?)),
            _ => (s.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    Ok((host, port))
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn not_initialized() -> EngineError {
    EngineError::new(
        ErrorKind::NotInitialized,
        "the engine is not initialized: call initialize() first",
    )
}

impl TransferEngine {
    /// A new engine with its own registry (not yet initialized).
    pub fn new() -> TransferEngine {
        TransferEngine::default()
    }

    /// The registered memory (shared with a store set up on this engine).
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    fn running(&self) -> Result<Arc<Running>> {
        self.running.read().clone().ok_or_else(not_initialized)
    }

    /// Whether `initialize` succeeded.
    pub fn is_initialized(&self) -> bool {
        self.running.read().is_some()
    }

    /// This engine's segment name (`host:rpc_port` under `P2PHANDSHAKE`).
    pub fn name(&self) -> Result<String> {
        Ok(self.running()?.name.clone())
    }

    /// The port the RPC server listens on.
    pub fn rpc_port(&self) -> Result<u16> {
        Ok(self.running()?.rpc_port)
    }

    /// Start the engine: bind the RPC port (and the Unix socket), publish
    /// the descriptor to the metadata server `conn` (a connection string as
    /// [`crate::engine::metadata::build_conn_string`] makes it). `protocol` other
    /// than `tcp` runs over this build's transports, logged once.
    pub fn initialize(
        &self,
        local_hostname: &str,
        conn: &str,
        protocol: &str,
        _device_name: &str,
    ) -> Result<()> {
        let _g = self.init.lock();
        if self.is_initialized() {
            return Err(EngineError::new(
                ErrorKind::AlreadyInitialized,
                "the engine is already initialized; create another TransferEngine for another endpoint",
            ));
        }
        let (host, port) = split_hostname(local_hostname)?;
        let key = AuthKey::from_env().map_err(|e| {
            EngineError::new(
                ErrorKind::InvalidArgument,
                format!("cannot load the cluster token: {e}"),
            )
        })?;
        let metadata = Metadata::open(conn, key.clone())?;
        let force_tcp = env_set("MC_FORCE_TCP");
        static PROTOCOL_NOTED: AtomicBool = AtomicBool::new(false);
        let choice = crate::engine::protocol::choose(
            "transfer engine",
            protocol,
            force_tcp,
            &crate::engine::protocol::rdma_devices(),
        );
        if let crate::engine::protocol::Choice::Fallback { warning, .. } = choice {
            if !PROTOCOL_NOTED.swap(true, Ordering::Relaxed) {
                emit(Level::Warning, &warning);
            }
        } else if force_tcp {
            emit(
                Level::Info,
                "transfer engine: MC_FORCE_TCP is set, using TCP only",
            );
        }
        let bind_host = std::env::var("MC_TCP_BIND_ADDRESS")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| {
                if host.parse::<std::net::Ipv6Addr>().is_ok() {
                    "::".into()
                } else {
                    "0.0.0.0".into()
                }
            });
        // Upstream binds a random free port unless legacy binding asks for
        // the one in `local_hostname`.
        let want = if env_set("MC_LEGACY_RPC_PORT_BINDING") {
            port.unwrap_or(0)
        } else {
            0
        };
        let listener = TcpListener::bind((bind_host.as_str(), want)).map_err(|e| {
            let kind = if e.kind() == io::ErrorKind::AddrInUse {
                ErrorKind::AddressInUse
            } else {
                ErrorKind::InvalidArgument
            };
            EngineError::new(kind, format!("cannot bind the RPC port {bind_host}:{want}"))
                .with_source(e)
        })?;
        mooncake_common::tcp_tune::tune_data_listener(&listener);
        let rpc_port = listener
            .local_addr()
            .map_err(|e| EngineError::new(ErrorKind::Internal, "RPC port").with_source(e))?
            .port();
        let name = if conn == P2PHANDSHAKE || metadata.is_p2p() {
            join_host_port(&host, rpc_port)
        } else {
            local_hostname.to_string()
        };
        let unix = if force_tcp {
            None
        } else {
            let un = format!("mooncake-engine-{}", uuid::Uuid::new_v4().simple());
            match bind_unix(&un) {
                Ok(l) => Some((l, un)),
                Err(e) => {
                    emit(
                        Level::Info,
                        &format!("transfer engine: no same-host socket ({e}); peers of this host use TCP"),
                    );
                    None
                }
            }
        };
        let host_id = crate::hostid::host_id();
        let desc = Descriptor {
            name: name.clone(),
            rpc_host: if bind_host == "0.0.0.0" || bind_host == "::" {
                host.clone()
            } else {
                bind_host.clone()
            },
            rpc_port,
            host_id: host_id.clone(),
            unix_name: unix.as_ref().map(|u| u.1.clone()).unwrap_or_default(),
            pid: std::process::id(),
            buffers: Vec::new(),
        };
        let shared = Arc::new(Shared {
            registry: Arc::clone(&self.registry),
            key: key.clone(),
            notifies: Mutex::new(Vec::new()),
            desc: desc.clone(),
        });
        let server = Server::start(listener, unix, Arc::clone(&shared)).map_err(|e| {
            EngineError::new(ErrorKind::Internal, "cannot start the RPC server").with_source(e)
        })?;
        metadata.publish(&desc)?;
        *self.running.write() = Some(Arc::new(Running {
            name,
            rpc_port,
            metadata,
            server,
            shared,
            key,
            host_id,
            same_host: !force_tcp,
            timeout: transfer_timeout(),
            routes: Mutex::new(HashMap::new()),
            pool: Pool::default(),
        }));
        Ok(())
    }

    /// Stop serving and withdraw the descriptor (idempotent).
    pub fn shutdown(&self) {
        let run = self.running.write().take();
        if let Some(r) = run {
            r.metadata.remove(&r.name);
            r.server.stop();
        }
    }

    /// Register `[addr, addr+len)` so that peers may read and write it and
    /// local buffers of transfers may lie in it. Refuses zero bytes, memory
    /// that is not mapped in this process and overlapping regions. CUDA
    /// device memory (told apart through the driver) is registered as
    /// device memory, at `cuda:<ordinal>` unless `location` names a CUDA
    /// device; without a driver, a `cuda` location is refused with the
    /// error that says no CUDA driver was found.
    ///
    /// # Safety
    /// The region must stay valid, readable and writable memory of this
    /// process until it is unregistered: peers write into it at any time.
    pub unsafe fn register_memory(&self, addr: u64, len: u64, location: &str) -> Result<()> {
        let ordinal = if len > 0 {
            crate::engine::device::classify(addr)
        } else {
            None
        };
        if let Some(ord) = ordinal {
            let loc = if location.starts_with("cuda") {
                location.to_string()
            } else {
                format!("cuda:{ord}")
            };
            return self.registry.register_memory_of(addr, len, &loc, true);
        }
        if len > 0 && location.starts_with("cuda") {
            crate::engine::device::current()?;
        }
        if len > 0 && !is_mapped(addr, len) {
            return Err(EngineError::new(
                ErrorKind::NotMapped,
                format!("[{addr:#x}, +{len}) is not mapped memory of this process"),
            ));
        }
        self.registry.register(addr, len, location)
    }

    /// Unregister the region starting at `addr`.
    pub fn unregister_memory(&self, addr: u64) -> Result<()> {
        if self.managed.lock().contains_key(&addr) {
            return Err(EngineError::new(
                ErrorKind::InvalidArgument,
                format!("{addr:#x} is a managed buffer: release it with free_managed_buffer"),
            ));
        }
        self.registry.unregister(addr).map(|_| ())
    }

    /// Move `items` between local memory and `target`, then deliver
    /// `notify` to it. Returns when every byte has moved (or the first
    /// failure). Items of length 0 are skipped; an empty batch succeeds.
    pub fn transfer(
        &self,
        target: &str,
        op: Opcode,
        items: &[Item],
        notify: Option<(String, String)>,
    ) -> Result<()> {
        let run = self.running()?;
        check_items(items)?;
        let nonempty: Vec<Item>;
        let items = if items.iter().any(|i| i.2 == 0) {
            nonempty = items.iter().copied().filter(|i| i.2 > 0).collect();
            &nonempty[..]
        } else {
            items
        };
        if items.is_empty() && notify.is_none() {
            return Ok(());
        }
        let _pin = self.registry.pin(
            items.iter().map(|i| (i.0, i.2)),
            ErrorKind::LocalNotRegistered,
            "local buffer",
        )?;
        let route = self.route(&run, target)?;
        let r = if self.registry.any_device(items.iter().map(|i| (i.0, i.2))) {
            self.move_mixed(&run, target, &route, op, items)
        } else {
            self.move_items(&run, target, &route, op, items)
        };
        if let Err(e) = &r {
            if matches!(e.kind(), ErrorKind::Unreachable | ErrorKind::Timeout) {
                run.routes.lock().remove(target);
            }
        }
        r?;
        if let Some((name, msg)) = notify {
            self.notify(&run, target, &route, name, msg)?;
        }
        Ok(())
    }

    /// [`TransferEngine::transfer`] in the background; returns a batch id.
    pub fn submit(
        self: &Arc<Self>,
        target: &str,
        op: Opcode,
        items: Vec<Item>,
        notify: Option<(String, String)>,
    ) -> Result<u64> {
        let run = self.running()?;
        check_items(&items)?;
        // What fails at once fails here, as upstream's submission does: the
        // local buffers, and a target that cannot be resolved.
        drop(self.registry.pin(
            items.iter().filter(|i| i.2 > 0).map(|i| (i.0, i.2)),
            ErrorKind::LocalNotRegistered,
            "local buffer",
        )?);
        self.route(&run, target)?;
        let me = Arc::clone(self);
        let target = target.to_string();
        self.batches
            .submit(move || me.transfer(&target, op, &items, notify))
    }

    /// The state of batch `id` (a final state forgets it; a failure comes
    /// with its error).
    pub fn batch_state(&self, id: u64) -> Result<(BatchState, Option<EngineError>)> {
        let timeout = self.running()?.timeout;
        self.batches.check(id, timeout)
    }

    /// Wait for the batches `ids`; the first failure among them.
    pub fn wait_batches(&self, ids: &[u64]) -> Result<()> {
        self.running()?;
        self.batches.wait(ids)
    }

    /// The notifications received since the last call, oldest first.
    pub fn take_notifies(&self) -> Result<Vec<(String, String)>> {
        Ok(std::mem::take(&mut *self.running()?.shared.notifies.lock()))
    }

    /// Ask `peer` whether it is alive.
    pub fn probe(&self, peer: &str) -> Result<()> {
        let run = self.running()?;
        let endpoint = self.endpoint_of(&run, peer)?;
        let mut c = run
            .pool
            .tcp(&endpoint, run.key.as_ref(), run.timeout)
            .map_err(|e| connect_error(peer, e))?;
        match c.call(&Request::Probe) {
            Ok(_) => {
                run.pool.give(&endpoint, run.key.as_ref(), c);
                Ok(())
            }
            Err(e) => {
                run.pool.forget(&endpoint);
                Err(EngineError::io(peer, "probe failed", e))
            }
        }
    }

    /// The first registered buffer of `segment` (this engine's own name,
    /// or a peer's); 0 when it has none.
    pub fn first_buffer_address(&self, segment: &str) -> Result<u64> {
        Ok(self.segment_buffers(segment)?.first().map_or(0, |b| b.0))
    }

    /// The registered regions `(address, length)` of `segment` (this
    /// engine's own name, or a peer's), in registration order.
    pub fn segment_buffers(&self, segment: &str) -> Result<Vec<(u64, u64)>> {
        let run = self.running()?;
        if segment == run.name {
            return Ok(self
                .registry
                .regions()
                .into_iter()
                .map(|(addr, len, _)| (addr, len))
                .collect());
        }
        let endpoint = self.endpoint_of(&run, segment)?;
        let mut c = run
            .pool
            .tcp(&endpoint, run.key.as_ref(), run.timeout)
            .map_err(|e| connect_error(segment, e))?;
        let d = c
            .describe()
            .map_err(|e| EngineError::io(segment, "describe failed", e))?;
        run.pool.give(&endpoint, run.key.as_ref(), c);
        Ok(d.buffers)
    }

    /// Map and register a buffer of `len` bytes owned by the engine.
    pub fn allocate_managed(&self, len: u64) -> Result<u64> {
        if len == 0 {
            return Err(EngineError::new(
                ErrorKind::ZeroLength,
                "cannot allocate a zero-length buffer",
            ));
        }
        let size = usize::try_from(len).map_err(|_| {
            EngineError::new(
                ErrorKind::InvalidArgument,
                format!("{len} bytes is too large"),
            )
        })?;
        // SAFETY: an anonymous private mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(EngineError::new(
                ErrorKind::Internal,
                format!("cannot map a buffer of {len} bytes"),
            )
            .with_source(io::Error::last_os_error()));
        }
        let addr = p as u64;
        if let Err(e) = self.registry.register(addr, len, "cpu:0") {
            // SAFETY: the mapping made above, unused by anyone.
            unsafe { libc::munmap(p, size) };
            return Err(e);
        }
        self.managed.lock().insert(addr, len);
        Ok(addr)
    }

    /// Unregister and unmap a managed buffer (`len` as allocated).
    pub fn free_managed(&self, addr: u64, len: u64) -> Result<()> {
        let mut m = self.managed.lock();
        match m.get(&addr) {
            None => {
                return Err(EngineError::new(
                    ErrorKind::NotRegistered,
                    format!("{addr:#x} is not a managed buffer of this engine"),
                ))
            }
            Some(&l) if l != len => {
                return Err(EngineError::new(
                    ErrorKind::InvalidArgument,
                    format!("managed buffer {addr:#x} has {l} bytes, not {len}"),
                ))
            }
            Some(_) => {}
        }
        self.registry.unregister(addr)?;
        m.remove(&addr);
        // SAFETY: a mapping this engine made, now unregistered (no transfer
        // uses it: unregister refuses pinned regions).
        unsafe { libc::munmap(addr as usize as *mut libc::c_void, len as usize) };
        Ok(())
    }

    /// Copy `bytes` to `dest`, which must lie in registered memory.
    pub fn write_bytes(&self, dest: u64, bytes: &[u8]) -> Result<()> {
        let _pin = self.registry.pin(
            std::iter::once((dest, bytes.len() as u64)),
            ErrorKind::LocalNotRegistered,
            "destination",
        )?;
        if self.registry.is_device(dest) {
            // SAFETY: the range lies in registered device memory, pinned
            // meanwhile; the source is `bytes`.
            return unsafe {
                crate::engine::device::current()?.copy(
                    dest,
                    bytes.as_ptr() as u64,
                    bytes.len() as u64,
                )
            };
        }
        // SAFETY: the range lies in registered memory, which the registrant
        // keeps valid and writable; it is pinned meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), dest as usize as *mut u8, bytes.len())
        };
        Ok(())
    }

    /// Copy `len` bytes from `src`, which must lie in registered memory.
    pub fn read_bytes(&self, src: u64, len: u64) -> Result<Vec<u8>> {
        let _pin = self.registry.pin(
            std::iter::once((src, len)),
            ErrorKind::LocalNotRegistered,
            "source",
        )?;
        let n = usize::try_from(len)
            .map_err(|_| EngineError::new(ErrorKind::InvalidArgument, "length too large"))?;
        let mut v = vec![0u8; n];
        if self.registry.is_device(src) {
            // SAFETY: the range lies in registered device memory, pinned
            // meanwhile; `v` holds `len` writable bytes.
            unsafe { crate::engine::device::current()?.copy(v.as_mut_ptr() as u64, src, len)? };
            return Ok(v);
        }
        // SAFETY: the range lies in registered (valid, readable) memory,
        // pinned meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(src as usize as *const u8, v.as_mut_ptr(), n) };
        Ok(v)
    }

    /// A transfer ordered on a CUDA stream (`*_on_cuda`): the work queued
    /// on `stream` before the call finishes first, then the transfer runs
    /// and the call returns when it is done (so work queued afterwards sees
    /// its bytes). Needs the CUDA driver; without one, the error that says
    /// no CUDA driver was found.
    pub fn transfer_on_cuda(
        &self,
        target: &str,
        op: Opcode,
        items: &[Item],
        stream: u64,
    ) -> Result<()> {
        self.running()?;
        check_items(items)?;
        let dev = crate::engine::device::current()?;
        let near = items
            .iter()
            .map(|i| i.0)
            .find(|&a| dev.ops().device_of(a).is_some());
        dev.ops()
            .synchronize_stream(stream, near)
            .map_err(|e| e.with_peer(target))?;
        self.transfer(target, op, items, None)
    }

    /// The local topology as upstream prints it ([`crate::engine::topology`]);
    /// `device_name` lists the devices a caller wants, comma-separated
    /// (upstream's filter; empty: all).
    pub fn topology(&self, device_name: &str) -> String {
        crate::engine::topology::to_styled_json(&crate::engine::topology::local(device_name))
    }

    /// The RPC endpoint of `peer`.
    fn endpoint_of(&self, run: &Running, peer: &str) -> Result<String> {
        if let Some(r) = run.routes.lock().get(peer) {
            return Ok(r.endpoint.clone());
        }
        if run.metadata.is_p2p() {
            check_p2p_name(peer)?;
            Ok(peer.to_string())
        } else {
            Ok(run.metadata.lookup(peer)?.endpoint())
        }
    }

    /// How to reach `target` (cached).
    fn route(&self, run: &Running, target: &str) -> Result<Arc<PeerRoute>> {
        if let Some(r) = run.routes.lock().get(target) {
            return Ok(Arc::clone(r));
        }
        let desc = if run.metadata.is_p2p() {
            check_p2p_name(target)?;
            if run.same_host && !VM_DENIED.load(Ordering::Relaxed) {
                let mut c = run
                    .pool
                    .tcp(target, run.key.as_ref(), run.timeout)
                    .map_err(|e| connect_error(target, e))?;
                let d = c
                    .describe()
                    .map_err(|e| EngineError::io(target, "describe failed", e))?;
                run.pool.give(target, run.key.as_ref(), c);
                Some(d)
            } else {
                None
            }
        } else {
            Some(run.metadata.lookup(target)?)
        };
        let route = Arc::new(PeerRoute {
            endpoint: desc
                .as_ref()
                .filter(|_| !run.metadata.is_p2p())
                .map_or_else(|| target.to_string(), Descriptor::endpoint),
            unix: desc
                .filter(|d| run.same_host && d.host_id == run.host_id && !d.unix_name.is_empty())
                .map(|d| d.unix_name),
        });
        run.routes
            .lock()
            .insert(target.to_string(), Arc::clone(&route));
        Ok(route)
    }

    /// Move items some of whose local buffers are device memory: the host
    /// ones as usual, then each device one ([`Self::move_device`]).
    fn move_mixed(
        &self,
        run: &Running,
        target: &str,
        route: &PeerRoute,
        op: Opcode,
        items: &[Item],
    ) -> Result<()> {
        let (dev, host): (Vec<Item>, Vec<Item>) =
            items.iter().partition(|i| self.registry.is_device(i.0));
        self.move_items(run, target, route, op, &host)?;
        dev.iter()
            .try_for_each(|&it| self.move_device(run, target, route, op, it))
    }

    /// Move one item whose local buffer is device memory. To a process of
    /// this host: the target maps the buffer's CUDA IPC handle and copies
    /// itself; where the driver refuses (logged once), and to other hosts,
    /// the buffer is staged through pinned host memory, the device copy of
    /// one chunk overlapping the move of the previous one.
    fn move_device(
        &self,
        run: &Running,
        target: &str,
        route: &PeerRoute,
        op: Opcode,
        (local, remote, len): Item,
    ) -> Result<()> {
        let dev = crate::engine::device::current()?;
        if let Some(unix) = route.unix.as_deref() {
            if !crate::engine::device::ipc_denied()
                && self.move_ipc(run, target, unix, op, (local, remote, len))?
            {
                return Ok(());
            }
        }
        match op {
            Opcode::Write => {
                let mut sink = |off: u64, b: &[u8]| {
                    let it = (b.as_ptr() as u64, remote + off, b.len() as u64);
                    self.move_items(run, target, route, op, &[it])
                };
                // SAFETY: the local range lies in registered device memory,
                // pinned by the caller.
                unsafe { dev.stage_out(local, len, &mut sink) }
            }
            Opcode::Read => {
                let mut source = |off: u64, b: &mut [u8]| {
                    let it = (b.as_mut_ptr() as u64, remote + off, b.len() as u64);
                    self.move_items(run, target, route, op, &[it])
                };
                // SAFETY: the local range lies in registered device memory,
                // pinned by the caller.
                unsafe { dev.stage_in(local, len, &mut source) }
            }
        }
    }

    /// One CUDA IPC copy by a target of this host; `Ok(false)` when the
    /// target cannot map the handle (or this driver cannot export it):
    /// then IPC is off from now on, logged once.
    fn move_ipc(
        &self,
        run: &Running,
        target: &str,
        unix: &str,
        op: Opcode,
        (local, remote, len): Item,
    ) -> Result<bool> {
        let dev = crate::engine::device::current()?;
        let x = match dev.ops().ipc_export(local) {
            Ok(x) => x,
            Err(e) => {
                crate::engine::device::deny_ipc(&e.to_string());
                return Ok(false);
            }
        };
        let pairs = vec![(x.offset, remote, len)];
        let req = match op {
            Opcode::Write => Request::IpcWrite {
                handle: x.handle,
                pairs,
            },
            Opcode::Read => Request::IpcRead {
                handle: x.handle,
                pairs,
            },
        };
        let mut c = run
            .pool
            .unix(unix, run.key.as_ref(), run.timeout)
            .map_err(|e| connect_error(target, e))?;
        let st = match c.call(&req) {
            Ok(st) => st,
            Err(e) => {
                run.pool.forget(unix);
                return Err(EngineError::io(
                    target,
                    "same-host device transfer failed",
                    e,
                ));
            }
        };
        run.pool.give(unix, run.key.as_ref(), c);
        match st {
            wire::STATUS_OK => Ok(true),
            wire::STATUS_IPC_REFUSED => {
                crate::engine::device::deny_ipc(&format!(
                    "{target} cannot map this process's CUDA IPC handles"
                ));
                Ok(false)
            }
            st => Err(status_error(target, st)),
        }
    }

    fn move_items(
        &self,
        run: &Running,
        target: &str,
        route: &PeerRoute,
        op: Opcode,
        items: &[Item],
    ) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        if let Some(unix) = route.unix.as_deref() {
            if !VM_DENIED.load(Ordering::Relaxed) {
                match self.move_local(run, target, unix, op, items)? {
                    Local::Done => return Ok(()),
                    Local::Device => return self.move_tcp(run, target, &route.endpoint, op, items),
                    Local::Denied => {
                        if !VM_DENIED.swap(true, Ordering::Relaxed) {
                            emit(
                                Level::Warning,
                                "transfer engine: the kernel refused cross-process copies \
                                 (process_vm_readv/writev: EPERM, a ptrace policy); \
                                 transfers between processes of this host use TCP from now on",
                            );
                        }
                    }
                }
            }
        }
        self.move_tcp(run, target, &route.endpoint, op, items)
    }

    /// One request on the target's Unix socket; [`Local::Denied`] when the
    /// kernel refused the copy (use TCP), [`Local::Device`] when a target
    /// range is device memory (use the socket path, where the target
    /// stages it).
    fn move_local(
        &self,
        run: &Running,
        target: &str,
        unix: &str,
        op: Opcode,
        items: &[Item],
    ) -> Result<Local> {
        let mut c = run
            .pool
            .unix(unix, run.key.as_ref(), run.timeout)
            .map_err(|e| connect_error(target, e))?;
        let total: u64 = items.iter().map(|i| i.2).sum();
        let helper = (total >= SHARE_MIN && !HELP_DENIED.load(Ordering::Relaxed))
            .then(|| c.target_pid())
            .flatten();
        if let Some(pid) = helper {
            return self.move_shared(run, target, unix, c, pid, op, items, total);
        }
        let pairs = items.to_vec();
        let req = match op {
            Opcode::Write => Request::VmWrite { pairs },
            Opcode::Read => Request::VmRead { pairs },
        };
        let st = match c.call(&req) {
            Ok(st) => st,
            Err(e) => {
                run.pool.forget(unix);
                return Err(EngineError::io(target, "same-host transfer failed", e));
            }
        };
        run.pool.give(unix, run.key.as_ref(), c);
        match st {
            wire::STATUS_OK => Ok(Local::Done),
            wire::STATUS_VM_DENIED => Ok(Local::Denied),
            wire::STATUS_DEVICE => Ok(Local::Device),
            st => Err(status_error(target, st)),
        }
    }

    /// A shared same-host copy (see `wire`): the target copies the first
    /// half of the bytes, this process the second; as
    /// [`Self::move_local`].
    #[allow(clippy::too_many_arguments)]
    fn move_shared(
        &self,
        run: &Running,
        target: &str,
        unix: &str,
        mut c: crate::engine::peers::Conn,
        pid: i32,
        op: Opcode,
        items: &[Item],
        total: u64,
    ) -> Result<Local> {
        // Page-aligned, so that each process pins pages of its own.
        let split = (total / 2) & !4095;
        let pairs = items.to_vec();
        let (_, rest) = vm::split_at(&pairs, split);
        // This process's copy: (target address, own address, length).
        let mine: Vec<(u64, u64, u64)> = rest.iter().map(|&(l, r, n)| (r, l, n)).collect();
        let (req, dir) = match op {
            Opcode::Write => (Request::VmWriteShared { pairs, split }, Direction::ToPeer),
            Opcode::Read => (Request::VmReadShared { pairs, split }, Direction::FromPeer),
        };
        let label = format!("{target} (process {pid})");
        let outcome = c.call_shared(&req, || {
            // SAFETY: every local range lies in registered memory (pinned
            // by the caller) that the caller does not use meanwhile; the
            // target's ranges were checked and are pinned by the target
            // until this part's status is sent.
            vm_status(unsafe { vm::copy_serial(pid, dir, &mine) }, &label)
        });
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                run.pool.forget(unix);
                return Err(EngineError::io(target, "same-host transfer failed", e));
            }
        };
        run.pool.give(unix, run.key.as_ref(), c);
        let own = match outcome {
            SharedOutcome::Refused(wire::STATUS_VM_DENIED)
            | SharedOutcome::Done {
                target: wire::STATUS_VM_DENIED,
                ..
            } => return Ok(Local::Denied),
            SharedOutcome::Refused(wire::STATUS_DEVICE) => return Ok(Local::Device),
            SharedOutcome::Refused(st) => return Err(status_error(target, st)),
            SharedOutcome::Done { target: st, .. } if st != wire::STATUS_OK => {
                return Err(status_error(target, st))
            }
            SharedOutcome::Done { own, .. } => own,
        };
        match own {
            wire::STATUS_OK => Ok(Local::Done),
            wire::STATUS_VM_DENIED => {
                if !HELP_DENIED.swap(true, Ordering::Relaxed) {
                    emit(
                        Level::Warning,
                        "transfer engine: the kernel refused this process's part of a \
                         shared same-host copy (EPERM); targets copy alone from now on",
                    );
                }
                self.move_local(run, target, unix, op, &rest)
            }
            st => Err(status_error(target, st)),
        }
    }

    fn move_tcp(
        &self,
        run: &Running,
        target: &str,
        endpoint: &str,
        op: Opcode,
        items: &[Item],
    ) -> Result<()> {
        let total: u64 = items.iter().map(|i| i.2).sum();
        let parts_n = if total < SPLIT_MIN {
            1
        } else {
            let path = run.pool.path(endpoint);
            let streams = if path.loopback {
                local_tcp_streams()
            } else {
                tcp_streams()
            };
            tcp_parts(total, path.paced, streams)
        };
        let one = |part: &[Item]| -> Result<()> {
            let mut c = run
                .pool
                .tcp(endpoint, run.key.as_ref(), run.timeout)
                .map_err(|e| connect_error(target, e))?;
            // SAFETY: every local range lies in registered memory (pinned by
            // the caller), which the registrant keeps valid.
            let r = unsafe {
                match op {
                    Opcode::Write => c.write(part),
                    Opcode::Read => c.read(part),
                }
            };
            match r {
                Ok(0) => {
                    run.pool.give(endpoint, run.key.as_ref(), c);
                    Ok(())
                }
                Ok(st) => {
                    run.pool.give(endpoint, run.key.as_ref(), c);
                    Err(status_error(target, st))
                }
                Err(e) => {
                    run.pool.forget(endpoint);
                    Err(EngineError::io(target, "TCP transfer failed", e))
                }
            }
        };
        if parts_n <= 1 {
            return one(items);
        }
        let ops: Vec<Op> = items
            .iter()
            .map(|&(l, r, n)| Op {
                seg_offset: r,
                local_ptr: l as usize,
                len: n,
            })
            .collect();
        let parts: Vec<Vec<Item>> = Op::split(&ops, parts_n as usize, u64::MAX)
            .into_iter()
            .map(|p| {
                p.into_iter()
                    .map(|o| (o.local_ptr as u64, o.seg_offset, o.len))
                    .collect()
            })
            .collect();
        let workers = parts.len();
        crate::workers::run_all(&parts, workers, |p| one(p))
            .into_iter()
            .collect()
    }

    fn notify(
        &self,
        run: &Running,
        target: &str,
        route: &PeerRoute,
        name: String,
        msg: String,
    ) -> Result<()> {
        let req = Request::Notify { name, msg };
        let (key, mut c) = match route.unix.as_deref() {
            Some(u) if !VM_DENIED.load(Ordering::Relaxed) => (
                u,
                run.pool
                    .unix(u, run.key.as_ref(), run.timeout)
                    .map_err(|e| connect_error(target, e))?,
            ),
            _ => (
                route.endpoint.as_str(),
                run.pool
                    .tcp(&route.endpoint, run.key.as_ref(), run.timeout)
                    .map_err(|e| connect_error(target, e))?,
            ),
        };
        match c.call(&req) {
            Ok(0) => {
                run.pool.give(key, run.key.as_ref(), c);
                Ok(())
            }
            Ok(st) => Err(status_error(target, st)),
            Err(e) => {
                run.pool.forget(key);
                Err(EngineError::io(target, "notification failed", e))
            }
        }
    }
}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        self.shutdown();
        let managed: Vec<(u64, u64)> = self.managed.lock().drain().collect();
        for (a, l) in managed {
            // SAFETY: mappings this engine made; the engine (and its server)
            // is gone, so no transfer can use them.
            unsafe { libc::munmap(a as usize as *mut libc::c_void, l as usize) };
        }
    }
}

/// The entries of a batch call from its three lists, which must be of
/// one length.
pub fn items(buffers: &[u64], peer_addresses: &[u64], lengths: &[u64]) -> Result<Vec<Item>> {
    if buffers.len() != peer_addresses.len() || buffers.len() != lengths.len() {
        return Err(EngineError::new(
            ErrorKind::LengthMismatch,
            format!(
                "buffers, peer_buffer_addresses and lengths have different lengths ({}, {}, {})",
                buffers.len(),
                peer_addresses.len(),
                lengths.len()
            ),
        ));
    }
    Ok(buffers
        .iter()
        .zip(peer_addresses)
        .zip(lengths)
        .map(|((&b, &p), &l)| (b, p, l))
        .collect())
}

/// Lengths must add up without overflow.
fn check_items(items: &[Item]) -> Result<()> {
    if wire::total(items.iter().map(|i| i.2)).is_none() {
        return Err(EngineError::new(
            ErrorKind::Overflow,
            "the lengths of the batch add up to more than 2**64 bytes",
        ));
    }
    if let Some((i, _)) = items
        .iter()
        .enumerate()
        .find(|(_, it)| it.0.checked_add(it.2).is_none() || it.1.checked_add(it.2).is_none())
    {
        return Err(EngineError::new(
            ErrorKind::Overflow,
            format!("entry {i} runs past the end of the address space"),
        ));
    }
    Ok(())
}

/// Under `P2PHANDSHAKE` a target is named `host:port`.
fn check_p2p_name(name: &str) -> Result<()> {
    match split_hostname(name) {
        Ok((_, Some(_))) => Ok(()),
        _ => Err(EngineError::new(
            ErrorKind::UnknownPeer,
            "under P2PHANDSHAKE a target is named host:rpc_port (the peer's get_rpc_port())",
        )
        .with_peer(name)),
    }
}

fn connect_error(peer: &str, e: io::Error) -> EngineError {
    // Name resolution failures come back as other/uncategorized errors
    // from `to_socket_addrs`; a refused or timed-out connect is a dead peer.
    let msg = e.to_string();
    if e.kind() == io::ErrorKind::NotFound
        || msg.contains("failed to lookup address")
        || msg.contains("Name or service not known")
    {
        return EngineError::new(ErrorKind::UnknownPeer, "the target's host does not resolve")
            .with_peer(peer)
            .with_source(e);
    }
    EngineError::io(peer, "cannot connect to the target", e)
}

fn status_error(peer: &str, st: i32) -> EngineError {
    if refused(st) {
        EngineError::new(
            ErrorKind::OutOfBounds,
            "the target refused a range outside the memory it registered",
        )
        .with_peer(peer)
    } else {
        EngineError::new(
            ErrorKind::Internal,
            format!("the target failed the request (status {st})"),
        )
        .with_peer(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_split_like_upstream() {
        let ok = |s: &str| split_hostname(s).unwrap();
        assert_eq!(ok("h"), ("h".into(), None));
        assert_eq!(ok("h:5"), ("h".into(), Some(5)));
        assert_eq!(ok("[::1]:7"), ("::1".into(), Some(7)));
        assert_eq!(ok("::1"), ("::1".into(), None));
        assert_eq!(ok("10.0.0.1:9:npu_3"), ("10.0.0.1".into(), Some(9)));
        assert!(split_hostname("h:x").is_err());
        assert!(split_hostname("").is_err());
        assert!(split_hostname(":5").is_err());
        assert_eq!(join_host_port("::1", 3), "[::1]:3");
    }

    #[test]
    fn overflowing_batches_are_refused() {
        assert_eq!(
            check_items(&[(0, 0, u64::MAX), (0, 0, 1)])
                .unwrap_err()
                .kind(),
            ErrorKind::Overflow
        );
        assert_eq!(
            check_items(&[(u64::MAX, 0, 2)]).unwrap_err().kind(),
            ErrorKind::Overflow
        );
        assert!(check_items(&[(1, 2, 3)]).is_ok());
    }

    #[test]
    fn two_engines_move_bytes_both_ways() {
        let a = Arc::new(TransferEngine::new());
        let b = TransferEngine::new();
        a.initialize("127.0.0.1", P2PHANDSHAKE, "tcp", "").unwrap();
        b.initialize("127.0.0.1", P2PHANDSHAKE, "rdma", "").unwrap();
        assert_eq!(
            b.initialize("127.0.0.1", P2PHANDSHAKE, "tcp", "")
                .unwrap_err()
                .kind(),
            ErrorKind::AlreadyInitialized
        );
        let src: Vec<u8> = (0..(3u32 << 20)).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: both vectors outlive the engines' use of them (unregistered below).
        unsafe {
            a.register_memory(src.as_ptr() as u64, src.len() as u64, "*")
                .unwrap();
            b.register_memory(dst.as_mut_ptr() as u64, dst.len() as u64, "*")
                .unwrap();
        }
        let bname = b.name().unwrap();
        let n = src.len() as u64;
        let (s, d) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
        a.transfer(
            &bname,
            Opcode::Write,
            &[(s, d, n)],
            Some(("k".into(), "v".into())),
        )
        .unwrap();
        assert_eq!(dst, src);
        assert_eq!(b.take_notifies().unwrap(), vec![("k".into(), "v".into())]);
        // Out of bounds at the target: refused, nothing written past the end.
        let e = a
            .transfer(&bname, Opcode::Write, &[(s, d + n - 10, 11)], None)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfBounds);
        // The same for a copy large enough to be shared by both processes:
        // refused before either moves a byte.
        let e = a
            .transfer(
                &bname,
                Opcode::Write,
                &[(s, d + n - (1 << 20) + 10, 1 << 20)],
                None,
            )
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfBounds);
        assert_eq!(dst, src);
        // A shared copy of several pairs, split inside one of them: exactly
        // the named bytes move, the gaps stay as they were.
        let mut gappy = vec![0u8; src.len()];
        // SAFETY: `gappy` outlives its registration (unregistered below).
        unsafe {
            b.register_memory(gappy.as_mut_ptr() as u64, n, "*")
                .unwrap();
        }
        let g = gappy.as_mut_ptr() as u64;
        let ranges = [(0u64, 300_001u64), (400_000, 500_000), (1_000_000, 7)];
        let batch: Vec<Item> = ranges.iter().map(|&(o, l)| (s + o, g + o, l)).collect();
        a.transfer(&bname, Opcode::Write, &batch, None).unwrap();
        let mut want = vec![0u8; src.len()];
        for &(o, l) in &ranges {
            let (o, l) = (o as usize, l as usize);
            want[o..o + l].copy_from_slice(&src[o..o + l]);
        }
        assert_eq!(gappy, want);
        b.registry().unregister(g).unwrap();
        // A local buffer outside registered memory.
        let e = a
            .transfer(&bname, Opcode::Write, &[(4096, d, 1)], None)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LocalNotRegistered);
        // Async, read back, over a split batch.
        a.registry().unregister(s).unwrap();
        let mut back = vec![0u8; src.len()];
        // SAFETY: `back` outlives its registration (unregistered below).
        unsafe {
            a.register_memory(back.as_mut_ptr() as u64, n, "*").unwrap();
        }
        let id = a
            .submit(
                &bname,
                Opcode::Read,
                vec![(back.as_mut_ptr() as u64, d, n)],
                None,
            )
            .unwrap();
        a.wait_batches(&[id]).unwrap();
        assert_eq!(back, src);
        a.registry().unregister(back.as_ptr() as u64).unwrap();
        b.registry().unregister(d).unwrap();
        assert_eq!(a.first_buffer_address(&bname).unwrap(), 0);
        a.probe(&bname).unwrap();
        b.shutdown();
        assert!(a.probe(&bname).is_err());
    }

    #[test]
    fn a_target_may_unregister_as_soon_as_a_shared_copy_returns() {
        let a = TransferEngine::new();
        let b = TransferEngine::new();
        a.initialize("127.0.0.1", P2PHANDSHAKE, "tcp", "").unwrap();
        b.initialize("127.0.0.1", P2PHANDSHAKE, "tcp", "").unwrap();
        let n = 1u64 << 20;
        let mut src = vec![7u8; n as usize];
        let mut dst = vec![0u8; n as usize];
        let (s, d) = (src.as_mut_ptr() as u64, dst.as_mut_ptr() as u64);
        // SAFETY: `src` outlives its registration (unregistered below).
        unsafe { a.register_memory(s, n, "*").unwrap() };
        let bname = b.name().unwrap();
        for round in 0..200u32 {
            // SAFETY: `dst` outlives its registration (unregistered below).
            unsafe { b.register_memory(d, n, "*").unwrap() };
            let op = if round % 2 == 0 {
                Opcode::Write
            } else {
                Opcode::Read
            };
            a.transfer(&bname, op, &[(s, d, n)], None).unwrap();
            // The copy returned: nothing of it holds the target's memory.
            b.registry().unregister(d).unwrap();
        }
        assert_eq!(dst, src);
        a.registry().unregister(s).unwrap();
    }

    #[test]
    fn malformed_requests_drop_only_their_connection() {
        use mooncake_common::framing::{client_handshake, encode_frame, write_frame, Service};
        use std::io::{Read, Write};
        let t = TransferEngine::new();
        t.initialize("127.0.0.1", P2PHANDSHAKE, "tcp", "").unwrap();
        let mut dst = vec![0u8; 4096];
        // SAFETY: `dst` outlives the engine's use of it (unregistered below).
        unsafe {
            t.register_memory(dst.as_mut_ptr() as u64, 4096, "*")
                .unwrap();
        }
        let port = t.rpc_port().unwrap();
        let open = || {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            client_handshake(&mut s, Service::Engine, None).unwrap();
            s
        };
        let closed = |s: &mut std::net::TcpStream| {
            let mut b = [0u8; 64];
            loop {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => return true,
                    Ok(_) => continue,
                }
            }
        };
        // Garbage instead of a request.
        let mut s = open();
        write_frame(&mut s, &[9, 9, 9, 9, 1, 2, 3]).unwrap();
        assert!(closed(&mut s));
        // A frame claiming more than the limit.
        let mut s = open();
        s.write_all(&u32::MAX.to_le_bytes()).unwrap();
        assert!(closed(&mut s));
        // Lengths that overflow: refused with a status, then closed.
        let mut s = open();
        let d = dst.as_ptr() as u64;
        s.write_all(
            &encode_frame(&Request::Write {
                ranges: vec![(d, u64::MAX), (d, 2)],
            })
            .unwrap(),
        )
        .unwrap();
        let mut st = [0u8; 4];
        s.read_exact(&mut st).unwrap();
        assert_eq!(i32::from_le_bytes(st), wire::STATUS_BAD_REQUEST);
        assert!(closed(&mut s));
        // Cross-process copies are refused on TCP (no kernel-checked pid).
        let mut s = open();
        s.write_all(
            &encode_frame(&Request::VmWrite {
                pairs: vec![(d, d, 8)],
            })
            .unwrap(),
        )
        .unwrap();
        s.read_exact(&mut st).unwrap();
        assert_eq!(i32::from_le_bytes(st), wire::STATUS_BAD_REQUEST);
        s.write_all(
            &encode_frame(&Request::VmWriteShared {
                pairs: vec![(d, d, 8)],
                split: 4,
            })
            .unwrap(),
        )
        .unwrap();
        s.read_exact(&mut st).unwrap();
        assert_eq!(i32::from_le_bytes(st), wire::STATUS_BAD_REQUEST);
        // A shared copy whose initiator goes away after GO, before the
        // status of its part: the target holds its range pinned until the
        // connection ends, then unpins it.
        {
            use std::os::linux::net::SocketAddrExt;
            let name = t.running().unwrap().shared.desc.unix_name.clone();
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            let mut u = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
            client_handshake(&mut u, Service::Engine, None).unwrap();
            let mine = vec![3u8; 4096];
            u.write_all(
                &encode_frame(&Request::VmWriteShared {
                    pairs: vec![(mine.as_ptr() as u64, d, 4096)],
                    split: 2048,
                })
                .unwrap(),
            )
            .unwrap();
            u.read_exact(&mut st).unwrap();
            assert_eq!(i32::from_le_bytes(st), wire::STATUS_GO);
            // The target's half is done once its status arrives.
            u.read_exact(&mut st).unwrap();
            assert_eq!(i32::from_le_bytes(st), wire::STATUS_OK);
            assert_eq!(dst[..2048], mine[..2048]);
            let e = t
                .registry()
                .unregister_within(d, Duration::ZERO)
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InUse);
            drop(u);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while t.registry().unregister(d).is_err() {
                assert!(std::time::Instant::now() < deadline, "still pinned");
                std::thread::yield_now();
            }
            dst.fill(0);
            // SAFETY: `dst` outlives the engine's use of it (unregistered below).
            unsafe {
                t.register_memory(d, 4096, "*").unwrap();
            }
        }
        // The engine still serves everyone else.
        let src = vec![7u8; 4096];
        let a = TransferEngine::new();
        a.initialize("127.0.0.1", P2PHANDSHAKE, "tcp", "").unwrap();
        // SAFETY: `src` outlives the engine.
        unsafe {
            a.register_memory(src.as_ptr() as u64, 4096, "*").unwrap();
        }
        a.transfer(
            &t.name().unwrap(),
            Opcode::Write,
            &[(src.as_ptr() as u64, d, 4096)],
            None,
        )
        .unwrap();
        assert_eq!(dst, src);
        t.registry().unregister(dst.as_mut_ptr() as u64).unwrap();
    }
}
