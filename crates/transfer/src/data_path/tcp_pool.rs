//! Client side of the data protocol: pooled TCP connections per peer and
//! scatter/gather read/write batches, one round trip per batch.
//!
//! Connections are pooled per peer and per cluster token
//! ([`ConnPool`]).

use crate::data_path::data_proto::{encode_header, DiskRead, OP_READ, OP_WRITE};
use crate::data_path::error::{Error, Result};
use crate::net::pool::ConnPool;
use crate::net::sockio::{iov, recv_status_then, send_all};
use crate::op::{Op, Stores};
use mooncake_common::framing::Service;
use mooncake_common::spin_read::{spin_budget, spin_until_readable};
use mooncake_common::{AuthKey, ErrorCode, WriteTicket};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::Duration;

/// Idle connections kept per peer.
const MAX_IDLE: usize = 8;
/// Socket IO timeout: a peer that stops answering fails the transfer.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// One kind of request, as its outcome is reported.
struct Request {
    /// What it is, for an I/O failure's error and log line.
    what: &'static str,
    /// The error's text when the owner refuses it.
    refused: &'static str,
    /// Whether the connection goes back to the pool after the owner
    /// refuses the request.
    reuse_refused: bool,
}

const DATA_READ: Request = Request {
    what: "data read",
    refused: "data read refused by the owner",
    reuse_refused: true,
};

const DISK_READ: Request = Request {
    what: "disk read",
    refused: "disk read refused by the owner",
    reuse_refused: true,
};

const DATA_WRITE: Request = Request {
    what: "data write",
    refused: "data write refused by the owner",
    reuse_refused: false,
};

/// Data connections to the peers' data servers, by `host:port` and
/// cluster token.
pub struct TcpPool {
    conns: ConnPool<TcpStream>,
}

impl TcpPool {
    /// The process-wide pool.
    pub fn global() -> &'static TcpPool {
        static P: OnceLock<TcpPool> = OnceLock::new();
        P.get_or_init(|| TcpPool {
            conns: ConnPool::new(MAX_IDLE),
        })
    }

    fn give(&self, endpoint: &str, key: Option<&AuthKey>, s: TcpStream) {
        self.conns.give(endpoint, key, s);
    }

    /// Whether connections to `endpoint` are paced by their congestion
    /// control (as far as this pool has seen), which decides how finely a
    /// transfer to it is split. Before the first connection: not paced, as
    /// under the default congestion rule no data connection is.
    pub fn paced(&self, endpoint: &str) -> bool {
        self.conns.link(endpoint).is_some_and(|l| l.paced)
    }

    /// Forget idle connections to a peer (it went away).
    pub fn forget(&self, endpoint: &str) {
        self.conns.forget(endpoint);
    }

    fn connect(&self, endpoint: &str, key: Option<&AuthKey>) -> Result<TcpStream> {
        self.conns
            .tcp(endpoint, Service::Data, key, IO_TIMEOUT)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::PermissionDenied {
                    tracing::warn!(peer = endpoint, error = %e, "data peer refused");
                }
                Error::io("data connection", endpoint, e)
            })
    }

    /// Read the ranges of `ops` from the peer's segment into local memory,
    /// authenticating with `key` on a new connection; with
    /// [`Stores::Streaming`] a large reply lands through a cache-sized
    /// buffer copied on with streaming stores.
    ///
    /// # Safety
    /// Every `op.local_ptr..+len` must be writable.
    pub unsafe fn read(
        &self,
        endpoint: &str,
        uuid: &str,
        ops: &[Op],
        key: Option<&AuthKey>,
        stores: Stores,
    ) -> Result<()> {
        let mut s = self.connect(endpoint, key)?;
        // SAFETY: the caller guarantees the destinations are writable.
        let r = unsafe { read_on(&mut s, uuid, ops, stores) };
        self.finish(endpoint, key, s, r, &DATA_READ)
    }

    /// Read `dst.len()` bytes of `key`'s value at `version` (from byte
    /// `offset` on) from the disk tier of the owner serving `endpoint`.
    pub fn read_disk(
        &self,
        endpoint: &str,
        key_auth: Option<&AuthKey>,
        key: &str,
        version: u64,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<()> {
        let mut s = self.connect(endpoint, key_auth)?;
        let req = DiskRead {
            key: key.to_string(),
            version,
            offset,
            len: dst.len() as u64,
        };
        let r = s
            .write_all(&req.encode())
            .and_then(|_| read_status(&mut s))
            .and_then(|code| match code {
                0 => s.read_exact(dst).map(Ok),
                code => Ok(Err(ErrorCode::from_code(code))),
            });
        self.finish(endpoint, key_auth, s, r, &DISK_READ)
    }

    /// Write local memory into the ranges of the peer's segment, under the
    /// master's `ticket` when the cluster has a token.
    ///
    /// # Safety
    /// Every `op.local_ptr..+len` must be readable.
    pub unsafe fn write(
        &self,
        endpoint: &str,
        uuid: &str,
        ops: &[Op],
        key: Option<&AuthKey>,
        ticket: Option<&WriteTicket>,
    ) -> Result<()> {
        let mut s = self.connect(endpoint, key)?;
        // SAFETY: the caller guarantees the sources are readable.
        let r = unsafe { write_on(&mut s, uuid, ops, ticket) };
        self.finish(endpoint, key, s, r, &DATA_WRITE)
    }

    /// The end of one `req` on `s`: done, or refused by the owner (the
    /// connection goes back to the pool, after a refusal only when
    /// `req.reuse_refused`), or an I/O failure (the connection is dropped
    /// with the peer's idle ones).
    fn finish(
        &self,
        endpoint: &str,
        key: Option<&AuthKey>,
        s: TcpStream,
        r: io::Result<std::result::Result<(), ErrorCode>>,
        req: &Request,
    ) -> Result<()> {
        match r {
            Ok(Ok(())) => {
                self.give(endpoint, key, s);
                Ok(())
            }
            Ok(Err(code)) => {
                if req.reuse_refused {
                    self.give(endpoint, key, s);
                }
                Err(Error::new(code, req.refused).with_peer(endpoint))
            }
            Err(e) => {
                tracing::warn!(peer = endpoint, error = %e, "{} failed", req.what);
                self.forget(endpoint);
                Err(Error::io(req.what, endpoint, e))
            }
        }
    }
}

