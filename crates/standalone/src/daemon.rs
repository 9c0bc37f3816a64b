//! The daemon's side: serves the dummy clients of this host with its own
//! store client.
//!
//! Each dummy is an entry with the regions of its shared memory mapped
//! here, the buffers it registered, and the put and get sessions it holds.
//! A request names dummy memory as (region, offset, length); the range is
//! checked against the region before the client reads or writes it in
//! place. When the dummy's control connection ends (it closed, or its
//! process died), its sessions are revoked or ended at the master, its
//! buffers unregistered and its regions unmapped (after any call still
//! using them); only then does the entry go, and the other dummies are
//! served as before.

use crate::bufs::Buf;
use crate::moves::Land;
use crate::wire::{self, Attached, Call, Control, Open, Service, WireDest, WireOutput, WireWrite};
use mooncake_client::{Client, Error, ErrorCode, Result, TensorDest, TensorWrite};
use mooncake_common::framing::server_handshake;
use mooncake_common::AuthKey;
use mooncake_tensor::{numel, ReadOutput, ReadRequest, WriteRoute};
use mooncake_transfer::Segment;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Time a new connection has for the handshake and its first frame.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// Most connections served at once (all dummies together).
const MAX_CONNS: usize = 4096;
/// How long a connection's thread polls for the dummy's next call after
/// answering one, before it blocks. A dummy issuing calls back to back
/// sends the next within a few tens of microseconds of its reply (it polls
/// for the reply, see the dummy's side); a parked thread would cost a
/// wakeup per call, tens of microseconds on a VM's idle core. Polling
/// stops early when the core is wanted (see `wire::recv_within`).
const NEXT_CALL_SPIN: Duration = Duration::from_micros(200);

/// What a daemon grants one dummy client, unless
/// `MC_STANDALONE_MAX_DUMMY_MEMORY` says otherwise: this host's memory.
fn default_grant() -> u64 {
    if let Some(v) = std::env::var("MC_STANDALONE_MAX_DUMMY_MEMORY")
        .ok()
        .and_then(|v| mooncake_common::size::parse_size(&v))
    {
        return v;
    }
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && page > 0 {
        (pages as u64).saturating_mul(page as u64)
    } else {
        u64::MAX
    }
}

/// The regions of a dummy's memory one call uses, each looked up once and
/// held until the call is done: a region the dummy unmaps meanwhile stays
/// mapped here until then.
#[derive(Default)]
struct Keep {
    held: Vec<(u64, Arc<Segment>)>,
    /// Index in `held` of the region found last (consecutive buffers of a
    /// call usually lie in one region).
    last: usize,
}

impl Keep {
    /// The held region `region`, if this call holds it.
    fn find(&mut self, region: u64) -> Option<&Arc<Segment>> {
        if self.held.get(self.last).is_none_or(|(r, _)| *r != region) {
            self.last = self.held.iter().position(|(r, _)| *r == region)?;
        }
        self.held.get(self.last).map(|(_, seg)| seg)
    }

    /// Hold `seg` as region `region` for the call.
    fn hold(&mut self, region: u64, seg: Arc<Segment>) -> &Arc<Segment> {
        self.last = self.held.len();
        self.held.push((region, seg));
        &self.held[self.last].1
    }
}

