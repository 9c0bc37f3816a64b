//! The engine's server side: its RPC port (TCP) and, for processes of the
//! same host, its abstract Unix socket. One thread per connection, blocking
//! IO after a short poll ([`SpinReader`]).
//!
//! Every range a peer names is checked against the registered memory
//! before a byte moves, and the regions stay pinned while they do: a range
//! outside every region, or one that runs past the end of its region, is
//! refused with a negative status and one log line naming the peer; the
//! connection stays usable (the payload of a refused write is read and
//! dropped). On the Unix socket the peer's process id comes from the
//! kernel (`SO_PEERCRED`), never from the request, and the target itself
//! copies between that process and its own registered memory.

use crate::engine::log::{emit, Level};
use crate::engine::registry::Registry;
use crate::engine::wire::{self, Descriptor, Request};
use crate::net::server::{peer_gone, spawn_conn};
use crate::net::sockio::{iov, recv_all, send_all};
use crate::same_host::process_vm::{self as vm, Direction};
use mooncake_common::framing::{
    decode, encode, read_frame, server_handshake, write_frame, Service, MAX_REQUEST_FRAME,
};
use mooncake_common::limits::{
    accept_data_conns, accept_until, ConnLimits, ConnTracker, OpenConns,
};
use mooncake_common::spin_read::SpinReader;
use mooncake_common::AuthKey;
use parking_lot::Mutex;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Time a new connection has to complete the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes read ahead of a request (a small write's payload comes with it).
const READ_AHEAD: usize = 64 << 10;

/// What every connection of one engine's server shares.
pub(crate) struct Shared {
    /// The memory peers may touch.
    pub(crate) registry: Arc<Registry>,
    /// The cluster token peers must prove.
    pub(crate) key: Option<AuthKey>,
    /// Notifications received, oldest first.
    pub(crate) notifies: Mutex<Vec<(String, String)>>,
    /// This engine's descriptor (its buffers are filled in on `Describe`).
    pub(crate) desc: Descriptor,
}

impl Shared {
    fn describe(&self) -> Descriptor {
        let mut d = self.desc.clone();
        d.buffers = self
            .registry
            .regions()
            .into_iter()
            .map(|(a, l, _)| (a, l))
            .collect();
        d
    }
}

/// A running server; [`Server::stop`] closes the listeners and every
/// connection.
pub(crate) struct Server {
    tcp_addr: std::net::SocketAddr,
    unix_name: Option<String>,
    stopped: Arc<AtomicBool>,
    tcp_conns: Arc<OpenConns<TcpStream>>,
    unix_conns: Arc<OpenConns<UnixStream>>,
}

/// The server's admission limits: `MC_ENGINE_MAX_CONNS` (1024, at most a
/// quarter of the descriptor limit), `MC_ENGINE_MAX_CONNS_PER_PEER` (512),
/// `MC_ENGINE_IDLE_TIMEOUT_S` (60).
fn limits() -> ConnLimits {
    ConnLimits::scaled_to_fd_limit(1024, 512, Duration::from_secs(60)).with_env("MC_ENGINE")
}

/// Bind the abstract Unix socket `name`.
pub(crate) fn bind_unix(name: &str) -> io::Result<UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    UnixListener::bind_addr(&addr)
}

impl Server {
    /// Serve `shared` on `tcp` and, when given, on `unix` (bound as
    /// `unix_name`).
    pub(crate) fn start(
        tcp: TcpListener,
        unix: Option<(UnixListener, String)>,
        shared: Arc<Shared>,
    ) -> io::Result<Server> {
        let tcp_addr = tcp.local_addr()?;
        let stopped = Arc::new(AtomicBool::new(false));
        let tcp_conns: Arc<OpenConns<TcpStream>> = Arc::default();
        let unix_conns: Arc<OpenConns<UnixStream>> = Arc::default();
        let lim = limits();
        {
            let (st, cs, sh) = (
                Arc::clone(&stopped),
                Arc::clone(&tcp_conns),
                Arc::clone(&shared),
            );
            let tracker = ConnTracker::new(lim);
            std::thread::Builder::new()
                .name("mc-engine-accept".into())
                .spawn(move || tcp_accept_loop(tcp, st, cs, tracker, sh))?;
        }
        let mut unix_name = None;
        if let Some((ul, name)) = unix {
            let (st, cs, sh) = (
                Arc::clone(&stopped),
                Arc::clone(&unix_conns),
                Arc::clone(&shared),
            );
            let idle = lim.idle_timeout;
            std::thread::Builder::new()
                .name("mc-engine-local".into())
                .spawn(move || unix_accept_loop(ul, st, cs, sh, idle))?;
            unix_name = Some(name);
        }
        Ok(Server {
            tcp_addr,
            unix_name,
            stopped,
            tcp_conns,
            unix_conns,
        })
    }

