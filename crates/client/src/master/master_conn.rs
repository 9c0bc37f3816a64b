//! Blocking RPC to the master over a small pool of connections. A broken
//! connection is dropped and the call fails with RPC_FAIL; the next call
//! reconnects (with a short timeout, so calls during an outage fail fast).
//! A pooled connection idle longer than [`POOL_IDLE_MAX`], or closed by the
//! master meanwhile (its idle timeout, a restart), is not reused: that is
//! checked before every reuse, because a request is never sent twice once
//! it may have reached a master (a `PutEnd` re-sent to a restarted master or
//! a new leader would be acknowledged for a put that master never saw).
//! The master's address comes from a [`MasterLocator`]: fixed, or the HA
//! leader found through etcd (the pool is emptied when the leader changes,
//! and connections in use are shut down so no call waits for the old one).
//! A client of a tenant other than `default` names it on every new
//! connection, right after the handshake.

use crate::master::discovery::MasterLocator;
use mooncake_common::framing::{self, client_handshake, Service, MAX_CONTROL_FRAME};
use mooncake_common::limits::peer_closed;
use mooncake_common::proto::{encode_request, MasterRequest, MasterResponse};
use mooncake_common::spin_read;
use mooncake_common::{AuthKey, ErrorCode};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// RPC timeout for one request.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// A pooled connection idle longer than this is closed, not reused (well
/// inside the master's default idle timeout of 60 s).
const POOL_IDLE_MAX: Duration = Duration::from_secs(30);

/// Connection pool to the master.
pub(crate) struct MasterConn {
    locator: Arc<MasterLocator>,
    connect_timeout: Duration,
    key: Option<AuthKey>,
    idle: Mutex<Vec<(TcpStream, Instant)>>,
    /// HA only: connections with a call in flight (and other long-lived
    /// ones: heartbeat, ledger stream), shut down when the leader changes so
    /// that nothing waits for a deposed or unreachable leader.
    tracked: Mutex<HashMap<u64, TcpStream>>,
    next_tracked: AtomicU64,
    /// Bumped by every [`MasterConn::reset`]: a connection taken from the
    /// pool before a reset but tracked after it is shut down too.
    generation: AtomicU64,
    /// The client's tenant, unless it is `default`.
    tenant: Option<String>,
    /// The master said all tenants share one namespace (warned once).
    tenant_shared: std::sync::atomic::AtomicBool,
}

/// A tracked connection; untracked when dropped.
pub(crate) struct Tracked<'a> {
    conn: &'a MasterConn,
    id: u64,
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        if self.id != 0 {
            self.conn.tracked.lock().remove(&self.id);
        }
    }
}