/// Map into this process's page table the pages of `[offset, offset+len)`
/// of `seg` (a range `check_range` accepted) that are in memory, and leave
/// the others alone: reading a page of shared memory nobody has written
/// would allocate and zero it, so registering a large pool the dummy has
/// not filled yet would commit all of it at once.
fn map_resident(seg: &Segment, offset: u64, len: u64) {
    /// Pages asked about per `mincore` call.
    const WINDOW: usize = 1 << 15;
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as u64,
        _ => return,
    };
    let end = offset.saturating_add(len).min(seg.size());
    let mut at = offset & !(page - 1);
    let mut resident = vec![0u8; WINDOW];
    // The start of the run of resident pages being gathered.
    let mut run: Option<u64> = None;
    while at < end {
        let pages = ((end - at).div_ceil(page) as usize).min(WINDOW);
        // SAFETY: `at` is page-aligned inside the mapping, `pages` pages
        // from it lie inside it (the last one may be partial, which mincore
        // accepts), and `resident` has a byte per page.
        let r = unsafe {
            libc::mincore(
                seg.base().add(at as usize).cast(),
                pages * page as usize,
                resident.as_mut_ptr(),
            )
        };
        if r != 0 {
            // Unknown: map the rest as a whole.
            seg.map_range(run.unwrap_or(at), end - run.unwrap_or(at));
            return;
        }
        for (i, &v) in resident[..pages].iter().enumerate() {
            let p = at + i as u64 * page;
            match (v & 1 != 0, run) {
                (true, None) => run = Some(p),
                (false, Some(start)) => {
                    seg.map_range(start, p - start);
                    run = None;
                }
                _ => {}
            }
        }
        at += pages as u64 * page;
    }
    if let Some(start) = run {
        seg.map_range(start, end - start);
    }
}

/// The keys of a dummy's open put or get sessions: ended for it when it
/// goes away.
#[derive(Default)]
struct OpenSessions(Mutex<HashSet<String>>);

impl OpenSessions {
    /// Note the keys whose session `results` says opened.
    fn opened<T>(&self, keys: &[String], results: &[Result<T>]) {
        let mut open = self.0.lock();
        for (key, r) in keys.iter().zip(results) {
            if r.is_ok() {
                open.insert(key.clone());
            }
        }
    }

    /// Forget `keys` (their sessions ended).
    fn closed(&self, keys: &[String]) {
        let mut open = self.0.lock();
        for key in keys {
            open.remove(key);
        }
    }

    /// Every open key, forgotten.
    fn drain(&self) -> Vec<String> {
        self.0.lock().drain().collect()
    }

    fn len(&self) -> usize {
        self.0.lock().len()
    }
}

/// One attached dummy client.
struct Dummy {
    id: String,
    pid: u32,
    regions: RwLock<HashMap<u64, Arc<Segment>>>,
    /// Registered buffers: address here -> region.
    buffers: Mutex<HashMap<usize, u64>>,
    put_sessions: OpenSessions,
    get_sessions: OpenSessions,
}

/// Where a zero-length, non-null caller pointer points here: never read
/// or written (nothing is copied for zero bytes), and not null.
fn dangling() -> usize {
    std::ptr::NonNull::<u8>::dangling().as_ptr() as usize
}

impl Dummy {
    /// The address here of `b`, checked against its region (mapped into
    /// this process's page table); `keep` holds the region for the call.
    fn ptr(&self, b: Buf, keep: &mut Keep) -> Result<usize> {
        self.locate(b, keep, Segment::map_range)
    }

    /// [`Dummy::ptr`] for a buffer being registered: only the pages the
    /// dummy has written are mapped here ([`map_resident`]); the rest are
    /// mapped by the first calls that use them.
    fn registered_ptr(&self, b: Buf, keep: &mut Keep) -> Result<usize> {
        self.locate(b, keep, map_resident)
    }

    /// The address here of `b`, checked against its region, after `map`
    /// was given the range.
    fn locate(&self, b: Buf, keep: &mut Keep, map: fn(&Segment, u64, u64)) -> Result<usize> {
        if b.region == 0 {
            return match (b.offset, b.len) {
                (0, _) => Ok(0),
                (1, 0) => Ok(dangling()),
                _ => Err(Error::invalid("a buffer outside shared memory")),
            };
        }
        let seg = match keep.find(b.region) {
            Some(seg) => seg,
            None => {
                let seg = self.regions.read().get(&b.region).cloned().ok_or_else(|| {
                    Error::invalid(format!(
                        "region {} of the dummy client is not mapped by the daemon",
                        b.region
                    ))
                })?;
                keep.hold(b.region, seg)
            }
        };
        if !seg.check_range(b.offset, b.len) {
            return Err(Error::invalid(format!(
                "bytes {}..+{} lie outside region {} ({} bytes)",
                b.offset,
                b.len,
                b.region,
                seg.size()
            )));
        }
        map(seg, b.offset, b.len);
        Ok(seg.base() as usize + b.offset as usize)
    }

