//! The per-client data server: serves reads and writes of byte ranges of
//! this client's segment over TCP, one thread per connection (blocking IO,
//! no busy polling). Malformed requests drop the connection; the server
//! keeps serving everyone else.

use crate::data_proto::{RequestHeader, OP_READ};
use crate::segment::Segment;
use mooncake_common::framing::{server_handshake, Service};
use mooncake_common::ErrorCode;
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
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

fn serve_conn(mut sock: TcpStream, seg: Option<Arc<Segment>>) -> io::Result<()> {
    server_handshake(&mut sock, Service::Data)?;
    let mut rd = io::BufReader::with_capacity(64 << 10, sock.try_clone()?);
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
            sock.write_all(&0i32.to_le_bytes())?;
            // Coalesce small ranges into one buffered write; send big ones directly.
            let mut pending: Vec<u8> = Vec::new();
            for (o, l) in &h.ranges {
                // SAFETY: range checked against the segment above.
                let src =
                    unsafe { std::slice::from_raw_parts(seg.base().add(*o as usize), *l as usize) };
                if src.len() >= (256 << 10) {
                    if !pending.is_empty() {
                        sock.write_all(&pending)?;
                        pending.clear();
                    }
                    sock.write_all(src)?;
                } else {
                    pending.extend_from_slice(src);
                    if pending.len() >= (1 << 20) {
                        sock.write_all(&pending)?;
                        pending.clear();
                    }
                }
            }
            if !pending.is_empty() {
                sock.write_all(&pending)?;
            }
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
