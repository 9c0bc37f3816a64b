//! Blocking RPC to the master over a small pool of connections. A broken
//! connection is dropped and the call fails with RPC_FAIL; the next call
//! reconnects (with a short timeout, so calls during an outage fail fast).
//! A pooled connection idle longer than [`POOL_IDLE_MAX`], or closed by the
//! master meanwhile (its idle timeout), is not reused.

use mooncake_common::framing::{self, client_handshake, Service, MAX_CONTROL_FRAME};
use mooncake_common::limits::reusable;
use mooncake_common::proto::{encode_request, MasterRequest, MasterResponse};
use mooncake_common::spin_read;
use mooncake_common::{AuthKey, ErrorCode};
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// RPC timeout for one request.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// A pooled connection idle longer than this is closed, not reused (well
/// inside the master's default idle timeout of 60 s).
const POOL_IDLE_MAX: Duration = Duration::from_secs(30);

/// Connection pool to one master address.
pub(crate) struct MasterConn {
    addr: String,
    connect_timeout: Duration,
    key: Option<AuthKey>,
    idle: Mutex<Vec<(TcpStream, Instant)>>,
}

impl MasterConn {
    /// A pool for `addr` (`host:port`), authenticating with the cluster
    /// token `key`; nothing is connected yet.
    pub(crate) fn new(addr: &str, connect_timeout: Duration, key: Option<AuthKey>) -> Self {
        MasterConn {
            addr: addr.to_string(),
            connect_timeout,
            key,
            idle: Mutex::new(Vec::new()),
        }
    }

    fn resolve(&self) -> io::Result<SocketAddr> {
        self.addr.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "cannot resolve master address")
        })
    }

    /// Open a new connection (handshake included).
    pub(crate) fn connect(&self) -> io::Result<TcpStream> {
        let addr = self.resolve()?;
        let mut s = TcpStream::connect_timeout(&addr, self.connect_timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(RPC_TIMEOUT))?;
        s.set_write_timeout(Some(RPC_TIMEOUT))?;
        client_handshake(&mut s, Service::Master, self.key.as_ref())?;
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
        let mut s: TcpStream = sock.into();
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(RPC_TIMEOUT))?;
        s.set_write_timeout(Some(RPC_TIMEOUT))?;
        client_handshake(&mut s, Service::Master, self.key.as_ref())?;
        Ok(s)
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
            if reusable(&s, since, POOL_IDLE_MAX) {
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
        let mut buf = encode_request(req, done)?;
        s.write_all(&buf)?;
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

    /// Send a request with finished read tickets riding along.
    pub(crate) fn call_with_done(
        &self,
        req: &MasterRequest,
        done: &[u64],
    ) -> Result<MasterResponse, ErrorCode> {
        let mut s = match self.pooled() {
            Some(s) => s,
            None => self.connect().map_err(|e| {
                if e.kind() == io::ErrorKind::PermissionDenied {
                    tracing::warn!(error = %e, "master refused the connection");
                }
                ErrorCode::RpcFail
            })?,
        };
        match Self::call_on_with(&mut s, req, done) {
            Ok(resp) => {
                self.give(s);
                Ok(resp)
            }
            Err(e) => {
                tracing::warn!(error = %e, "master rpc failed");
                self.idle.lock().clear();
                Err(ErrorCode::RpcFail)
            }
        }
    }
}
