//! Blocking RPC to the master over a small pool of connections. A broken
//! connection is dropped and the call fails with RPC_FAIL; the next call
//! reconnects (with a short timeout, so calls during an outage fail fast).

use mooncake_common::framing::{self, client_handshake, Service, MAX_CONTROL_FRAME};
use mooncake_common::proto::{MasterRequest, MasterResponse};
use mooncake_common::spin_read;
use mooncake_common::ErrorCode;
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// RPC timeout for one request.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// Connection pool to one master address.
pub(crate) struct MasterConn {
    addr: String,
    connect_timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
}

impl MasterConn {
    /// A pool for `addr` (`host:port`); nothing is connected yet.
    pub(crate) fn new(addr: &str, connect_timeout: Duration) -> Self {
        MasterConn {
            addr: addr.to_string(),
            connect_timeout,
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
        client_handshake(&mut s, Service::Master)?;
        Ok(s)
    }

    /// Try to connect until `deadline`, retrying refused connections.
    pub(crate) fn connect_with_retry(&self, total: Duration) -> io::Result<TcpStream> {
        let start = std::time::Instant::now();
        loop {
            match self.connect() {
                Ok(s) => return Ok(s),
                Err(e) => {
                    if start.elapsed() >= total {
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
            g.push(s);
        }
    }

    /// One request/response on a given stream: the request goes out in one
    /// `write`, and a small response comes back in one `read`, polled briefly
    /// before blocking (see [`spin_read::spin_budget`]).
    pub(crate) fn call_on(s: &mut TcpStream, req: &MasterRequest) -> io::Result<MasterResponse> {
        let mut buf = framing::encode_frame(req)?;
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
        buf.resize(total.max(have), 0);
        s.read_exact(&mut buf[have..total])?;
        framing::decode(&buf[4..total])
    }

    /// Send a request; transport errors become RPC_FAIL.
    pub(crate) fn call(&self, req: &MasterRequest) -> Result<MasterResponse, ErrorCode> {
        let pooled = self.idle.lock().pop();
        let mut s = match pooled {
            Some(s) => s,
            None => self.connect().map_err(|_| ErrorCode::RpcFail)?,
        };
        match Self::call_on(&mut s, req) {
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
