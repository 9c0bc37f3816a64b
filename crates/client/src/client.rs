//! `Client`: one store client instance (what `MooncakeDistributedStore.setup`
//! creates): master connection, mounted segment, data server, heartbeat,
//! and the registered-buffer table. Setup applies [`ClientConfig::check`]
//! first, so a Rust caller gets the same argument rules as Python.
//!
//! The master is found through a locator: a fixed `host:port`, or the HA
//! leader named by `etcd://...` and followed across failovers. The segment
//! comes with a replica ledger; when the master does not know this client
//! (it restarted, or a new HA leader took over), the heartbeat remounts the
//! segment and reports the ledger, so the objects in the segment survive
//! a master restart or failover.

mod extra;
mod http_server;

pub use extra::MountSource;

use crate::config::ClientConfig;
use crate::durability::ledger::Ledger;
use crate::error::{Error, Result};
use crate::master::discovery::MasterLocator;
use crate::master::done::DoneQueue;
use crate::master::master_conn::MasterConn;
use crate::master::metadata_pub::MetadataServer;
use crate::registered::Regions;
use crate::staging::StagingArea;
use crate::stats::ClientStats;
use crate::wake::Wake;
use mooncake_common::proto::{MasterRequest, MasterResponse, SegmentDesc};
use mooncake_common::{AuthKey, ErrorCode};
use mooncake_transfer::data_path::data_server::DataServer;
use mooncake_transfer::same_host::mapping::{socket_name, MappingServer};
use mooncake_transfer::segment::{register_local, unregister_local, Segment};
use mooncake_transfer::DataPath;
use parking_lot::Mutex;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A value read through the staging (local) buffer; owns its bytes and
/// holds its staging reservation until dropped.
pub struct StagedValue {
    /// The value's bytes.
    pub data: Vec<u8>,
    pub(crate) _reservation: Option<crate::staging::Reservation>,
}

impl StagedValue {
    /// A value whose bytes were staged elsewhere (no reservation here).
    pub fn owned(data: Vec<u8>) -> StagedValue {
        StagedValue {
            data,
            _reservation: None,
        }
    }
}