    /// (address, length) of each buffer.
    fn pieces(&self, bufs: &[Buf], keep: &mut Keep) -> Result<Vec<(usize, u64)>> {
        bufs.iter()
            .map(|b| self.ptr(*b, keep).map(|p| (p, b.len)))
            .collect()
    }
}

/// A memory-moving call's buffers, checked against dummy `d`'s regions,
/// which `keep` holds for the call.
struct Landing<'a> {
    d: &'a Dummy,
    keep: &'a mut Keep,
}

impl Land for Landing<'_> {
    fn ptr(&mut self, b: Buf) -> Result<usize> {
        self.d.ptr(b, self.keep)
    }
}

struct Shared {
    client: Arc<Client>,
    id: String,
    key: Option<AuthKey>,
    cluster_id: String,
    grant: u64,
    port: u16,
    dummies: Mutex<HashMap<String, Arc<Dummy>>>,
    stopped: AtomicBool,
    conns: AtomicUsize,
}

/// Serves the dummy clients of this host on the abstract socket of a port.
pub struct DummyServer {
    shared: Arc<Shared>,
    accept: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl DummyServer {
    /// Listen for dummy clients of `port` (abstract socket
    /// `@mooncake-rs-client-<port>`), serving them with `client`. Fails when
    /// another daemon serves that port on this host.
    pub fn start(client: Arc<Client>, port: u16) -> io::Result<DummyServer> {
        let name = wire::socket_name(port);
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&addr).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot listen on the abstract socket @{name}: {e}"),
            )
        })?;
        let key = AuthKey::from_env()
            .map_err(|e| io::Error::other(format!("cannot load the cluster token: {e}")))?;
        let shared = Arc::new(Shared {
            client,
            id: uuid::Uuid::new_v4().to_string(),
            key,
            cluster_id: mooncake_common::ha::client_cluster_id(),
            grant: default_grant(),
            port,
            dummies: Mutex::new(HashMap::new()),
            stopped: AtomicBool::new(false),
            conns: AtomicUsize::new(0),
        });
        let sh = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("mc-dummy-accept".into())
            .spawn(move || accept_loop(sh, listener))?;
        Ok(DummyServer {
            shared,
            accept: Mutex::new(Some(accept)),
        })
    }

    /// Dummy clients attached now.
    pub fn dummies(&self) -> usize {
        self.shared.dummies.lock().len()
    }

    /// Stop accepting dummy clients and forget the attached ones (their
    /// calls fail from now on). Idempotent.
    pub fn stop(&self) {
        if self.shared.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the accept loop.
        if let Ok(addr) =
            SocketAddr::from_abstract_name(wire::socket_name(self.shared.port).as_bytes())
        {
            let _ = UnixStream::connect_addr(&addr);
        }
        if let Some(h) = self.accept.lock().take() {
            let _ = h.join();
        }
        let all: Vec<Arc<Dummy>> = self.shared.dummies.lock().drain().map(|(_, d)| d).collect();
        for d in all {
            self.shared.reclaim(&d);
        }
    }
}

impl Drop for DummyServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(sh: Arc<Shared>, listener: UnixListener) {
    for conn in listener.incoming() {
        if sh.stopped.load(Ordering::Acquire) {
            break;
        }
        let c = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "dummy client accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if sh.conns.fetch_add(1, Ordering::AcqRel) >= MAX_CONNS {
            sh.conns.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("too many dummy client connections; refusing one");
            continue;
        }
        let sh2 = Arc::clone(&sh);
        let spawned = std::thread::Builder::new()
            .name("mc-dummy-conn".into())
            .spawn(move || {
                serve(&sh2, c);
                sh2.conns.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            sh.conns.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "cannot spawn a dummy client thread");
        }
    }
}

