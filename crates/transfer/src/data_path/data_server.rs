//! The per-client data server: serves reads and writes of byte ranges of
//! this client's segment over TCP, one thread per connection (blocking IO,
//! no busy polling). Malformed requests drop the connection; the server
//! keeps serving everyone else.
//!
//! Hardening: connections are admitted against caps in total
//! and per peer address scaled to the descriptor limit (so data connections
//! can never take the descriptors the client's heartbeat needs), must
//! complete the handshake within [`HANDSHAKE_TIMEOUT`] and are closed after
//! the idle timeout; each costs one descriptor. The accept loop backs off
//! when descriptors run out. With a cluster token, peers must prove it, and
//! writes land only inside ranges the master granted ([`WriteTicket`]).
//! Settings: `MC_DATA_MAX_CONNS`, `MC_DATA_MAX_CONNS_PER_PEER`,
//! `MC_DATA_IDLE_TIMEOUT_S`.
//!
//! Write fence ([`DataServer::fence_writes`]): a write carries no proof that
//! the master's allocation it fills is still current. A write sent before a
//! network partition can reach the owner seconds after the partition
//! heals (TCP retransmits it), when the master may have expired the owner's
//! segment, taken it back and allocated the same range to another object.
//! So before the owner remounts its segment (whenever the master has lost
//! its registration), it fences: every connection accepted until then is
//! shut down and refused further writes, and the fence returns only once no
//! write that started before it is still copying. Writes allocated after
//! the remount come on new connections.

use crate::data_path::data_proto::{
    DiskRead, RequestHeader, OP_DISK_READ, OP_READ, OP_WRITE_TICKET,
};
use crate::net::server::{peer_gone, spawn_conn};
use crate::net::sockio::{iov, send_all, sendfile_all, IOV_MAX};
use crate::segment::Segment;
use mooncake_common::auth::unix_ms;
use mooncake_common::framing::{server_handshake, Service};
use mooncake_common::limits::{accept_data_conns, ConnLimits, ConnPermit, ConnTracker, OpenConns};
use mooncake_common::spin_read::SpinReader;
use mooncake_common::tcp_tune::tune_data_listener;
use mooncake_common::{AuthKey, ErrorCode, WriteTicket};
use parking_lot::RwLock;
use std::io::{self, BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Time a new connection has to complete the handshake (the idle timeout
/// when that is shorter).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The data server's admission limits: at most 1024 connections (a
/// quarter of the descriptor limit when that is lower), half of them from
/// one peer, idle ones closed after 60 s; `MC_DATA_*` variables override.
pub fn data_limits() -> ConnLimits {
    ConnLimits::scaled_to_fd_limit(1024, 512, Duration::from_secs(60)).with_env("MC_DATA")
}

/// What serves reads of the owner's disk tier ([`OP_DISK_READ`]).
pub trait DiskSource: Send + Sync {
    /// Size of `key`'s value at `version`, if the tier holds it.
    fn value_len(&self, key: &str, version: u64) -> Option<u64>;
    /// Read `dst.len()` bytes of `key`'s value at `version` from byte
    /// `offset` on: verified bytes, or an error code (never other bytes).
    fn read_disk(
        &self,
        key: &str,
        version: u64,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), ErrorCode>;
}

/// A running data server; [`DataServer::stop`] closes the listener and every connection.
pub struct DataServer {
    addr: std::net::SocketAddr,
    stopped: Arc<AtomicBool>,
    conns: Arc<OpenConns<TcpStream>>,
    shared: Arc<Shared>,
}

/// What every connection of one server shares.
struct Shared {
    segment: Option<Arc<Segment>>,
    key: Option<AuthKey>,
    idle: Option<Duration>,
    disk: RwLock<Option<Arc<dyn DiskSource>>>,
    /// Write fences raised so far; a connection may write only while this
    /// is what it was when the connection was accepted.
    fence: AtomicU64,
    /// Held for reading by each write while it checks the fence and copies
    /// its payload; a fence takes it for writing to wait for those.
    writing: RwLock<()>,
}

impl DataServer {
    /// Serve `segment` (may be None for a pure client) on an already bound
    /// listener; with `key`, peers must prove the cluster token and writes
    /// need a master-signed ticket.
    pub fn start(
        listener: TcpListener,
        segment: Option<Arc<Segment>>,
        key: Option<AuthKey>,
    ) -> io::Result<DataServer> {
        Self::start_with(listener, segment, key, data_limits())
    }

    /// [`DataServer::start`] with explicit admission limits.
    pub fn start_with(
        listener: TcpListener,
        segment: Option<Arc<Segment>>,
        key: Option<AuthKey>,
        limits: ConnLimits,
    ) -> io::Result<DataServer> {
        let addr = listener.local_addr()?;
        tune_data_listener(&listener);
        let stopped = Arc::new(AtomicBool::new(false));
        let conns: Arc<OpenConns<TcpStream>> = Arc::default();
        let st = Arc::clone(&stopped);
        let cs = Arc::clone(&conns);
        let tracker = ConnTracker::new(limits);
        let shared = Arc::new(Shared {
            segment,
            key,
            idle: limits.idle_timeout,
            disk: RwLock::new(None),
            fence: AtomicU64::new(0),
            writing: RwLock::new(()),
        });
        std::thread::Builder::new()
            .name("mc-data-accept".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || accept_loop(listener, st, cs, tracker, shared)
            })?;
        Ok(DataServer {
            addr,
            stopped,
            conns,
            shared,
        })
    }

    /// Serve disk-tier reads from `src` from now on.
    pub fn serve_disk(&self, src: Arc<dyn DiskSource>) {
        *self.shared.disk.write() = Some(src);
    }

    /// The bound address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Fence off every write sent before now (see the module docs): the
    /// connections accepted so far are shut down and may write no more;
    /// returns once no write that started before the fence is still
    /// copying its payload.
    pub fn fence_writes(&self) {
        self.shared.fence.fetch_add(1, Ordering::AcqRel);
        // Wakes the connections blocked on a payload (or the next request).
        self.conns.shutdown_all();
        drop(self.shared.writing.write());
    }

    /// Stop accepting and close all open connections.
    pub fn stop(&self) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = TcpStream::connect(self.addr);
        self.conns.shutdown_all();
    }
}