/// A set-up store client. Cheap to share (`Arc`); all methods take `&self` and are thread-safe.
pub struct Client {
    pub(crate) stats: Arc<ClientStats>,
    pub(crate) master: Arc<MasterConn>,
    pub(crate) data_path: DataPath,
    pub(crate) staging: Arc<StagingArea>,
    pub(crate) regions: Regions,
    pub(crate) client_id: String,
    pub(crate) desc: SegmentDesc,
    pub(crate) segment: Option<Arc<Segment>>,
    data_server: Mutex<Option<DataServer>>,
    mapping_server: Mutex<Option<MappingServer>>,
    metadata: Option<MetadataServer>,
    closed: Arc<AtomicBool>,
    health: Arc<AtomicI32>,
    heartbeat: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Held by the heartbeat thread across one round (its ping and any
    /// remount); `close` takes it once after setting `closed`, so no round
    /// runs after the unmount (a round's remount would bring the closed
    /// client's segment back, and under a reused name reconcile away the
    /// objects of the client that now owns that name).
    beat: Mutex<()>,
    /// Remove/upsert counter (see `mutation_epoch`).
    pub(crate) mutations: std::sync::atomic::AtomicU64,
    /// Finished read tickets to report to the master.
    done: Arc<DoneQueue>,
    /// Committed replicas in this client's segment (reported on remount).
    pub(crate) ledger: Arc<Ledger>,
    /// Wakes the heartbeat early (leader change, broken ledger stream).
    wake: Arc<Wake>,
    ledger_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The HTTP endpoints (`enable_client_http_server`), stopped at close.
    http_server: Mutex<Option<http_server::HttpServer>>,
    /// Open put and get sessions (`batch_*_session_*`).
    pub(crate) sessions: crate::session_table::Sessions,
    /// The disk tier (SSD offload), if on.
    pub(crate) disk: Option<Arc<crate::durability::disk::Disk>>,
    /// The cluster token (for reads of other owners' disk tiers).
    pub(crate) auth: Option<AuthKey>,
    /// Segments added after setup (`mount_segment`,
    /// `allocate_and_mount_segment`).
    extras: Mutex<Vec<extra::Extra>>,
}

/// `health_check()`: healthy.
pub const HEALTHY: i32 = 0;
/// `health_check()`: not set up, or closed.
pub const HEALTH_CLOSED: i32 = 1;
/// `health_check()`: the most recent heartbeat ping failed.
pub const HEALTH_PING_FAILED: i32 = 2;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn bind_data_port(host: &str, explicit: Option<u16>) -> Result<TcpListener> {
    if let Some(p) = explicit {
        return TcpListener::bind((host, p))
            .map_err(|e| Error::invalid(format!("cannot bind data port {host}:{p}: {e}")));
    }
    let lo = env_u64("MC_STORE_CLIENT_MIN_PORT", 12300) as u16;
    let hi = (env_u64("MC_STORE_CLIENT_MAX_PORT", 14300) as u16).max(lo);
    let tries = env_u64("MC_STORE_CLIENT_SETUP_RETRIES", 20).max(1);
    let span = (hi - lo) as u64 + 1;
    let seed = std::process::id() as u64 ^ (uuid::Uuid::new_v4().as_u128() as u64);
    for i in 0..tries {
        let p = lo as u64 + (seed.wrapping_add(i.wrapping_mul(7919))) % span;
        if let Ok(l) = TcpListener::bind((host, p as u16)) {
            return Ok(l);
        }
    }
    Err(Error::internal(format!(
        "no free data port on {host} in [{lo}, {hi}] after {tries} tries"
    )))
}

impl Client {
    /// Connect to the master, allocate and mount the segment, start the data
    /// server and heartbeat. The errors are `setup`'s return codes: those of [`ClientConfig::check`], -600 for a
    /// segment name a live client already mounted, -1 for an unreachable
    /// master or metadata server.
    pub fn setup(cfg: ClientConfig) -> Result<Arc<Client>> {
        cfg.check(&mut Vec::new())?;
        let (host, port) = cfg.host_and_port()?;
        let (gs, lb) = (cfg.global_segment_size, cfg.local_buffer_size);
        // The cluster token (MC_AUTH_TOKEN / MC_AUTH_TOKEN_FILE), if any.
        let auth = AuthKey::from_env()
            .map_err(|e| Error::internal(format!("cannot load the cluster token: {e}")))?;
        let metadata = MetadataServer::open(&cfg.metadata_server, auth.clone())
            .map_err(|e| Error::internal(e.to_string()))?;
        let timeout = Duration::from_millis(env_u64("MC_MASTER_CONNECT_TIMEOUT_MS", 5000));
        let started = std::time::Instant::now();
        let locator = MasterLocator::start(
            &cfg.master_server_addr,
            &mooncake_common::ha::client_cluster_id(),
        )
        .map_err(|e| Error::internal(e.to_string()))?;
        if locator.is_ha() {
            let leader = locator
                .wait_leader(timeout)
                .map_err(|e| Error::internal(e.to_string()))?;
            tracing::info!(leader = %leader, "master leader found through etcd");
        }
        let master = Arc::new(
            MasterConn::new(locator, Duration::from_millis(1000), auth.clone())
                .with_tenant(&cfg.tenant_id),
        );
        let left = timeout.saturating_sub(started.elapsed());
        let first = master.connect_with_retry(left).map_err(|e| {
            Error::internal(format!(
                "master {} unreachable as {}: {e}",
                cfg.master_server_addr, cfg.local_hostname
            ))
        })?;
        // The heartbeat's own path: this connection, and a socket made now
        // for reconnecting, before any data connection can take descriptors.
        let spare = master.spare_socket().ok();
        // The disk tier, before anything is mounted: a directory that
        // cannot be used fails setup with nothing half-enabled.
        let tier = if cfg.enable_ssd_offload {
            Some(crate::durability::disk::open_configured(
                cfg.tier_config()?,
            )?)
        } else {
            match crate::durability::disk::storage_config(&master) {
                Ok((fsdir, disk_eviction, quota_bytes)) if !fsdir.is_empty() && gs > 0 => {
                    let mut base = mooncake_offload::TierConfig::from_env(&fsdir)
                        .map_err(|e| Error::invalid(format!("SSD offload: {e}")))?;
                    base.evict = disk_eviction;
                    // The master's `--quota_bytes` caps the tier as
                    // MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE does (0 for both:
                    // 90% of the file system).
                    if quota_bytes > 0 {
                        base.bucket_max_total_size = quota_bytes;
                    }
                    Some(crate::durability::disk::open_under(&fsdir, &base)?)
                }
                Ok(_) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot ask the master for its storage config; no disk tier");
                    None
                }
            }
        };

