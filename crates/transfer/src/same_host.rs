//! Same-host mapping: the owner of a segment answers on an abstract Unix
//! socket (`\0mooncake-seg-<uuid>`) with the segment's memfd (SCM_RIGHTS);
//! readers on the same host map it once and then copy with `memcpy`.

use crate::segment::Segment;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The abstract socket name for a segment (without the leading NUL).
pub fn socket_name(uuid: &str) -> String {
    format!("mooncake-seg-{uuid}")
}

/// Owner side: answers mapping requests for one segment.
pub struct MappingServer {
    name: String,
    stopped: Arc<AtomicBool>,
}

impl MappingServer {
    /// Listen on the segment's abstract socket.
    pub fn start(seg: Arc<Segment>) -> io::Result<MappingServer> {
        let name = socket_name(seg.uuid());
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        let stopped = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stopped);
        std::thread::Builder::new()
            .name("mc-shm-accept".into())
            .spawn(move || {
                // Connections of mapped readers stay open: when this process
                // dies or stops serving, readers see the hang-up and drop the mapping.
                let mut held: Vec<UnixStream> = Vec::new();
                for conn in listener.incoming() {
                    if st.load(Ordering::Acquire) {
                        break;
                    }
                    if let Ok(c) = conn {
                        match answer(&c, &seg) {
                            Ok(()) => held.push(c),
                            Err(e) => {
                                tracing::info!(error = %e, "same-host mapping request refused")
                            }
                        }
                    }
                }
                drop(held);
            })?;
        Ok(MappingServer { name, stopped })
    }

    /// Stop answering.
    pub fn stop(&self) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(addr) = SocketAddr::from_abstract_name(self.name.as_bytes()) {
            let _ = UnixStream::connect_addr(&addr);
        }
    }
}

impl Drop for MappingServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn answer(c: &UnixStream, seg: &Segment) -> io::Result<()> {
    let mut c = c;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut len = [0u8; 1];
    c.read_exact(&mut len)?;
    let mut uuid = vec![0u8; len[0] as usize];
    c.read_exact(&mut uuid)?;
    if uuid != seg.uuid().as_bytes() {
        c.write_all(&0u64.to_le_bytes())?;
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "segment uuid mismatch",
        ));
    }
    let size = seg.size().to_le_bytes();
    let fds = [seg.fd().as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(
        c.as_raw_fd(),
        &[IoSlice::new(&size)],
        &cmsg,
        MsgFlags::empty(),
        None,
    )
    .map_err(io::Error::from)?;
    Ok(())
}

/// Reader side: connect to the owner and map its segment.
pub fn map_remote(socket: &str, uuid: &str, expected_size: u64) -> io::Result<Mapping> {
    let addr = SocketAddr::from_abstract_name(socket.as_bytes())?;
    let mut c = UnixStream::connect_addr(&addr)?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut req = vec![uuid.len() as u8];
    req.extend_from_slice(uuid.as_bytes());
    c.write_all(&req)?;
    let mut size = [0u8; 8];
    let mut cmsg_buf = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut size)];
    let msg = recvmsg::<()>(
        c.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg_buf),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let mut fd = None;
    for cm in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(v) = cm {
            fd = v.first().copied();
        }
    }
    let fd = fd.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no fd received"))?;
    // SAFETY: the fd was just received via SCM_RIGHTS and is owned by us.
    let file = unsafe { File::from_raw_fd(fd) };
    let size = u64::from_le_bytes(size);
    if size != expected_size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("segment size mismatch: owner says {size}, master says {expected_size}"),
        ));
    }
    let seg = Segment::from_fd(uuid.to_string(), file, size)?;
    Ok(Mapping { seg, ctl: c })
}

/// A mapped peer segment plus the control connection that tells whether its owner lives.
pub struct Mapping {
    seg: Arc<Segment>,
    ctl: UnixStream,
}

impl Mapping {
    /// Whether the owner still holds its end of the control connection.
    pub fn owner_alive(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.ctl.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        r == 0
    }
}

/// Outcome of looking up a same-host mapping.
pub enum MapLookup {
    /// Copy through this mapping.
    Mapped(Arc<Segment>),
    /// Use TCP for this segment.
    UseTcp,
    /// The owner is gone.
    OwnerDead,
}

/// Process-wide cache of mapped peer segments and of segments that must use TCP.
#[derive(Default)]
pub struct MappingCache {
    maps: Mutex<HashMap<String, Arc<Mapping>>>,
    tcp_only: Mutex<HashSet<String>>,
}

impl MappingCache {
    /// The process-wide cache.
    pub fn global() -> &'static MappingCache {
        static C: OnceLock<MappingCache> = OnceLock::new();
        C.get_or_init(MappingCache::default)
    }

    /// Get (or create) the mapping; None means use TCP. `on_new` runs when a mapping is created.
    pub fn get(&self, uuid: &str, socket: &str, size: u64, on_new: impl FnOnce()) -> MapLookup {
        let cached = self.maps.lock().get(uuid).cloned();
        if let Some(m) = cached {
            if m.owner_alive() {
                return MapLookup::Mapped(Arc::clone(&m.seg));
            }
            self.invalidate(uuid);
            return MapLookup::OwnerDead;
        }
        if self.tcp_only.lock().contains(uuid) {
            return MapLookup::UseTcp;
        }
        match map_remote(socket, uuid, size) {
            Ok(m) => {
                on_new();
                let seg = Arc::clone(&m.seg);
                self.maps.lock().insert(uuid.to_string(), Arc::new(m));
                MapLookup::Mapped(seg)
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                // Nobody listens here: the owner is gone, or lives in another
                // network namespace. TCP decides which; don't cache.
                MapLookup::UseTcp
            }
            Err(e) => {
                tracing::info!(segment = uuid, error = %e, "same-host mapping unavailable, using TCP");
                self.tcp_only.lock().insert(uuid.to_string());
                MapLookup::UseTcp
            }
        }
    }

    /// Drop a mapping (segment unmounted or owner gone).
    pub fn invalidate(&self, uuid: &str) {
        self.maps.lock().remove(uuid);
    }

    /// Keep only mappings whose uuid is in `live`.
    pub fn retain(&self, live: &HashSet<String>) {
        self.maps.lock().retain(|k, _| live.contains(k));
    }
}
