//! Same-host mapping: the owner of a segment answers on an abstract Unix
//! socket (`\0mooncake-seg-<uuid>`) with the segment's memfd (SCM_RIGHTS);
//! readers on the same host map it once and then copy with `memcpy`.
//!
//! The owner serves each request on its own short-lived thread (at most
//! [`MAX_MAPPING_CONNS`] at once, each with [`MAPPING_TIMEOUT`] to finish)
//! and closes the connection after answering, so idle or hostile local
//! connections can neither stall readers nor pile up descriptors.
//! Readers learn that the owner is gone from a liveness pipe: the owner
//! keeps the write end and hands each reader a read end with the memfd;
//! the read end hangs up when the owner exits or stops serving.
//!
//! Request and answer:
//!
//! ```text
//! reader -> owner: uuid_len u8 | uuid | has_key u8 | nonce_r [32]
//! owner -> reader: status u8 (0 go, 1 prove the token, 2 refused) | nonce_o [32]
//! (status 1:) reader -> owner: MAC(map reader, uuid, nonce_o, nonce_r) [32]
//! owner -> reader: size u64 | MAC(map owner, uuid, nonce_r, nonce_o) or zeros [32]
//!                  + SCM_RIGHTS [memfd, liveness pipe read end]
//! ```
//!
//! A reader holding a token refuses an owner that does not ask for it.

use crate::net::sockio::{recv_with_fds, send_with_fds};
use crate::segment::Segment;
use mooncake_common::auth::{self, AuthKey, Nonce, TAG_LEN};
use mooncake_common::limits::{accept_until, ConnLimits, ConnTracker};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Time one mapping request has to complete, on either side.
pub const MAPPING_TIMEOUT: Duration = Duration::from_secs(2);
/// Most mapping requests an owner serves at once.
pub const MAX_MAPPING_CONNS: usize = 64;

const STATUS_GO: u8 = 0;
const STATUS_PROVE: u8 = 1;
const STATUS_REFUSED: u8 = 2;

/// The abstract socket name for a segment (without the leading NUL).
pub fn socket_name(uuid: &str) -> String {
    format!("mooncake-seg-{uuid}")
}

/// Owner side: answers mapping requests for one segment.
pub struct MappingServer {
    name: String,
    stopped: Arc<AtomicBool>,
    /// Write end of the liveness pipe; dropping it tells every reader.
    alive_w: Mutex<Option<OwnedFd>>,
}

impl MappingServer {
    /// Listen on the segment's abstract socket; with `key`, readers must
    /// prove the cluster token.
    pub fn start(seg: Arc<Segment>, key: Option<AuthKey>) -> io::Result<MappingServer> {
        let name = socket_name(seg.uuid());
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        let (alive_r, alive_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let stopped = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stopped);
        let tracker = ConnTracker::new(ConnLimits {
            max_total: MAX_MAPPING_CONNS,
            max_per_peer: MAX_MAPPING_CONNS,
            idle_timeout: Some(MAPPING_TIMEOUT),
        });
        let alive_r = Arc::new(alive_r);
        std::thread::Builder::new()
            .name("mc-shm-accept".into())
            .spawn(move || {
                let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
                accept_until(
                    "mapping server",
                    || st.load(Ordering::Acquire),
                    || listener.accept(),
                    |(c, _)| {
                        let Ok(permit) = tracker.try_acquire(local) else {
                            tracing::info!("mapping server busy; refusing a request");
                            return;
                        };
                        let (seg, key, alive_r) =
                            (Arc::clone(&seg), key.clone(), Arc::clone(&alive_r));
                        let spawned = std::thread::Builder::new()
                            .name("mc-shm-answer".into())
                            .spawn(move || {
                                if let Err(e) = answer(&c, &seg, key.as_ref(), &alive_r) {
                                    tracing::info!(error = %e, "same-host mapping request refused");
                                }
                                drop(c);
                                drop(permit);
                            });
                        if let Err(e) = spawned {
                            tracing::warn!(error = %e, "cannot spawn a mapping thread");
                        }
                    },
                );
            })?;
        Ok(MappingServer {
            name,
            stopped,
            alive_w: Mutex::new(Some(alive_w)),
        })
    }