        // On a shared transfer engine, `local_hostname` is the engine's name
        // (`host:rpc_port`, whose port the engine holds): the segment keeps
        // that name and the data server takes a free port of the host.
        let shared = cfg.engine.as_ref().map(|e| std::sync::Arc::clone(&e.0));
        let listener = bind_data_port(&host, if shared.is_some() { None } else { port })?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::internal(format!("data port: {e}")))?
            .port();
        let endpoint = format!("{host}:{bound}");
        let name = if shared.is_some() {
            cfg.local_hostname.clone()
        } else {
            endpoint.clone()
        };
        let segment = if gs > 0 {
            let seg = Segment::create(gs).map_err(|e| {
                Error::internal(format!("cannot allocate a segment of {gs} bytes: {e}"))
            })?;
            Some(seg)
        } else {
            None
        };
        let data_path = DataPath::new().with_auth(auth.clone());
        let desc = SegmentDesc {
            name: name.clone(),
            uuid: segment
                .as_ref()
                .map(|s| s.uuid().to_string())
                .unwrap_or_default(),
            size: gs,
            base_addr: segment.as_ref().map(|s| s.base() as u64).unwrap_or(0),
            host_id: data_path.host_id().to_string(),
            pid: std::process::id(),
            endpoint,
            socket_name: segment
                .as_ref()
                .map(|s| socket_name(s.uuid()))
                .unwrap_or_default(),
        };
        let data_server = DataServer::start(listener, segment.clone(), auth.clone())
            .map_err(|e| Error::internal(format!("cannot start the data server: {e}")))?;
        let mapping_server = match &segment {
            Some(s) => MappingServer::start(Arc::clone(s), auth.clone())
                .map_err(|e| tracing::info!(error = %e, "same-host mapping server unavailable"))
                .ok(),
            None => None,
        };
        let client_id = uuid::Uuid::new_v4().to_string();
        let mount = master
            .call(&MasterRequest::MountSegment {
                client_id: client_id.clone(),
                segment: desc.clone(),
            })
            .map_err(|e| Error::from(e).context("mount segment"))?;
        match mount {
            MasterResponse::Ok => {}
            MasterResponse::Err(ErrorCode::SegmentAlreadyExists) => {
                return Err(Error::invalid(format!(
                    "segment {name} is already mounted by a live client"
                )));
            }
            MasterResponse::Err(e) => return Err(Error::from(e).context("mount segment")),
            _ => return Err(Error::internal("mount segment: unexpected master response")),
        }
        if let Some(s) = &segment {
            register_local(s);
        }
        let disk = tier.map(|t| {
            crate::durability::disk::Disk::new(
                t,
                Arc::clone(&master),
                client_id.clone(),
                name.clone(),
                segment.clone(),
            )
        });
        if let Some(d) = &disk {
            if cfg.serve_disk_reads {
                data_server.serve_disk(Arc::new(crate::durability::disk::Served(Arc::clone(d))));
            }
        }
        let client = Arc::new(Client {
            stats: Arc::new(ClientStats::default()),
            master,
            data_path,
            staging: StagingArea::new(lb),
            regions: shared.map_or_else(Regions::default, |e| {
                Regions::shared(std::sync::Arc::clone(e.registry()))
            }),
            client_id,
            desc,
            segment,
            data_server: Mutex::new(Some(data_server)),
            mapping_server: Mutex::new(mapping_server),
            metadata,
            closed: Arc::new(AtomicBool::new(false)),
            health: Arc::new(AtomicI32::new(HEALTHY)),
            heartbeat: Mutex::new(None),
            beat: Mutex::new(()),
            mutations: std::sync::atomic::AtomicU64::new(0),
            done: Arc::new(DoneQueue::default()),
            ledger: Arc::new(Ledger::default()),
            wake: Arc::new(Wake::default()),
            ledger_thread: Mutex::new(None),
            http_server: Mutex::new(None),
            sessions: Default::default(),
            disk,
            auth: auth.clone(),
            extras: Mutex::new(Vec::new()),
        });
        client.done.start(&client.master);
        if client.segment.is_some() {
            crate::durability::ledger::register(&client.desc.name, &client.ledger);
        }
        if !client.publish_metadata() {
            client.close();
            return Err(Error::internal(format!(
                "cannot publish the segment descriptor to {}",
                cfg.metadata_server
            )));
        }
        client.start_ledger_stream();
        if let Some(d) = &client.disk {
            d.announce(None);
        }
        client.start_heartbeat(first, spare);
        if cfg.enable_client_http_server {
            // Checked to fit a port by `ClientConfig::check`.
            let port = cfg.client_http_port as u16;
            match http_server::HttpServer::start(port, Arc::downgrade(&client)) {
                Ok(s) => *client.http_server.lock() = Some(s),
                Err(e) => tracing::warn!(
                    port,
                    error = %e,
                    "cannot start the client HTTP server; continuing without HTTP endpoints"
                ),
            }
        }
        // Follow HA leader changes at once: drop the old leader's
        // connections and let the heartbeat remount on the new one.
        let weak = Arc::downgrade(&client);
        client.master.locator().on_change(move |_| {
            if let Some(c) = weak.upgrade() {
                c.master.reset();
                c.wake.notify();
            }
        });
        Ok(client)
    }

    fn start_ledger_stream(self: &Arc<Self>) {
        if self.segment.is_none() {
            return;
        }
        let weak = Arc::downgrade(self);
        let fetch = crate::durability::fetch::Fetcher::start(move |jobs| {
            let Some(c) = weak.upgrade().filter(|c| !c.is_closed()) else {
                return false;
            };
            if !jobs.is_empty() {
                let done = c.fetch_copies(jobs);
                c.report_fetched(done);
            }
            true
        })
            .map_err(|e| tracing::warn!(error = %e, "cannot start the copy thread; copy and move tasks to this segment fail"))
            .ok();
        let ctx = crate::durability::ledger_stream::StreamCtx {
            master: Arc::clone(&self.master),
            ledger: Arc::clone(&self.ledger),
            client_id: self.client_id.clone(),
            segment: self.desc.name.clone(),
            closed: Arc::clone(&self.closed),
            wake: Arc::clone(&self.wake),
            disk: self.disk.clone(),
            fetch,
        };
        match crate::durability::ledger_stream::start(ctx) {
            Ok(h) => *self.ledger_thread.lock() = Some(h),
            Err(e) => tracing::warn!(error = %e, "cannot start the ledger stream"),
        }
    }

    fn metadata_key(desc: &SegmentDesc) -> String {
        format!("mooncake/ram/{}", desc.name)
    }

    fn publish_metadata(&self) -> bool {
        self.publish(&self.desc)
    }

    /// Publish segment `desc` to the metadata server (if there is one).
    fn publish(&self, desc: &SegmentDesc) -> bool {
        let Some(url) = &self.metadata else {
            return true;
        };
        let body = serde_json::json!({
            "name": desc.name,
            "protocol": "tcp",
            "uuid": desc.uuid,
            "size": desc.size,
            "base_addr": desc.base_addr,
            "host_id": desc.host_id,
            "pid": desc.pid,
            "endpoint": desc.endpoint,
        })
        .to_string();
        let key = Self::metadata_key(desc);
        match url.put(&key, body.as_bytes()) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "cannot publish segment metadata");
                false
            }
        }
    }

    /// Take segment `desc` off the metadata server.
    fn unpublish(&self, desc: &SegmentDesc) {
        if let Some(url) = &self.metadata {
            url.delete(&Self::metadata_key(desc));
        }
    }

    /// Ping the master every second on a connection of its own (`conn`,
    /// reconnecting through the `spare` socket made at setup), so that
    /// data connections never starve the heartbeat of descriptors.
    ///
    /// It pings every 200 ms while the master is away (so a restarted
    /// master sees the remount quickly), and at once when the HA leader
    /// changed or the ledger stream broke.
    fn start_heartbeat(self: &Arc<Self>, conn: TcpStream, spare: Option<socket2::Socket>) {
        let weak = Arc::downgrade(self);
        let closed = Arc::clone(&self.closed);
        let wake = Arc::clone(&self.wake);
        let h = std::thread::Builder::new()
            .name("mc-heartbeat".into())
            .spawn(move || {
                let mut conn = Some(conn);
                let mut spare = spare;
                let mut failures = 0u32;
                let mut last_tick = std::time::Instant::now();
                while !closed.load(Ordering::Acquire) {
                    // In small steps so close() is prompt.
                    let steps = if failures > 0 { 2 } else { 10 };
                    for _ in 0..steps {
                        if closed.load(Ordering::Acquire) {
                            return;
                        }
                        if wake.wait(Duration::from_millis(100)) {
                            // Possibly a new leader: reconnect.
                            conn = None;
                            break;
                        }
                    }
                    if closed.load(Ordering::Acquire) {
                        return;
                    }
                    let Some(me) = weak.upgrade() else { return };
                    let _round = me.beat.lock();
                    if closed.load(Ordering::Acquire) {
                        return;
                    }
                    if conn.is_none() {
                        conn = match spare.take() {
                            Some(sp) => me.master.connect_spare(sp).ok(),
                            None => me.master.connect().ok(),
                        };
                    }
                    if spare.is_none() {
                        spare = me.master.spare_socket().ok();
                    }
                    let resp = conn.as_mut().map(|s| {
                        let _tracked = me.master.track(s);
                        MasterConn::call_on(
                            s,
                            &MasterRequest::Ping {
                                client_id: me.client_id.clone(),
                            },
                        )
                    });
                    if let Some(d) = &me.disk {
                        if last_tick.elapsed() >= d.tier.config().heartbeat_interval {
                            last_tick = std::time::Instant::now();
                            d.tier.tick();
                        }
                    }
                    match resp {
                        Some(Ok(MasterResponse::Pong { need_remount })) => {
                            failures = 0;
                            me.health.store(HEALTHY, Ordering::Release);
                            if need_remount {
                                if let Some(c) = conn.as_mut() {
                                    me.remount(c);
                                }
                            }
                        }
                        _ => {
                            failures += 1;
                            conn = None;
                            me.health.store(HEALTH_PING_FAILED, Ordering::Release);
                            if failures == 3 {
                                tracing::warn!("master heartbeat failed 3 times; reconnecting");
                            }
                        }
                    }
                }
            })
            .ok();
        *self.heartbeat.lock() = h;
    }

    /// Remount on the heartbeat's connection `conn`, reporting the ledger
    /// (in chunks) so that the master adopts the objects the segment holds.
    fn remount(&self, conn: &mut TcpStream) {
        tracing::warn!(segment = %self.desc.name, entries = self.ledger.len(), "master asked for remount (restarted or new leader); remounting");
        // Writes granted before the master lost track of this client may
        // still be on their way (across a partition that just healed);
        // once remounted, their ranges may be another object's. Fence them
        // off first: only writes on connections made from now on land.
        if let Some(ds) = self.data_server.lock().as_ref() {
            ds.fence_writes();
        }
        if self.segment.is_none() {
            let r = MasterConn::call_on(
                conn,
                &MasterRequest::MountSegment {
                    client_id: self.client_id.clone(),
                    segment: self.desc.clone(),
                },
            );
            if !matches!(r, Ok(MasterResponse::Ok)) {
                tracing::warn!(result = ?r, "remount failed");
                return;
            }
            self.publish_metadata();
            if let Some(d) = &self.disk {
                d.announce(Some(conn));
            }
            self.remount_extras(conn);
            return;
        }
        let Some(expired) = self.remount_with_ledger(conn, &self.desc, &self.ledger) else {
            return;
        };
        self.publish_metadata();
        if let Some(d) = &self.disk {
            if expired {
                // Its disk copies were dropped with it.
                d.discard_all();
            }
            d.announce(Some(conn));
        }
        self.remount_extras(conn);
    }

    /// Unmount, stop serving, unpublish metadata. Idempotent.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // A heartbeat round in flight ends before the unmount; later ones
        // see `closed` and stop.
        drop(self.beat.lock());
        drop(self.http_server.lock().take());
        self.close_sessions();
        if let Some(d) = &self.disk {
            // Sealed buckets survive; the directory is free for the next owner.
            d.tier.close();
        }
        self.done.stop();
        let done = self.done.take(true);
        if !done.is_empty() {
            let _ = self
                .master
                .call(&MasterRequest::ReadsDone { tickets: done });
        }
        let _ = self.master.call(&MasterRequest::Disconnect {
            client_id: self.client_id.clone(),
        });
        self.close_extras();
        if let Some(s) = &self.segment {
            unregister_local(s.uuid());
            crate::durability::ledger::unregister(&self.desc.name);
        }
        if let Some(ds) = self.data_server.lock().take() {
            ds.stop();
        }
        if let Some(ms) = self.mapping_server.lock().take() {
            ms.stop();
        }
        self.unpublish(&self.desc);
        // The heartbeat thread notices `closed` within 100 ms; it is not
        // joined because the last reference may be dropped on that thread.
        drop(self.heartbeat.lock().take());
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// `host:port` segment name.
    pub fn hostname(&self) -> String {
        self.desc.name.clone()
    }

    /// `health_check()`'s value: [`HEALTHY`], [`HEALTH_CLOSED`] after
    /// `close`, or [`HEALTH_PING_FAILED`] when the last heartbeat failed.
    pub fn health(&self) -> i32 {
        if self.is_closed() {
            return HEALTH_CLOSED;
        }
        self.health.load(Ordering::Acquire)
    }

    /// Cumulative counters, plus `ledger_entries` (committed replicas
    /// this client's segment holds, as its ledger says) and, with a disk
    /// tier, `disk_objects`, `disk_bytes_written`, `disk_bytes_read`,
    /// `disk_failed_writes` and `disk_evicted_buckets`.
    pub fn stats(&self) -> Vec<(&'static str, u64)> {
        let mut v = self.stats.snapshot();
        for e in v.iter_mut() {
            if e.0 == "same_host_mappings" {
                e.1 = self.data_path.mappings_created.load(Ordering::Relaxed);
            }
        }
        v.push(("ledger_entries", self.ledger.len() as u64));
        if let Some(d) = &self.disk {
            let st = &d.tier.stats;
            v.push(("disk_objects", d.tier.len() as u64));
            v.push((
                "disk_bytes_written",
                st.bytes_written.load(Ordering::Relaxed),
            ));
            v.push(("disk_bytes_read", st.bytes_read.load(Ordering::Relaxed)));
            v.push((
                "disk_failed_writes",
                st.failed_writes.load(Ordering::Relaxed),
            ));
            v.push((
                "disk_evicted_buckets",
                st.evicted_buckets.load(Ordering::Relaxed),
            ));
        }
        v
    }

    /// One master RPC, counted. Finished read tickets ride along.
    pub(crate) fn rpc(&self, req: MasterRequest) -> std::result::Result<MasterResponse, ErrorCode> {
        self.stats.master_rpcs.fetch_add(1, Ordering::Relaxed);
        let done = self.done.take(req.changes_metadata());
        if done.is_empty() {
            return self.master.call(&req);
        }
        let r = self.master.call_with_done(&req, &done);
        if r.is_err() {
            // Reporting twice is harmless; losing them only delays the end.
            for t in done {
                self.done.push(t);
            }
        }
        r
    }

    /// A read under `ticket` finished (successfully or not).
    pub(crate) fn read_finished(&self, ticket: u64) {
        self.done.push(ticket);
    }

    /// `unmount_local_disk_segment`: drain this client's disk tier (see
    /// `Disk::drain`), then wait `grace` before returning. `false` when
    /// the client has no disk tier: nothing to drain, no wait.
    pub fn drain_local_disk_segment(&self, grace: std::time::Duration) -> Result<bool> {
        let Some(d) = &self.disk else {
            return Ok(false);
        };
        d.drain()?;
        tracing::info!(grace_ms = grace.as_millis() as u64, "drained the disk tier");
        std::thread::sleep(grace);
        Ok(true)
    }

    /// `get_offload_rpc_read_count`: reads of this client's disk tier
    /// served to other processes (0 without a disk tier).
    pub fn offload_rpc_read_count(&self) -> u64 {
        self.disk
            .as_ref()
            .map_or(0, |d| d.remote_reads.load(Ordering::Relaxed))
    }

    /// Objects in this client's disk tier (0 without one).
    pub fn disk_objects(&self) -> usize {
        self.disk.as_ref().map_or(0, |d| d.tier.len())
    }

    /// Register `[ptr, ptr+size)` for `get_into_ranges`; INVALID_PARAMS
    /// when empty or overlapping a registered region.
    pub fn register_buffer(&self, ptr: usize, size: usize) -> Result<()> {
        if self.regions.register(ptr, size) {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "buffer {ptr:#x} size {size} is empty or overlaps a registered region"
            )))
        }
    }

    /// Unregister the region starting at `ptr`; INVALID_PARAMS if none starts there.
    pub fn unregister_buffer(&self, ptr: usize) -> Result<()> {
        if self.regions.unregister(ptr) {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "no registered buffer starts at {ptr:#x}"
            )))
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.close();
    }
}