impl Drop for DataServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(
    listener: TcpListener,
    stopped: Arc<AtomicBool>,
    conns: Arc<OpenConns<TcpStream>>,
    tracker: Arc<ConnTracker>,
    shared: Arc<Shared>,
) {
    accept_data_conns(
        "data server",
        &listener,
        &stopped,
        &tracker,
        |peer, why| tracing::info!(%peer, reason = %why, "refusing data connection"),
        |sock, peer, permit| {
            let epoch = shared.fence.load(Ordering::Acquire);
            let sh = Arc::clone(&shared);
            spawn_conn("mc-data-conn", &conns, sock, move |sock| {
                if let Err(e) = serve_conn(sock, &sh, epoch, permit) {
                    if !peer_gone(&e) {
                        tracing::info!(%peer, error = %e, "data connection dropped");
                    }
                }
            });
        },
    );
}

/// Ranges at least this long go out with `sendfile` from the memfd (no
/// user-space copy); shorter ones are gathered into `sendmsg` batches.
const SENDFILE_MIN: u64 = 256 << 10;
/// Bytes gathered into one `sendmsg`.
const GATHER_BYTES: usize = 4 << 20;
/// Ranges up to this long are first copied (with prefetching) into the
/// connection's staging buffer: many small scattered rows gather much faster
/// in user space than through one iovec each in the kernel.
const STAGE_MAX_RANGE: u64 = 16 << 10;
/// Size of the per-connection staging buffer.
const STAGE_BYTES: usize = 1 << 20;
/// How many ranges ahead the gather prefetches.
const PREFETCH_AHEAD: usize = 8;

