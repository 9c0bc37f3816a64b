//! The per-client data server: serves reads and writes of byte ranges of
//! this client's segment over TCP, one thread per connection (blocking IO,
//! no busy polling). Malformed requests drop the connection; the server
//! keeps serving everyone else.

use crate::data_proto::{RequestHeader, OP_READ};
use crate::segment::Segment;
use crate::sockio::{iov, send_all, sendfile_all, IOV_MAX};
use mooncake_common::framing::{server_handshake, Service};
use mooncake_common::spin_read::SpinReader;
use mooncake_common::ErrorCode;
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A running data server; [`DataServer::stop`] closes the listener and every connection.
pub struct DataServer {
    addr: std::net::SocketAddr,
    stopped: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl DataServer {
    /// Serve `segment` (may be None for a pure client) on an already bound listener.
    pub fn start(listener: TcpListener, segment: Option<Arc<Segment>>) -> io::Result<DataServer> {
        let addr = listener.local_addr()?;
        let stopped = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let st = Arc::clone(&stopped);
        let cs = Arc::clone(&conns);
        std::thread::Builder::new()
            .name("mc-data-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if st.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(sock) = conn else { continue };
                    let _ = sock.set_nodelay(true);
                    if let Ok(c) = sock.try_clone() {
                        let mut g = cs.lock();
                        g.retain(|s| s.peer_addr().is_ok());
                        g.push(c);
                    }
                    let seg = segment.clone();
                    let _ = std::thread::Builder::new()
                        .name("mc-data-conn".into())
                        .spawn(move || {
                            let closer = sock.try_clone();
                            let r = serve_conn(sock, seg);
                            // The server keeps a clone for stop(); shut the
                            // socket down so the peer sees the drop now.
                            if let Ok(c) = closer {
                                let _ = c.shutdown(Shutdown::Both);
                            }
                            if let Err(e) = r {
                                if e.kind() != io::ErrorKind::UnexpectedEof {
                                    tracing::info!(error = %e, "data connection dropped");
                                }
                            }
                        });
                }
            })?;
        Ok(DataServer {
            addr,
            stopped,
            conns,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Stop accepting and close all open connections.
    pub fn stop(&self) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = TcpStream::connect(self.addr);
        for c in self.conns.lock().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for DataServer {
    fn drop(&mut self) {
        self.stop();
    }
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

fn serve_conn(mut sock: TcpStream, seg: Option<Arc<Segment>>) -> io::Result<()> {
    server_handshake(&mut sock, Service::Data)?;
    let mut rd = io::BufReader::with_capacity(64 << 10, SpinReader::new(sock.try_clone()?));
    let mut stage: Vec<u8> = Vec::with_capacity(STAGE_BYTES);
    loop {
        let h = RequestHeader::read_from(&mut rd)?;
        let seg = match &seg {
            Some(s) if s.uuid() == h.uuid => s,
            _ => {
                sock.write_all(&ErrorCode::SegmentNotFound.code().to_le_bytes())?;
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
                sock.write_all(&ErrorCode::InvalidParams.code().to_le_bytes())?;
                continue;
            }
            send_ranges(&sock, seg, &h.ranges, &mut stage)?;
        } else {
            if !valid {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "write out of range",
                ));
            }
            for (o, l) in &h.ranges {
                // SAFETY: range checked against the segment above.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(seg.base().add(*o as usize), *l as usize)
                };
                rd.read_exact(dst)?;
            }
            sock.write_all(&0i32.to_le_bytes())?;
        }
    }
}