fn serve(sh: &Arc<Shared>, mut c: UnixStream) {
    let opened = c
        .set_read_timeout(Some(OPEN_TIMEOUT))
        .and_then(|()| c.set_write_timeout(Some(OPEN_TIMEOUT)))
        .and_then(|()| server_handshake(&mut c, Service::Standalone, sh.key.as_ref()))
        .and_then(|()| wire::recv::<Open>(&mut c));
    let open = match opened {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "refused a dummy client connection");
            return;
        }
    };
    let _ = c.set_read_timeout(None);
    let _ = c.set_write_timeout(None);
    match open {
        Open::Attach {
            dummy,
            pid,
            cluster_id,
            mem_pool_size,
            local_buffer_size,
        } => {
            let asked = mem_pool_size.saturating_add(local_buffer_size);
            let refusal = if cluster_id != sh.cluster_id {
                Some(format!(
                    "this mooncake_client daemon serves cluster {:?}, the dummy client is of \
                     cluster {cluster_id:?} (MC_STORE_CLUSTER_ID)",
                    sh.cluster_id
                ))
            } else if asked > sh.grant {
                Some(format!(
                    "the dummy client asks for {asked} bytes of shared memory (mem_pool_size \
                     {mem_pool_size} + local_buffer_size {local_buffer_size}); this daemon grants \
                     at most {} bytes (MC_STANDALONE_MAX_DUMMY_MEMORY)",
                    sh.grant
                ))
            } else {
                None
            };
            if let Some(why) = refusal {
                tracing::warn!(pid, "refused a dummy client: {why}");
                let _ = wire::send(&mut c, &Err::<Attached, _>(Error::internal(why)));
                return;
            }
            let d = Arc::new(Dummy {
                id: dummy.clone(),
                pid,
                regions: RwLock::new(HashMap::new()),
                buffers: Mutex::new(HashMap::new()),
                put_sessions: OpenSessions::default(),
                get_sessions: OpenSessions::default(),
            });
            sh.dummies.lock().insert(dummy, Arc::clone(&d));
            tracing::info!(pid, "dummy client attached");
            if wire::send(&mut c, &Ok::<_, Error>(sh.attached())).is_ok() {
                control_loop(sh, &d, &mut c);
            }
            // The entry goes only once what it held is released: a caller
            // that sees it gone (the daemon's stats) may write its keys.
            sh.reclaim(&d);
            sh.dummies.lock().remove(&d.id);
        }
        Open::Join { dummy } => {
            let Some(d) = sh.dummies.lock().get(&dummy).cloned() else {
                let _ = wire::send(
                    &mut c,
                    &Err::<Attached, _>(Error::new(
                        ErrorCode::RpcFail,
                        "this mooncake_client daemon does not know the dummy client (the daemon \
                         restarted); call setup_dummy again",
                    )),
                );
                return;
            };
            if wire::send(&mut c, &Ok::<_, Error>(sh.attached())).is_err() {
                return;
            }
            loop {
                let call: Call = match wire::recv_within(&mut c, NEXT_CALL_SPIN) {
                    Ok(call) => call,
                    Err(_) => return,
                };
                if let Err(e) = sh.call(&d, &mut c, call) {
                    tracing::debug!(pid = d.pid, error = %e, "dummy client connection ended");
                    return;
                }
            }
        }
    }
}