#[inline]
fn prefetch(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut off = 0;
        while off < len {
            // SAFETY: prefetch is a hint; it never faults.
            unsafe {
                std::arch::x86_64::_mm_prefetch(
                    p.wrapping_add(off) as *const i8,
                    std::arch::x86_64::_MM_HINT_T0,
                )
            };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// Send status 0 and then the ranges, in order. `stage` is the
/// connection's staging buffer (capacity [`STAGE_BYTES`], reused).
fn send_ranges(
    sock: &TcpStream,
    seg: &Segment,
    ranges: &[(u64, u64)],
    stage: &mut Vec<u8>,
) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    let status = 0i32.to_le_bytes();
    stage.clear();
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(ranges.len().min(IOV_MAX) + 1);
    iovs.push(iov(status.as_ptr(), 4));
    let mut pending = 4usize;
    // iovecs point into `status`, `stage` (never reallocated: flushed before
    // it would grow past its capacity) and checked segment ranges.
    let flush = |iovs: &mut Vec<libc::iovec>, stage: &mut Vec<u8>, more: bool| -> io::Result<()> {
        // SAFETY: see above; everything stays alive and unchanged until sent.
        unsafe { send_all(fd, iovs, more)? };
        iovs.clear();
        stage.clear();
        Ok(())
    };
    for (i, &(o, l)) in ranges.iter().enumerate() {
        if l == 0 {
            continue;
        }
        // SAFETY: ranges were checked against the segment by the caller.
        let src = unsafe { seg.base().add(o as usize) };
        if l >= SENDFILE_MIN {
            flush(&mut iovs, stage, true)?;
            pending = 0;
            sendfile_all(fd, seg.fd().as_raw_fd(), o, l)?;
            continue;
        }
        if l <= STAGE_MAX_RANGE {
            if stage.len() + l as usize > stage.capacity() {
                flush(&mut iovs, stage, true)?;
                pending = 0;
            }
            if let Some(&(po, pl)) = ranges.get(i + PREFETCH_AHEAD) {
                if pl <= STAGE_MAX_RANGE {
                    prefetch(seg.base().wrapping_add(po as usize), pl as usize);
                }
            }
            let at = stage.len();
            // SAFETY: checked range of the segment.
            stage.extend_from_slice(unsafe { std::slice::from_raw_parts(src, l as usize) });
            let p = stage.as_ptr().wrapping_add(at);
            match iovs.last_mut() {
                Some(last) if last.iov_base as usize + last.iov_len == p as usize => {
                    last.iov_len += l as usize
                }
                _ => iovs.push(iov(p, l as usize)),
            }
        } else {
            iovs.push(iov(src, l as usize));
        }
        pending += l as usize;
        if iovs.len() >= IOV_MAX || pending >= GATHER_BYTES {
            let more = i + 1 < ranges.len();
            flush(&mut iovs, stage, more)?;
            pending = 0;
        }
    }
    if !iovs.is_empty() {
        flush(&mut iovs, stage, false)?;
    }
    Ok(())
}

/// Check a write request against the cluster token: it must carry a
/// valid ticket for this segment covering every range.
fn authorize_write(key: &AuthKey, seg: &Segment, h: &RequestHeader) -> Result<(), String> {
    let Some(t) = h.ticket.as_ref().filter(|_| h.op == OP_WRITE_TICKET) else {
        return Err("write without a ticket".into());
    };
    check_ticket(key, seg, t, &h.ranges)
}

fn check_ticket(
    key: &AuthKey,
    seg: &Segment,
    t: &WriteTicket,
    ranges: &[(u64, u64)],
) -> Result<(), String> {
    t.check(key, seg.uuid(), unix_ms())
        .map_err(|e| e.to_string())?;
    if ranges.iter().all(|(o, l)| t.covers(*o, *l)) {
        Ok(())
    } else {
        Err("write outside the ticket's range".into())
    }
}

/// Answer one disk-tier read: the status, then the bytes on success.
fn serve_disk_read(s: &mut &TcpStream, sh: &Shared, d: &DiskRead) -> io::Result<()> {
    let src = sh.disk.read().clone();
    let code = |c: ErrorCode| c.code().to_le_bytes();
    let Some(src) = src else {
        return s.write_all(&code(ErrorCode::ObjectNotFound));
    };
    let Some(total) = src.value_len(&d.key, d.version) else {
        return s.write_all(&code(ErrorCode::ObjectNotFound));
    };
    let fits = d.offset.checked_add(d.len).is_some_and(|end| end <= total);
    let Ok(len) = usize::try_from(d.len) else {
        return s.write_all(&code(ErrorCode::InvalidParams));
    };
    if !fits {
        return s.write_all(&code(ErrorCode::InvalidParams));
    }
    let mut buf = vec![0u8; len];
    match src.read_disk(&d.key, d.version, d.offset, &mut buf) {
        Ok(()) => {
            s.write_all(&0i32.to_le_bytes())?;
            s.write_all(&buf)
        }
        Err(c) => s.write_all(&code(c)),
    }
}

/// Serve one connection, accepted when [`Shared::fence`] was `epoch`.
fn serve_conn(
    sock: &Arc<TcpStream>,
    sh: &Shared,
    epoch: u64,
    _permit: ConnPermit,
) -> io::Result<()> {
    let mut s: &TcpStream = sock;
    let hs = sh
        .idle
        .map_or(HANDSHAKE_TIMEOUT, |d| d.min(HANDSHAKE_TIMEOUT));
    s.set_read_timeout(Some(hs))?;
    s.set_write_timeout(Some(hs))?;
    server_handshake(&mut s, Service::Data, sh.key.as_ref())?;
    s.set_read_timeout(sh.idle)?;
    s.set_write_timeout(None)?;
    let mut rd = io::BufReader::with_capacity(64 << 10, SpinReader::new(Arc::clone(sock)));
    let mut stage: Vec<u8> = Vec::with_capacity(STAGE_BYTES);
    loop {
        if rd.fill_buf()?.first() == Some(&OP_DISK_READ) {
            rd.consume(1);
            let d = DiskRead::read_body(&mut rd)?;
            serve_disk_read(&mut s, sh, &d)?;
            continue;
        }
        let h = RequestHeader::read_from(&mut rd)?;
        crate::segment::note_use();
        let seg = match &sh.segment {
            Some(seg) if seg.uuid() == h.uuid => seg,
            _ => {
                s.write_all(&ErrorCode::SegmentNotFound.code().to_le_bytes())?;
                if h.op == OP_READ {
                    continue;
                }
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "write to unknown segment",
                ));
            }
        };
        let valid = h.ranges.iter().all(|(o, l)| seg.check_range(*o, *l));
        if h.op == OP_READ {
            if !valid {
                s.write_all(&ErrorCode::InvalidParams.code().to_le_bytes())?;
                continue;
            }
            send_ranges(sock, seg, &h.ranges, &mut stage)?;
            continue;
        }
        if !valid {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "write out of range",
            ));
        }
        if let Some(key) = &sh.key {
            if let Err(why) = authorize_write(key, seg, &h) {
                // The payload that follows cannot be skipped safely: answer
                // and close.
                let _ = s.write_all(&ErrorCode::IllegalClient.code().to_le_bytes());
                return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
            }
        }
        // A fence raised since this connection was accepted refuses the
        // write; one raised from here on waits until the payload is in.
        let _writing = sh.writing.read();
        if sh.fence.load(Ordering::Acquire) != epoch {
            let _ = s.write_all(&ErrorCode::SegmentNotFound.code().to_le_bytes());
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "write on a connection from before the write fence",
            ));
        }
        for (o, l) in &h.ranges {
            let (Ok(at), Ok(len)) = (usize::try_from(*o), usize::try_from(*l)) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "range too large",
                ));
            };
            // SAFETY: `check_range` accepted the range, so it lies inside
            // the segment's mapping, which lives as long as `seg`.
            let dst = unsafe { std::slice::from_raw_parts_mut(seg.base().add(at), len) };
            rd.read_exact(dst)?;
        }
        s.write_all(&0i32.to_le_bytes())?;
    }
}