    /// Stop answering; mapped readers see the owner go.
    pub fn stop(&self) {
        drop(self.alive_w.lock().take());
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

fn refused(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg.to_string())
}

/// Owner side of one request.
fn answer(
    c: &UnixStream,
    seg: &Segment,
    key: Option<&AuthKey>,
    alive_r: &OwnedFd,
) -> io::Result<()> {
    let mut c = c;
    c.set_read_timeout(Some(MAPPING_TIMEOUT))?;
    c.set_write_timeout(Some(MAPPING_TIMEOUT))?;
    let mut len = [0u8; 1];
    c.read_exact(&mut len)?;
    let mut req = vec![0u8; usize::from(len[0]) + 1 + TAG_LEN];
    c.read_exact(&mut req)?;
    let (uuid, rest) = req.split_at(usize::from(len[0]));
    let mut nonce_r: Nonce = [0u8; TAG_LEN];
    nonce_r.copy_from_slice(&rest[1..]);
    let nonce_o = auth::nonce();
    let mut reply = [0u8; 1 + TAG_LEN];
    reply[1..].copy_from_slice(&nonce_o);
    if uuid != seg.uuid().as_bytes() {
        reply[0] = STATUS_REFUSED;
        c.write_all(&reply)?;
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "segment uuid mismatch",
        ));
    }
    reply[0] = if key.is_some() {
        STATUS_PROVE
    } else {
        STATUS_GO
    };
    c.write_all(&reply)?;
    let mut final_msg = [0u8; 8 + TAG_LEN];
    final_msg[..8].copy_from_slice(&seg.size().to_le_bytes());
    if let Some(k) = key {
        let mut proof = [0u8; TAG_LEN];
        c.read_exact(&mut proof)?;
        if !k.verify(auth::DOMAIN_MAP_READER, &[uuid, &nonce_o, &nonce_r], &proof) {
            return Err(refused("reader failed to prove the cluster token"));
        }
        final_msg[8..].copy_from_slice(&k.mac(auth::DOMAIN_MAP_OWNER, &[uuid, &nonce_r, &nonce_o]));
    }
    send_with_fds(c, &final_msg, &[seg.fd().as_raw_fd(), alive_r.as_raw_fd()])
}

/// Reader side: connect to the owner and map its segment (proving the
/// cluster token `key` when the owner asks for it).
pub fn map_remote(
    socket: &str,
    uuid: &str,
    expected_size: u64,
    key: Option<&AuthKey>,
) -> io::Result<Mapping> {
    let u = uuid.as_bytes();
    let ulen = u8::try_from(u.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment uuid too long"))?;
    let addr = SocketAddr::from_abstract_name(socket.as_bytes())?;
    let mut c = UnixStream::connect_addr(&addr)?;
    c.set_read_timeout(Some(MAPPING_TIMEOUT))?;
    c.set_write_timeout(Some(MAPPING_TIMEOUT))?;
    let nonce_r = auth::nonce();
    let mut req = Vec::with_capacity(2 + u.len() + TAG_LEN);
    req.push(ulen);
    req.extend_from_slice(u);
    req.push(u8::from(key.is_some()));
    req.extend_from_slice(&nonce_r);
    c.write_all(&req)?;
    let mut status = [0u8; 1 + TAG_LEN];
    c.read_exact(&mut status)?;
    let nonce_o = &status[1..];
    match (status[0], key) {
        (STATUS_GO, None) => {}
        (STATUS_PROVE, Some(k)) => {
            c.write_all(&k.mac(auth::DOMAIN_MAP_READER, &[u, nonce_o, &nonce_r]))?;
        }
        (STATUS_PROVE, None) => {
            return Err(refused("the segment owner requires the cluster token"));
        }
        (STATUS_GO, Some(_)) => {
            return Err(refused(
                "the segment owner has no cluster token but this process has one",
            ));
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "owner refused the request",
            ))
        }
    }
    let mut final_msg = [0u8; 8 + TAG_LEN];
    let (n, mut fds) = recv_with_fds::<2>(&c, &mut final_msg)?;
    if n < final_msg.len() {
        c.read_exact(&mut final_msg[n..])?;
    }
    if let Some(k) = key {
        if !k.verify(
            auth::DOMAIN_MAP_OWNER,
            &[u, &nonce_r, nonce_o],
            &final_msg[8..],
        ) {
            return Err(refused(
                "the segment owner failed to prove the cluster token",
            ));
        }
    }
    if fds.len() != 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "owner sent no segment descriptor",
        ));
    }
    let alive = fds
        .pop()
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidData))?;
    let file = File::from(
        fds.pop()
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidData))?,
    );
    let mut sz = [0u8; 8];
    sz.copy_from_slice(&final_msg[..8]);
    let size = u64::from_le_bytes(sz);
    if size != expected_size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("segment size mismatch: owner says {size}, master says {expected_size}"),
        ));
    }
    let seg = Segment::from_fd(uuid.to_string(), file, size)?;
    Ok(Mapping { seg, alive })
}

/// A mapped peer segment plus the liveness pipe that tells whether its owner lives.
pub struct Mapping {
    seg: Arc<Segment>,
    alive: OwnedFd,
}

impl Mapping {
    /// Whether the owner still holds the write end of the liveness pipe.
    pub fn owner_alive(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.alive.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        r == 0
    }

    /// The mapped segment.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.seg
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

    /// Get (or create, proving `key` when the owner asks) the mapping.
    /// `on_new` runs when a mapping is created.
    pub fn get(
        &self,
        uuid: &str,
        socket: &str,
        size: u64,
        key: Option<&AuthKey>,
        on_new: impl FnOnce(),
    ) -> MapLookup {
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
        // Mappings of segments whose owner stopped serving them (the store
        // closed or its process ended) are dropped before a new one is
        // made: otherwise a long-lived reader would keep every dead
        // segment's memory in use (a segment is only looked up again while
        // it is alive, so its own lookup would never drop it).
        self.sweep_dead();
        match map_remote(socket, uuid, size, key) {
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

    /// Drop every mapping whose owner is gone.
    pub fn sweep_dead(&self) {
        self.maps.lock().retain(|_, m| m.owner_alive());
    }

    /// How many segments are mapped.
    pub fn len(&self) -> usize {
        self.maps.lock().len()
    }

    /// Whether no segment is mapped.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