    /// Stop accepting and close every open connection.
    pub(crate) fn stop(&self) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the accept loops.
        let mut wake = self.tcp_addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(name) = &self.unix_name {
            use std::os::linux::net::SocketAddrExt;
            if let Ok(a) = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()) {
                let _ = UnixStream::connect_addr(&a);
            }
        }
        self.tcp_conns.shutdown_all();
        self.unix_conns.shutdown_all();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tcp_accept_loop(
    listener: TcpListener,
    stopped: Arc<AtomicBool>,
    conns: Arc<OpenConns<TcpStream>>,
    tracker: Arc<ConnTracker>,
    shared: Arc<Shared>,
) {
    let idle = tracker.limits().idle_timeout;
    accept_data_conns(
        "transfer engine",
        &listener,
        &stopped,
        &tracker,
        |peer, why| {
            let msg = format!("transfer engine: refusing a connection from {peer}: {why}");
            emit(Level::Warning, &msg);
        },
        |sock, peer, permit| {
            let sh = Arc::clone(&shared);
            spawn_conn("mc-engine-conn", &conns, sock, move |sock| {
                let _permit = permit;
                serve_logged(&**sock, &sh, None, &peer.to_string(), idle);
            });
        },
    );
}

/// [`serve`], logging why the connection from `label` dropped unless the
/// peer simply went away.
fn serve_logged<S>(sock: &S, sh: &Shared, pid: Option<i32>, label: &str, idle: Option<Duration>)
where
    S: AsRawFd + Timeouts,
    for<'a> &'a S: Read + Write,
{
    if let Err(e) = serve(sock, sh, pid, label, idle) {
        if !peer_gone(&e) {
            emit(
                Level::Info,
                &format!("transfer engine: connection from {label} dropped: {e}"),
            );
        }
    }
}

/// The process at the other end of a Unix connection, as the kernel saw it
/// when the connection was made (`SO_PEERCRED`, in this process's pid
/// namespace); `None` when it is not visible from here.
pub(crate) fn peer_pid(s: &UnixStream) -> Option<i32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for getsockopt to fill.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid)
}

fn unix_accept_loop(
    listener: UnixListener,
    stopped: Arc<AtomicBool>,
    conns: Arc<OpenConns<UnixStream>>,
    shared: Arc<Shared>,
    idle: Option<Duration>,
) {
    accept_until(
        "transfer engine (local)",
        || stopped.load(Ordering::Acquire),
        || listener.accept(),
        |(sock, _)| {
            let pid = peer_pid(&sock);
            let sh = Arc::clone(&shared);
            spawn_conn("mc-engine-local-conn", &conns, sock, move |sock| {
                let label = format!("local process {}", pid.unwrap_or(0));
                serve_logged(&**sock, &sh, pid, &label, idle);
            });
        },
    );
}

fn send_status<S>(s: &S, status: i32) -> io::Result<()>
where
    for<'a> &'a S: Write,
{
    let mut w: &S = s;
    w.write_all(&status.to_le_bytes())
}