impl MasterConn {
    /// A pool for the master `locator` points at, authenticating with the
    /// cluster token `key`; nothing is connected yet.
    pub(crate) fn new(
        locator: Arc<MasterLocator>,
        connect_timeout: Duration,
        key: Option<AuthKey>,
    ) -> Self {
        MasterConn {
            locator,
            connect_timeout,
            key,
            idle: Mutex::new(Vec::new()),
            tracked: Mutex::new(HashMap::new()),
            next_tracked: AtomicU64::new(1),
            generation: AtomicU64::new(0),
            tenant: None,
            tenant_shared: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Act for `tenant` (empty or `default`: the default tenant).
    pub(crate) fn with_tenant(mut self, tenant: &str) -> Self {
        self.tenant = (!tenant.is_empty() && tenant != crate::config::DEFAULT_TENANT)
            .then(|| tenant.to_string());
        self
    }

    /// Name the client's tenant on a new connection.
    fn name_tenant(&self, s: &mut TcpStream) -> io::Result<()> {
        let Some(t) = &self.tenant else {
            return Ok(());
        };
        let req = MasterRequest::Tenant {
            tenant_id: t.clone(),
        };
        match Self::call_on(s, &req)? {
            MasterResponse::Count(1) => Ok(()),
            MasterResponse::Count(_) => {
                if !self.tenant_shared.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        tenant_id = %t,
                        "tenant_id has no effect: the master runs without --enable_multi_tenants, \
                         so every tenant's objects share one namespace and no quota applies"
                    );
                }
                Ok(())
            }
            MasterResponse::Err(e) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the master refused tenant_id {t:?}: {e}"),
            )),
            other => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected answer to the tenant: {other:?}"),
            )),
        }
    }

    /// The locator (to follow leader changes).
    pub(crate) fn locator(&self) -> &Arc<MasterLocator> {
        &self.locator
    }

    /// Drop every pooled connection (the master changed).
    pub(crate) fn reset(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.idle.lock().clear();
        for (_, s) in self.tracked.lock().drain() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Track `s` until the guard drops (HA mode only; no cost otherwise):
    /// a leader change shuts it down, so a blocked read returns at once.
    pub(crate) fn track(&self, s: &TcpStream) -> Tracked<'_> {
        if !self.locator.is_ha() {
            return Tracked { conn: self, id: 0 };
        }
        let id = self.next_tracked.fetch_add(1, Ordering::Relaxed);
        if let Ok(c) = s.try_clone() {
            self.tracked.lock().insert(id, c);
        }
        Tracked { conn: self, id }
    }

    fn resolve(&self) -> io::Result<SocketAddr> {
        let addr = self
            .locator
            .current()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no master leader known"))?;
        addr.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "cannot resolve master address")
        })
    }

    /// Open a new connection (handshake included).
    pub(crate) fn connect(&self) -> io::Result<TcpStream> {
        let addr = self.resolve()?;
        self.open(TcpStream::connect_timeout(&addr, self.connect_timeout)?)
    }

    /// Make a freshly connected `s` a master connection: socket options,
    /// handshake, tenant.
    fn open(&self, mut s: TcpStream) -> io::Result<TcpStream> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(RPC_TIMEOUT))?;
        s.set_write_timeout(Some(RPC_TIMEOUT))?;
        client_handshake(&mut s, Service::Master, self.key.as_ref())?;
        self.name_tenant(&mut s)?;
        Ok(s)
    }

    /// A TCP socket created ahead of need (not yet connected), so that the
    /// heartbeat can reconnect even when the process has no descriptor
    /// left to create one.
    pub(crate) fn spare_socket(&self) -> io::Result<socket2::Socket> {
        let addr = self.resolve()?;
        // socket2 creates it close-on-exec.
        socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
    }

    /// Connect a socket from [`MasterConn::spare_socket`] (handshake included).
    pub(crate) fn connect_spare(&self, sock: socket2::Socket) -> io::Result<TcpStream> {
        let addr = self.resolve()?;
        sock.connect_timeout(&addr.into(), self.connect_timeout)?;
        self.open(sock.into())
    }

    /// Try to connect until `deadline`, retrying refused connections.
    pub(crate) fn connect_with_retry(&self, total: Duration) -> io::Result<TcpStream> {
        let start = std::time::Instant::now();
        loop {
            match self.connect() {
                Ok(s) => return Ok(s),
                Err(e) => {
                    // A refused token does not get better by retrying.
                    if start.elapsed() >= total || e.kind() == io::ErrorKind::PermissionDenied {
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Put a connection into the pool.
    pub(crate) fn give(&self, s: TcpStream) {
        let mut g = self.idle.lock();
        if g.len() < 16 {
            g.push((s, Instant::now()));
        }
    }

    /// A pooled connection that is still usable, if any.
    fn pooled(&self) -> Option<TcpStream> {
        loop {
            let (s, since) = self.idle.lock().pop()?;
            // Always asked (one poll): a connection the master closed must
            // not carry a request that then could not be safely re-sent.
            if since.elapsed() < POOL_IDLE_MAX && !peer_closed(&s) {
                return Some(s);
            }
        }
    }

    /// One request/response on a given stream: the request goes out in one
    /// `write`, and a small response comes back in one `read`, polled briefly
    /// before blocking (see [`spin_read::spin_budget`]).
    pub(crate) fn call_on(s: &mut TcpStream, req: &MasterRequest) -> io::Result<MasterResponse> {
        Self::call_on_with(s, req, &[])
    }

    /// [`MasterConn::call_on`] with finished read tickets riding along.
    pub(crate) fn call_on_with(
        s: &mut TcpStream,
        req: &MasterRequest,
        done: &[u64],
    ) -> io::Result<MasterResponse> {
        let buf = Self::send(s, req, done)?;
        Self::receive(s, buf)
    }

    /// Write one request frame; returns the buffer for the answer.
    fn send(s: &mut TcpStream, req: &MasterRequest, done: &[u64]) -> io::Result<Vec<u8>> {
        let buf = encode_request(req, done)?;
        s.write_all(&buf)?;
        Ok(buf)
    }

    /// Read one response frame (reusing `buf`).
    fn receive(s: &mut TcpStream, mut buf: Vec<u8>) -> io::Result<MasterResponse> {
        // Strict request/response: nothing follows this response, so a
        // larger first read cannot take bytes of another frame.
        buf.clear();
        buf.resize(4096, 0);
        let mut have = 0usize;
        let spin = spin_read::spin_budget();
        while have < 4 {
            let n = spin_read::recv_spin_then_block(s.as_raw_fd(), &mut buf[have..], spin)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            have += n;
        }
        let mut len = [0u8; 4];
        len.copy_from_slice(&buf[..4]);
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_CONTROL_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame of {len} bytes exceeds limit"),
            ));
        }
        let total = 4 + len;
        if have > total {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "unexpected bytes after the response",
            ));
        }
        // Memory for a large answer is committed as its bytes arrive, not
        // on the length prefix's word.
        buf.truncate(have);
        let want = (total - have) as u64;
        let got = Read::by_ref(s).take(want).read_to_end(&mut buf)?;
        if got as u64 != want {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        framing::decode(&buf[4..total])
    }

    /// Send a request; transport errors become RPC_FAIL.
    pub(crate) fn call(&self, req: &MasterRequest) -> Result<MasterResponse, ErrorCode> {
        self.call_with_done(req, &[])
    }

    /// Send a request with finished read tickets riding along. A pooled
    /// connection whose write fails as dead (the master restarted since it
    /// was last used) is replaced by a fresh one once: a request whose
    /// write failed was not read by any master. Once the request is out, a
    /// failure is RPC_FAIL and it is never re-sent: the master may have
    /// acted on it (an acknowledgment for a `PutEnd` re-sent to a master
    /// that never saw the put would report a write nobody recorded).
    pub(crate) fn call_with_done(
        &self,
        req: &MasterRequest,
        done: &[u64],
    ) -> Result<MasterResponse, ErrorCode> {
        let mut generation = self.generation.load(Ordering::Acquire);
        let (mut s, mut pooled) = match self.pooled() {
            Some(s) => (s, true),
            None => (self.connect_or_fail()?, false),
        };
        // One replacement connection at most, and only before anything
        // was sent on the first one.
        let mut replaced = false;
        loop {
            let guard = self.track(&s);
            let now = self.generation.load(Ordering::Acquire);
            if now != generation && !replaced {
                // The leader changed while this connection was being taken
                // (after the reset that shuts tracked ones down): it may
                // point at the old leader. Nothing was sent on it yet.
                drop(guard);
                generation = now;
                s = self.connect_or_fail()?;
                pooled = false;
                replaced = true;
                continue;
            }
            let r = match Self::send(&mut s, req, done) {
                Ok(buf) => Self::receive(&mut s, buf),
                Err(e) if pooled && !replaced && is_dead_peer(&e) => {
                    drop(guard);
                    self.idle.lock().clear();
                    s = self.connect_or_fail()?;
                    pooled = false;
                    replaced = true;
                    continue;
                }
                Err(e) => Err(e),
            };
            drop(guard);
            match r {
                // A standby (or a deposed leader) closes the connection after this.
                Ok(resp @ MasterResponse::Err(ErrorCode::UnavailableInCurrentStatus)) => {
                    return Ok(resp)
                }
                Ok(resp) => {
                    self.give(s);
                    return Ok(resp);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "master rpc failed");
                    self.idle.lock().clear();
                    return Err(ErrorCode::RpcFail);
                }
            }
        }
    }

    fn connect_or_fail(&self) -> Result<TcpStream, ErrorCode> {
        self.connect().map_err(|e| {
            if e.kind() == io::ErrorKind::PermissionDenied {
                tracing::warn!(error = %e, "master refused the connection");
            }
            ErrorCode::RpcFail
        })
    }
}

/// Whether a write error `e` says the peer of a pooled connection is gone
/// (closed or reset), rather than slow.
fn is_dead_peer(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}