fn control_loop(sh: &Shared, d: &Dummy, c: &mut UnixStream) {
    loop {
        let req: Control = match wire::recv(c) {
            Ok(r) => r,
            Err(_) => return,
        };
        let sent = match req {
            Control::Map { region, size } => {
                // Without its descriptor the stream is out of step: end the
                // connection (the dummy detaches).
                let Ok(fd) = wire::recv_fd(c) else {
                    return;
                };
                let name = format!("dummy-{}-{region}", d.pid);
                let r = Segment::from_fd(name, std::fs::File::from(fd), size)
                    .map(|seg| {
                        d.regions.write().insert(region, seg);
                    })
                    .map_err(|e| Error::invalid(format!("cannot map region {region}: {e}")));
                wire::send(c, &r)
            }
            Control::Unmap { region } => {
                let gone: Vec<usize> = d
                    .buffers
                    .lock()
                    .iter()
                    .filter(|(_, &r)| r == region)
                    .map(|(&p, _)| p)
                    .collect();
                for p in gone {
                    d.buffers.lock().remove(&p);
                    let _ = sh.client.unregister_buffer(p);
                }
                d.regions.write().remove(&region);
                wire::send(c, &Ok::<(), Error>(()))
            }
            Control::Register(b) => {
                let mut keep = Keep::default();
                let r = d.registered_ptr(b, &mut keep).and_then(|p| {
                    sh.client.register_buffer(p, b.len as usize)?;
                    d.buffers.lock().insert(p, b.region);
                    Ok(())
                });
                wire::send(c, &r)
            }
            Control::Unregister(b) => {
                let mut keep = Keep::default();
                let r = d.ptr(b, &mut keep).and_then(|p| {
                    sh.client.unregister_buffer(p)?;
                    d.buffers.lock().remove(&p);
                    Ok(())
                });
                wire::send(c, &r)
            }
            Control::Ping => wire::send(c, &sh.client.health()),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// Checked caller-side extent of a tensor write's source: the payload, or
/// the whole object of a verbatim write.
fn write_extent(w: &WireWrite, route: &WriteRoute) -> Result<u64> {
    let src = w.source()?;
    let mut extent = numel(&src.shape)
        .and_then(|n| n.checked_mul(src.dtype.itemsize()))
        .and_then(|n| n.checked_add(src.payload_offset))
        .ok_or_else(|| Error::invalid("tensor size overflows"))?;
    if let WriteRoute::Verbatim { size } = route {
        extent = extent.max(*size);
    }
    Ok(extent)
}

impl Shared {
    fn attached(&self) -> Attached {
        Attached {
            daemon: self.id.clone(),
            hostname: self.client.hostname(),
        }
    }

    /// Forget a dummy: revoke its put sessions, end its get sessions,
    /// unregister its buffers and drop its regions.
    fn reclaim(&self, d: &Dummy) {
        let c = &self.client;
        let puts: Vec<String> = d.put_sessions.drain();
        if !puts.is_empty() {
            c.batch_put_session_revoke(&puts);
        }
        let gets: Vec<String> = d.get_sessions.drain();
        if !gets.is_empty() {
            let _ = c.batch_get_session_end(&gets);
        }
        let buffers: Vec<usize> = d.buffers.lock().drain().map(|(p, _)| p).collect();
        for &p in &buffers {
            let _ = c.unregister_buffer(p);
        }
        let regions = d.regions.write().drain().count();
        tracing::info!(
            pid = d.pid,
            regions,
            buffers = buffers.len(),
            put_sessions = puts.len(),
            get_sessions = gets.len(),
            "dummy client detached (closed or exited); reclaimed what it held"
        );
    }

    /// Serve one call on a joined connection.
    fn call(&self, d: &Dummy, c: &mut UnixStream, call: Call) -> io::Result<()> {
        let cl = &*self.client;
        let mut keep = Keep::default();
        let k = &mut keep;
        match call {
            Call::Put {
                key,
                src,
                cfg,
                upsert,
            } => {
                // SAFETY: `ptr` checked the range against a mapped region, held by `keep`.
                let r = d
                    .ptr(src, k)
                    .and_then(|p| unsafe { cl.put_prestaged(&key, p, src.len, &cfg, upsert) });
                wire::send(c, &r)
            }
            Call::PutParts {
                key,
                parts,
                cfg,
                upsert,
            } => {
                // SAFETY: every piece was checked against a mapped region held by `keep`.
                let r = d.pieces(&parts, k).and_then(|pieces| unsafe {
                    cl.put_parts_prestaged(&key, &pieces, &cfg, upsert)
                });
                wire::send(c, &r)
            }
            Call::PutBatch {
                keys,
                values,
                cfg,
                upsert,
            } => {
                // SAFETY: every value was checked against a mapped region held by `keep`.
                let r = d
                    .pieces(&values, k)
                    .and_then(|vals| unsafe { cl.put_batch_prestaged(&keys, &vals, &cfg, upsert) });
                wire::send(c, &r)
            }
            Call::GetValues { keys } => self.get_values(d, c, &keys),
            Call::Query { query, args } => {
                let reply = crate::queries::serve(cl, query, &args)?;
                c.write_all(&reply)
            }
            Call::Move { mv, args, .. } => {
                let reply = crate::moves::serve(cl, &mut Landing { d, keep: k }, mv, &args)?;
                c.write_all(&reply)
            }
            Call::GetRanges {
                buffers,
                keys,
                dst_offsets,
                src_offsets,
                sizes,
            } => {
                let ptrs = buffers
                    .iter()
                    .map(|b| d.ptr(*b, k))
                    .collect::<Result<Vec<_>>>();
                let r = match ptrs {
                    // SAFETY: each buffer is the rest of a mapped region held
                    // by `keep`; the client writes only inside registered
                    // buffers, which lie in those regions.
                    Ok(p) => unsafe {
                        cl.get_into_ranges(&p, &keys, &dst_offsets, &src_offsets, &sizes)
                    },
                    Err(e) => mooncake_client::ranges_failed(&dst_offsets, buffers.len(), &e),
                };
                wire::send(c, &r)
            }
            Call::PutSessionStart { keys, sizes, cfg } => {
                let r = cl.batch_put_session_start(&keys, &sizes, &cfg);
                if let Ok(v) = &r {
                    d.put_sessions.opened(&keys, v);
                }
                wire::send(c, &r)
            }
            Call::PutSessionEnd { keys, revoke } => {
                d.put_sessions.closed(&keys);
                let r = if revoke {
                    cl.batch_put_session_revoke(&keys)
                } else {
                    cl.batch_put_session_end(&keys)
                };
                wire::send(c, &r)
            }
            Call::GetSessionStart { keys } => {
                let r = cl.batch_get_session_start(&keys);
                d.get_sessions.opened(&keys, &r);
                wire::send(c, &r)
            }
            Call::GetSessionEnd { keys } => {
                d.get_sessions.closed(&keys);
                wire::send(c, &cl.batch_get_session_end(&keys))
            }
            Call::WriteTensors { items, cfg, mode } => {
                let items: Vec<Result<TensorWrite>> = items
                    .into_iter()
                    .map(|w| {
                        let w = w?;
                        let route = w.route.to_route()?;
                        if write_extent(&w, &route)? > w.src.len {
                            return Err(Error::invalid(
                                "the tensor source is larger than the buffer given",
                            ));
                        }
                        Ok(TensorWrite {
                            key: w.key.clone(),
                            source: w.source()?,
                            ptr: d.ptr(w.src, k)?,
                            route,
                        })
                    })
                    .collect();
                // SAFETY: every source lies in a mapped region held by `keep`
                // and covers the bytes its plan reads (checked above).
                let r = unsafe { cl.write_tensors(items, &cfg, mode) };
                wire::send(c, &r)
            }
            Call::ReadTensors { reqs } => self.read_tensors(d, c, reqs),
            Call::Stats => wire::send(c, &self.stats()),
        }
    }

    fn stats(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .client
            .stats()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let dummies = self.dummies.lock();
        v.push(("daemon_dummies".into(), dummies.len() as u64));
        v.push((
            "daemon_dummy_regions".into(),
            dummies
                .values()
                .map(|d| d.regions.read().len() as u64)
                .sum(),
        ));
        v.push((
            "daemon_dummy_buffers".into(),
            dummies
                .values()
                .map(|d| d.buffers.lock().len() as u64)
                .sum(),
        ));
        v.push((
            "daemon_dummy_sessions".into(),
            dummies
                .values()
                .map(|d| (d.put_sessions.len() + d.get_sessions.len()) as u64)
                .sum(),
        ));
        v
    }

    /// [`Call::GetValues`]: sizes out, destinations in, results out.
    fn get_values(&self, d: &Dummy, c: &mut UnixStream, keys: &[String]) -> io::Result<()> {
        let mut keep = Keep::default();
        let mut broke: Option<io::Error> = None;
        let results = self.client.get_batch_prestaged_with(keys, |sizes| {
            let dests =
                wire::send(c, &sizes.to_vec()).and_then(|()| wire::recv::<Vec<Option<Buf>>>(c));
            match dests {
                Ok(dests) => sizes
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let (Ok(n), Some(Some(b))) = (s, dests.get(i)) else {
                            return None;
                        };
                        if b.len < *n {
                            return None;
                        }
                        d.ptr(*b, &mut keep).ok().filter(|&p| p != 0)
                    })
                    .collect(),
                Err(e) => {
                    broke = Some(e);
                    vec![None; sizes.len()]
                }
            }
        });
        match broke {
            Some(e) => Err(e),
            None => wire::send(c, &results),
        }
    }

    /// [`Call::ReadTensors`]: outputs out, destinations in, results out.
    fn read_tensors(
        &self,
        d: &Dummy,
        c: &mut UnixStream,
        reqs: Vec<Result<wire::WireRead>>,
    ) -> io::Result<()> {
        let reqs: Vec<Result<ReadRequest>> = reqs
            .into_iter()
            .map(|r| r.and_then(|w| w.to_request()))
            .collect();
        let mut keep = Keep::default();
        let mut broke: Option<io::Error> = None;
        // SAFETY: every destination lies in a mapped region held by `keep`
        // (which outlives the call) and is at least as large as the executor
        // writes (payloads are checked against `nbytes`; `_into` sizes are
        // the buffers' own and checked by the executor).
        let results = unsafe {
            self.client.read_tensors(reqs, |outs| {
                let asked = wire::send(c, &wire_outputs(outs)).and_then(|()| wire::recv(c));
                let dests: Vec<Option<WireDest>> = match asked {
                    Ok(v) => v,
                    Err(e) => {
                        // No destination: nothing is read.
                        broke = Some(e);
                        return Vec::new();
                    }
                };
                outs.iter()
                    .enumerate()
                    .map(|(i, out)| {
                        let out = out.as_ref().ok()?;
                        match dests.get(i).copied().flatten()? {
                            WireDest::Payload(b) if b.len >= out.nbytes => d
                                .ptr(b, &mut keep)
                                .ok()
                                .filter(|&p| p != 0)
                                .map(TensorDest::Payload),
                            WireDest::Into(b) => d
                                .ptr(b, &mut keep)
                                .ok()
                                .filter(|&p| p != 0)
                                .map(|ptr| TensorDest::Into { ptr, size: b.len }),
                            WireDest::Payload(_) => None,
                        }
                    })
                    .collect()
            })
        };
        if let Some(e) = broke {
            return Err(e);
        }
        let results = wire_outputs(&results);
        wire::send(c, &results)
    }
}

/// Tensor read outputs (or their failures) as they go on the wire.
fn wire_outputs(outs: &[Result<ReadOutput>]) -> Vec<Result<WireOutput>> {
    outs.iter()
        .map(|r| {
            r.as_ref()
                .map(WireOutput::from_output)
                .map_err(Clone::clone)
        })
        .collect()
}