/// Serve requests on one connection until the peer closes it. `pid` is the
/// peer process (Unix socket only).
fn serve<S>(
    sock: &S,
    sh: &Shared,
    pid: Option<i32>,
    label: &str,
    idle: Option<Duration>,
) -> io::Result<()>
where
    S: AsRawFd + Timeouts,
    for<'a> &'a S: Read + Write,
{
    let hs = idle.map_or(HANDSHAKE_TIMEOUT, |d| d.min(HANDSHAKE_TIMEOUT));
    sock.timeouts(Some(hs), Some(hs))?;
    let mut s: &S = sock;
    server_handshake(&mut s, Service::Engine, sh.key.as_ref())?;
    sock.timeouts(idle, None)?;
    let fd = sock.as_raw_fd();
    let mut rd = BufReader::with_capacity(READ_AHEAD, SpinReader::new(Fd(fd)));
    loop {
        let body = read_frame(&mut rd, MAX_REQUEST_FRAME)?;
        let req: Request = decode(&body)?;
        if req.len() > wire::MAX_RANGES {
            send_status(sock, wire::STATUS_BAD_REQUEST)?;
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "too many ranges",
            ));
        }
        match req {
            Request::Describe => {
                let mut w: &S = sock;
                write_frame(&mut w, &encode(&sh.describe())?)?;
            }
            Request::Probe => send_status(sock, wire::STATUS_OK)?,
            Request::Notify { name, msg } => {
                sh.notifies.lock().push((name, msg));
                send_status(sock, wire::STATUS_OK)?;
            }
            Request::Write { ranges } => {
                let Some(total) = wire::total(ranges.iter().map(|r| r.1)) else {
                    send_status(sock, wire::STATUS_BAD_REQUEST)?;
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "lengths overflow",
                    ));
                };
                match sh.registry.pin(
                    ranges.iter().copied(),
                    crate::engine::error::ErrorKind::OutOfBounds,
                    "range",
                ) {
                    Ok(pin) => {
                        if sh.registry.any_device(ranges.iter().copied()) {
                            recv_staged(&mut rd, fd, sh, &ranges)?;
                        } else {
                            // SAFETY: every range lies inside registered
                            // memory (checked and pinned above), which the
                            // registrant keeps valid and writable while
                            // registered.
                            unsafe { recv_into(&mut rd, fd, &ranges)? };
                        }
                        drop(pin);
                        send_status(sock, wire::STATUS_OK)?;
                    }
                    Err(e) => {
                        emit(
                            Level::Warning,
                            &format!("transfer engine: refused a write from {label}: {e}"),
                        );
                        drain(&mut rd, total)?;
                        send_status(sock, wire::STATUS_OUT_OF_BOUNDS)?;
                    }
                }
            }
            Request::Read { ranges } => {
                match sh.registry.pin(
                    ranges.iter().copied(),
                    crate::engine::error::ErrorKind::OutOfBounds,
                    "range",
                ) {
                    Ok(pin) if sh.registry.any_device(ranges.iter().copied()) => {
                        send_staged(sock, fd, sh, &ranges)?;
                        drop(pin);
                    }
                    Ok(pin) => {
                        let status = wire::STATUS_OK.to_le_bytes();
                        let mut iovs = Vec::with_capacity(ranges.len() + 1);
                        iovs.push(iov(status.as_ptr(), 4));
                        push_iovs(&mut iovs, ranges.iter().map(|&(a, l)| (a, l)));
                        // SAFETY: the status lives until the call returns;
                        // the ranges lie in pinned registered memory.
                        unsafe { send_all(fd, &mut iovs, false)? };
                        drop(pin);
                    }
                    Err(e) => {
                        emit(
                            Level::Warning,
                            &format!("transfer engine: refused a read from {label}: {e}"),
                        );
                        send_status(sock, wire::STATUS_OUT_OF_BOUNDS)?;
                    }
                }
            }
            Request::VmWrite { .. } | Request::VmRead { .. } if pid.is_none() => {
                send_status(sock, wire::STATUS_BAD_REQUEST)?;
            }
            Request::VmWriteShared { pairs, split } => {
                let req = (pairs.as_slice(), split);
                vm_shared(sock, &mut rd, sh, pid, req, Direction::FromPeer, label)?;
            }
            Request::VmReadShared { pairs, split } => {
                let req = (pairs.as_slice(), split);
                vm_shared(sock, &mut rd, sh, pid, req, Direction::ToPeer, label)?;
            }
            Request::VmWrite { pairs } => {
                let st = vm_request(sh, pid, &pairs, Direction::FromPeer, label);
                send_status(sock, st)?;
            }
            Request::VmRead { pairs } => {
                let st = vm_request(sh, pid, &pairs, Direction::ToPeer, label);
                send_status(sock, st)?;
            }
            Request::IpcWrite { handle, pairs } => {
                let st = ipc_request(sh, pid, &handle, &pairs, Direction::FromPeer, label);
                send_status(sock, st)?;
            }
            Request::IpcRead { handle, pairs } => {
                let st = ipc_request(sh, pid, &handle, &pairs, Direction::ToPeer, label);
                send_status(sock, st)?;
            }
        }
    }
}

