//! Blocking RPC to the master over a small pool of connections. A broken
//! connection is dropped and the call fails with RPC_FAIL; the next call
//! reconnects (with a short timeout, so calls during an outage fail fast).
//! The master's address comes from a [`MasterLocator`]: fixed, or the HA
//! leader found through etcd (the pool is emptied when the leader changes).

use crate::discovery::MasterLocator;
use mooncake_common::framing::{self, client_handshake, Service, MAX_CONTROL_FRAME};
use mooncake_common::proto::{MasterRequest, MasterResponse};
use mooncake_common::spin_read;
use mooncake_common::ErrorCode;
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

/// RPC timeout for one request.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// Connection pool to the master.
pub struct MasterConn {
    locator: Arc<MasterLocator>,
    connect_timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
}

impl MasterConn {
    /// A pool for the master `locator` points at; nothing is connected yet.
    pub(crate) fn new(locator: Arc<MasterLocator>, connect_timeout: Duration) -> Self {
        MasterConn {
            locator,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The locator (to follow leader changes).
    pub(crate) fn locator(&self) -> &Arc<MasterLocator> {
        &self.locator
    }

    /// Drop every pooled connection (the master changed).
    pub(crate) fn reset(&self) {
        self.idle.lock().clear();
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
    pub fn connect(&self) -> io::Result<TcpStream> {
        let addr = self.resolve()?;
        let mut s = TcpStream::connect_timeout(&addr, self.connect_timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(RPC_TIMEOUT))?;
        s.set_write_timeout(Some(RPC_TIMEOUT))?;
        client_handshake(&mut s, Service::Master)?;
        Ok(s)
    }

    /// Try to connect until `deadline`, retrying refused connections.
    pub fn connect_with_retry(&self, total: Duration) -> io::Result<TcpStream> {
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
    pub fn give(&self, s: TcpStream) {
        let mut g = self.idle.lock();
        if g.len() < 16 {
            g.push(s);
        }
    }

    /// One request/response on a given stream: the request goes out in one
    /// `write`, and a small response comes back in one `read`, polled briefly
    /// before blocking (see [`spin_read::spin_budget`]).
    pub fn call_on(s: &mut TcpStream, req: &MasterRequest) -> io::Result<MasterResponse> {
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
    pub fn call(&self, req: &MasterRequest) -> Result<MasterResponse, ErrorCode> {
        let pooled = self.idle.lock().pop();
        let mut s = match pooled {
            Some(s) => s,
            None => self.connect().map_err(|_| ErrorCode::RpcFail)?,
        };
        match Self::call_on(&mut s, req) {
            // A standby (or a deposed leader) closes the connection after this.
            Ok(resp @ MasterResponse::Err(ErrorCode::UnavailableInCurrentStatus)) => Ok(resp),
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