fn header(op: u8, uuid: &str, ticket: Option<&WriteTicket>, ops: &[Op]) -> Vec<u8> {
    encode_header(op, uuid, ticket, ops.iter().map(|o| (o.seg_offset, o.len)))
}

/// iovecs over the local side of `ops`, adjacent destinations merged.
fn local_iovs(ops: &[Op]) -> Vec<libc::iovec> {
    let mut v: Vec<libc::iovec> = Vec::with_capacity(ops.len().min(1 << 16));
    for o in ops {
        if o.len == 0 {
            continue;
        }
        if let Some(last) = v.last_mut() {
            if last.iov_base as usize + last.iov_len == o.local_ptr {
                last.iov_len += o.len as usize;
                continue;
            }
        }
        v.push(iov(o.local_ptr as *const u8, o.len as usize));
    }
    v
}

fn read_status(s: &mut TcpStream) -> io::Result<i32> {
    let mut st = [0u8; 4];
    spin_until_readable(s.as_raw_fd(), spin_budget());
    s.read_exact(&mut st)?;
    Ok(i32::from_le_bytes(st))
}

/// One read request on `s`.
///
/// # Safety
/// Every `op.local_ptr..+len` must be writable.
unsafe fn read_on(
    s: &mut TcpStream,
    uuid: &str,
    ops: &[Op],
    stores: Stores,
) -> io::Result<std::result::Result<(), ErrorCode>> {
    s.write_all(&header(OP_READ, uuid, None, ops))?;
    let mut dst = local_iovs(ops);
    spin_until_readable(s.as_raw_fd(), spin_budget());
    // SAFETY: the iovecs describe the caller's writable destinations.
    let st = unsafe { recv_status_then(s.as_raw_fd(), &mut dst, stores == Stores::Streaming)? };
    if st != 0 {
        return Ok(Err(ErrorCode::from_code(st)));
    }
    Ok(Ok(()))
}

/// One write request on `s`.
///
/// # Safety
/// Every `op.local_ptr..+len` must be readable.
unsafe fn write_on(
    s: &mut TcpStream,
    uuid: &str,
    ops: &[Op],
    ticket: Option<&WriteTicket>,
) -> io::Result<std::result::Result<(), ErrorCode>> {
    let head = header(OP_WRITE, uuid, ticket, ops);
    let mut iovs = Vec::with_capacity(ops.len() + 1);
    iovs.push(iov(head.as_ptr(), head.len()));
    iovs.extend(local_iovs(ops));
    // SAFETY: the header lives until the call returns; the other iovecs
    // describe the caller's readable sources.
    unsafe { send_all(s.as_raw_fd(), &mut iovs, false)? };
    let st = read_status(s)?;
    if st != 0 {
        return Ok(Err(ErrorCode::from_code(st)));
    }
    Ok(Ok(()))
}