/// Check and pin the target ranges of a cross-process copy: the pin, or
/// the status that refuses the request (logged).
fn vm_pin(
    sh: &Shared,
    pairs: &[(u64, u64, u64)],
    dir: Direction,
    label: &str,
) -> Result<crate::engine::registry::Pin, i32> {
    if wire::total(pairs.iter().map(|p| p.2)).is_none() {
        return Err(wire::STATUS_BAD_REQUEST);
    }
    if sh
        .registry
        .any_device(pairs.iter().map(|&(_, t, l)| (t, l)))
    {
        return Err(wire::STATUS_DEVICE);
    }
    sh.registry
        .pin(
            pairs.iter().map(|&(_, t, l)| (t, l)),
            crate::engine::error::ErrorKind::OutOfBounds,
            "range",
        )
        .map_err(|e| {
            let what = if dir == Direction::FromPeer {
                "write"
            } else {
                "read"
            };
            emit(
                Level::Warning,
                &format!("transfer engine: refused a {what} from {label}: {e}"),
            );
            wire::STATUS_OUT_OF_BOUNDS
        })
}

/// Copy between process `pid` and pinned target ranges; the status.
///
/// # Safety
/// Every target range of `pairs` must lie in memory pinned by the caller.
unsafe fn vm_copy(
    pid: i32,
    pairs: &[(u64, u64, u64)],
    dir: Direction,
    parallel: bool,
    label: &str,
) -> i32 {
    // SAFETY: every own (target) range lies in pinned registered memory,
    // which the registrant keeps valid while registered (the caller's
    // contract); the peer's ranges are checked by the kernel.
    let r = unsafe {
        if parallel {
            vm::copy(pid, dir, pairs)
        } else {
            vm::copy_serial(pid, dir, pairs)
        }
    };
    vm_status(r, label)
}

/// The wire status of a cross-process copy's result: a kernel refusal
/// (`EPERM`, or the process is gone) says to use TCP; any other failure is
/// logged with `label` (the other process).
pub(crate) fn vm_status(r: io::Result<()>, label: &str) -> i32 {
    match r {
        Ok(()) => wire::STATUS_OK,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::ESRCH)) => {
            wire::STATUS_VM_DENIED
        }
        Err(e) => {
            emit(
                Level::Warning,
                &format!("transfer engine: cross-process copy with {label} failed: {e}"),
            );
            wire::STATUS_VM_FAILED
        }
    }
}

/// Serve one cross-process copy: check the target ranges, then copy
/// between the peer process and them.
fn vm_request(
    sh: &Shared,
    pid: Option<i32>,
    pairs: &[(u64, u64, u64)],
    dir: Direction,
    label: &str,
) -> i32 {
    let Some(pid) = pid else {
        return wire::STATUS_BAD_REQUEST;
    };
    let pin = match vm_pin(sh, pairs, dir, label) {
        Ok(p) => p,
        Err(st) => return st,
    };
    // SAFETY: `pin` holds every target range.
    let st = unsafe { vm_copy(pid, pairs, dir, true, label) };
    drop(pin);
    st
}

/// Serve one shared cross-process copy (see the protocol in `wire`): check
/// and pin, answer GO, copy the bytes before `split` and answer its
/// status, then unpin once the initiator's status of its part arrives.
fn vm_shared<S, R: Read>(
    sock: &S,
    rd: &mut BufReader<R>,
    sh: &Shared,
    pid: Option<i32>,
    req: (&[(u64, u64, u64)], u64),
    dir: Direction,
    label: &str,
) -> io::Result<()>
where
    for<'a> &'a S: Write,
{
    let (pairs, split) = req;
    let Some(pid) = pid else {
        return send_status(sock, wire::STATUS_BAD_REQUEST);
    };
    let mut pin = match vm_pin(sh, pairs, dir, label) {
        Ok(p) => p,
        Err(st) => return send_status(sock, st),
    };
    send_status(sock, wire::STATUS_GO)?;
    let (mine, _) = vm::split_at(pairs, split);
    // SAFETY: `pin` holds every target range.
    let st = unsafe { vm_copy(pid, &mine, dir, false, label) };
    // The initiator's call returns once it has this status and has sent its
    // own (which unpins): an `unregister` in between waits for that.
    pin.settle();
    send_status(sock, st)?;
    // The initiator writes into or reads from the pinned ranges until it
    // sends the status of its part; a connection that ends first unpins.
    let mut theirs = [0u8; 4];
    rd.read_exact(&mut theirs)?;
    drop(pin);
    Ok(())
}

/// A descriptor borrowed for reading (the stream outlives the reader).
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Set a stream's read and write timeouts.
pub(crate) trait Timeouts {
    /// Apply both timeouts.
    fn timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()>;
}

impl Timeouts for TcpStream {
    fn timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(read)?;
        self.set_write_timeout(write)
    }
}

impl Timeouts for UnixStream {
    fn timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(read)?;
        self.set_write_timeout(write)
    }
}

/// Append iovecs for `(addr, len)` ranges, skipping empty ones and merging
/// ranges that continue one another.
pub(crate) fn push_iovs(v: &mut Vec<libc::iovec>, ranges: impl Iterator<Item = (u64, u64)>) {
    for (a, l) in ranges {
        if l == 0 {
            continue;
        }
        if let Some(last) = v.last_mut() {
            if last.iov_base as u64 + last.iov_len as u64 == a {
                last.iov_len += l as usize;
                continue;
            }
        }
        v.push(iov(a as usize as *const u8, l as usize));
    }
}

/// Receive exactly the bytes of `ranges` into memory: first what `rd`
/// already holds, then straight from the socket.
///
/// # Safety
/// Every range must be writable memory that nothing else uses meanwhile.
unsafe fn recv_into<R: Read>(
    rd: &mut BufReader<R>,
    fd: RawFd,
    ranges: &[(u64, u64)],
) -> io::Result<()> {
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(ranges.len().min(1 << 16));
    push_iovs(&mut iovs, ranges.iter().copied());
    let mut start = 0usize;
    let buffered = rd.buffer();
    let mut used = 0usize;
    while used < buffered.len() && start < iovs.len() {
        let v = &mut iovs[start];
        let n = v.iov_len.min(buffered.len() - used);
        // SAFETY: `v` describes writable memory (the caller's contract) of
        // at least `n` bytes; the source is `n` buffered bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(buffered[used..].as_ptr(), v.iov_base.cast::<u8>(), n)
        };
        used += n;
        v.iov_base = (v.iov_base as usize + n) as *mut libc::c_void;
        v.iov_len -= n;
        if v.iov_len == 0 {
            start += 1;
        }
    }
    rd.consume(used);
    // SAFETY: the remaining iovecs describe the caller's writable memory.
    unsafe { recv_all(fd, &mut iovs[start..]) }
}

fn device_io(e: crate::engine::error::EngineError) -> io::Error {
    io::Error::other(e.to_string())
}

/// Receive a write's payload into pinned ranges some of which are device
/// memory: host ranges straight from the socket, device ranges through
/// the staging pipeline (the next chunk arrives while one is copied in).
/// A failed device copy ends the connection (the initiator's call fails).
fn recv_staged<R: Read>(
    rd: &mut BufReader<R>,
    fd: RawFd,
    sh: &Shared,
    ranges: &[(u64, u64)],
) -> io::Result<()> {
    let dev = crate::engine::device::current().map_err(device_io)?;
    for &(a, l) in ranges {
        if l == 0 {
            continue;
        }
        if sh.registry.is_device(a) {
            let mut source = |_: u64, b: &mut [u8]| {
                // SAFETY: `b` is a pinned staging buffer the pipeline lent
                // to this call alone.
                unsafe { recv_into(rd, fd, &[(b.as_mut_ptr() as u64, b.len() as u64)]) }
                    .map_err(|e| crate::engine::error::EngineError::io("", "receive", e))
            };
            // SAFETY: the range lies in registered device memory, pinned by
            // the caller.
            unsafe { dev.stage_in(a, l, &mut source) }.map_err(device_io)?;
        } else {
            // SAFETY: the range lies in registered host memory, pinned by
            // the caller.
            unsafe { recv_into(rd, fd, &[(a, l)])? };
        }
    }
    Ok(())
}

/// Answer a read of pinned ranges some of which are device memory: the
/// status, then each range in order, device ranges through the staging
/// pipeline. A failed device copy ends the connection.
fn send_staged<S>(sock: &S, fd: RawFd, sh: &Shared, ranges: &[(u64, u64)]) -> io::Result<()>
where
    for<'a> &'a S: Write,
{
    let dev = crate::engine::device::current().map_err(device_io)?;
    send_status(sock, wire::STATUS_OK)?;
    for &(a, l) in ranges {
        if l == 0 {
            continue;
        }
        if sh.registry.is_device(a) {
            let mut sink = |_: u64, b: &[u8]| {
                let mut w: &S = sock;
                w.write_all(b)
                    .map_err(|e| crate::engine::error::EngineError::io("", "send", e))
            };
            // SAFETY: the range lies in registered device memory, pinned by
            // the caller.
            unsafe { dev.stage_out(a, l, &mut sink) }.map_err(device_io)?;
        } else {
            let mut iovs = Vec::with_capacity(1);
            push_iovs(&mut iovs, std::iter::once((a, l)));
            // SAFETY: the range lies in pinned registered host memory.
            unsafe { send_all(fd, &mut iovs, false)? };
        }
    }
    Ok(())
}

/// Serve one CUDA IPC copy: map the initiator's exported allocation, check
/// and pin the target ranges, copy, unmap. A target without a driver, or
/// whose driver refuses the handle, answers [`wire::STATUS_IPC_REFUSED`].
fn ipc_request(
    sh: &Shared,
    pid: Option<i32>,
    handle: &[u8],
    pairs: &[(u64, u64, u64)],
    dir: Direction,
    label: &str,
) -> i32 {
    if pid.is_none() || wire::total(pairs.iter().map(|p| p.2)).is_none() {
        return wire::STATUS_BAD_REQUEST;
    }
    let Ok(dev) = crate::engine::device::current() else {
        return wire::STATUS_IPC_REFUSED;
    };
    let pin = match sh.registry.pin(
        pairs.iter().map(|&(_, t, l)| (t, l)),
        crate::engine::error::ErrorKind::OutOfBounds,
        "range",
    ) {
        Ok(p) => p,
        Err(e) => {
            emit(
                Level::Warning,
                &format!("transfer engine: refused a device copy from {label}: {e}"),
            );
            return wire::STATUS_OUT_OF_BOUNDS;
        }
    };
    let near = pairs.first().map(|p| p.1);
    let (base, size) = match dev.ops().ipc_open(handle, near) {
        Ok(m) => m,
        Err(e) => {
            emit(
                Level::Info,
                &format!("transfer engine: cannot map the CUDA IPC handle of {label}: {e}"),
            );
            return wire::STATUS_IPC_REFUSED;
        }
    };
    let mut st = wire::STATUS_OK;
    if pairs
        .iter()
        .any(|&(o, _, l)| o.checked_add(l).is_none_or(|end| end > size))
    {
        st = wire::STATUS_BAD_REQUEST;
    }
    for &(o, t, l) in pairs {
        if st != wire::STATUS_OK {
            break;
        }
        // SAFETY: the target range lies in pinned registered memory; the
        // source range lies inside the mapped allocation (checked above).
        let r = unsafe {
            match dir {
                Direction::FromPeer => dev.copy(t, base + o, l),
                Direction::ToPeer => dev.copy(base + o, t, l),
            }
        };
        if let Err(e) = r {
            emit(
                Level::Warning,
                &format!("transfer engine: a device copy for {label} failed: {e}"),
            );
            st = wire::STATUS_VM_FAILED;
        }
    }
    // SAFETY: the mapping made above, no longer used.
    unsafe { dev.ops().ipc_close(base) };
    drop(pin);
    st
}

/// Read and drop `n` bytes (the payload of a refused write).
fn drain<R: Read>(rd: &mut BufReader<R>, n: u64) -> io::Result<()> {
    let copied = io::copy(&mut rd.by_ref().take(n), &mut io::sink())?;
    if copied != n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iovecs_merge_adjacent_ranges() {
        let mut v = Vec::new();
        push_iovs(
            &mut v,
            [(100, 10), (110, 5), (0, 0), (200, 1), (201, 0)].into_iter(),
        );
        let got: Vec<(usize, usize)> = v.iter().map(|i| (i.iov_base as usize, i.iov_len)).collect();
        assert_eq!(got, vec![(100, 15), (200, 1)]);
    }
}
