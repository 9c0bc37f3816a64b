//! This client's disk tier (SSD offload), seen from the client: opening it
//! at setup, announcing it (and what it holds) to the master, moving the
//! replicas the master evicts from the segment to disk, serving disk reads
//! to other processes through the data server, and reading disk copies
//! (own ones directly, others' from their owners).
//!
//! The tier is opened before the segment is mounted, so a directory that
//! cannot be used fails `setup` with nothing mounted. It comes from
//! `enable_ssd_offload` (`ssd_offload_path`, else
//! `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`), or, when the master has a
//! `--root_fs_dir`, from the first free `owner-N` directory under
//! `<root_fs_dir>/<cluster_id>/` (created as needed; a restarted owner
//! takes its old directory back).

use crate::error::{Error, Result};
use crate::master::master_conn::MasterConn;
use mooncake_common::ledger::{LedgerOp, PromoteResult, REPORT_CHUNK};
use mooncake_common::proto::{DiskLoc, DiskObject, MasterRequest, MasterResponse};
use mooncake_common::{AuthKey, ErrorCode};
use mooncake_offload::{DiskTier, OffloadError, TierConfig};
use mooncake_transfer::data_path::data_server::DiskSource;
use mooncake_transfer::data_path::tcp_pool::TcpPool;
use mooncake_transfer::segment::Segment;
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// How long a read waits for a disk copy the master lists but the owner
/// has not written yet.
const IN_FLIGHT_WAIT: std::time::Duration = std::time::Duration::from_millis(200);
/// Most `owner-N` directories tried under the master's file root.
const MAX_OWNER_DIRS: usize = 1024;

/// The disk tier of a client and what moving replicas into it needs.
pub(crate) struct Disk {
    pub(crate) tier: Arc<DiskTier>,
    /// Reads served to other processes.
    pub(crate) remote_reads: AtomicU64,
    /// A thread is sealing the tier's full buckets.
    sealer_busy: Arc<AtomicBool>,
    /// Drained (`unmount_local_disk_segment`): the tier is not announced
    /// to a master again.
    draining: AtomicBool,
    master: Arc<MasterConn>,
    client_id: String,
    segment_name: String,
    segment: Option<Arc<Segment>>,
}

fn tier_error(e: OffloadError) -> Error {
    Error::invalid(format!("SSD offload: {e}"))
}

/// Open the tier `cfg` names (`enable_ssd_offload`).
pub(crate) fn open_configured(cfg: TierConfig) -> Result<DiskTier> {
    DiskTier::open(cfg).map_err(tier_error)
}

/// Open a tier under the master's file root `fsdir`: the first `owner-N`
/// directory no live owner holds.
pub(crate) fn open_under(fsdir: &str, base: &TierConfig) -> Result<DiskTier> {
    let root = Path::new(fsdir);
    std::fs::create_dir_all(root).map_err(|e| {
        Error::invalid(format!(
            "SSD offload: cannot create the master's file directory {fsdir:?}: {e}"
        ))
    })?;
    for n in 0..MAX_OWNER_DIRS {
        let dir = root.join(format!("owner-{n}"));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return Err(Error::invalid(format!(
                "SSD offload: cannot create {}: {e}",
                dir.display()
            )));
        }
        let cfg = TierConfig {
            path: dir,
            ..base.clone()
        };
        match DiskTier::open(cfg) {
            Ok(t) => return Ok(t),
            Err(OffloadError::Locked(_)) => continue,
            Err(e) => return Err(tier_error(e)),
        }
    }
    Err(Error::invalid(format!(
        "SSD offload: every owner directory under {fsdir:?} is in use"
    )))
}

/// Ask the master where owners keep disk tiers and whether tiers there
/// evict to make room, and the bytes each may hold (0: 90% of its file
/// system): `(fsdir, disk_eviction, quota_bytes)`.
pub(crate) fn storage_config(master: &MasterConn) -> Result<(String, bool, u64)> {
    match master.call(&MasterRequest::StorageConfig) {
        Ok(MasterResponse::StorageConfig {
            fsdir,
            disk_eviction,
            quota_bytes,
            ..
        }) => Ok((fsdir, disk_eviction, quota_bytes)),
        Ok(MasterResponse::Err(e)) | Err(e) => Err(Error::from(e).context("storage config")),
        Ok(_) => Err(Error::internal(
            "storage config: unexpected master response",
        )),
    }
}

impl Disk {
    pub(crate) fn new(
        tier: DiskTier,
        master: Arc<MasterConn>,
        client_id: String,
        segment_name: String,
        segment: Option<Arc<Segment>>,
    ) -> Arc<Disk> {
        let tier = Arc::new(tier);
        let disk = Arc::new(Disk {
            tier: Arc::clone(&tier),
            remote_reads: AtomicU64::new(0),
            sealer_busy: Arc::new(AtomicBool::new(false)),
            draining: AtomicBool::new(false),
            master,
            client_id,
            segment_name,
            segment,
        });
        // Buckets the tier evicts (cap, watermark) or finds corrupt: the
        // master forgets them before their files go.
        let weak = Arc::downgrade(&disk);
        tier.set_evict_handler(Box::new(move |objs| {
            if let Some(d) = weak.upgrade() {
                d.report_dropped(objs.to_vec());
            }
        }));
        disk
    }

    /// Drain the tier (`unmount_local_disk_segment`): the master forgets
    /// every copy in it (objects with no memory replica are gone) and
    /// queues no more copies to it, and this client does not announce it
    /// again (after a master restart or a remount). The files stay.
    pub(crate) fn drain(&self) -> Result<()> {
        self.draining.store(true, Ordering::Release);
        let r = self.master.call(&MasterRequest::DiskTierDrain {
            client_id: self.client_id.clone(),
            segment_name: self.segment_name.clone(),
        });
        let r = match r {
            Ok(MasterResponse::Ok) => Ok(()),
            Ok(MasterResponse::Err(e)) => Err(Error::from(e).context("drain the disk tier")),
            Ok(other) => Err(Error::internal(format!(
                "drain the disk tier: unexpected master response {other:?}"
            ))),
            Err(e) => Err(Error::from(e).context("drain the disk tier")),
        };
        if r.is_err() {
            self.draining.store(false, Ordering::Release);
        }
        r
    }

    /// The master had expired this client's segment and dropped its
    /// objects, disk copies included: delete every copy in the tier.
    /// Announced, they would bring back objects the master dropped, whose
    /// keys may since have been written again or removed.
    pub(crate) fn discard_all(&self) {
        let entries = self.tier.entries();
        for e in &entries {
            self.tier.remove(&e.key, e.version);
        }
        if !entries.is_empty() {
            tracing::warn!(dir = %self.tier.path().display(), objects = entries.len(), "the master had expired this segment: its disk copies are dropped too");
        }
    }

    /// Tell the master these disk copies are gone.
    pub(crate) fn report_dropped(&self, objects: Vec<(String, u64)>) {
        if objects.is_empty() {
            return;
        }
        let r = self.master.call(&MasterRequest::DiskDropped {
            client_id: self.client_id.clone(),
            segment_name: self.segment_name.clone(),
            objects,
        });
        if !matches!(r, Ok(MasterResponse::Ok)) {
            tracing::warn!(result = ?r, "cannot tell the master about dropped disk copies");
        }
    }

    /// Announce the tier and report what it holds (on `conn` when given,
    /// else on a pooled connection); copies the master does not adopt are
    /// deleted. Returns whether the master took the announcement.
    pub(crate) fn announce(&self, mut conn: Option<&mut TcpStream>) -> bool {
        if self.draining.load(Ordering::Acquire) {
            return false;
        }
        let entries = self.tier.entries();
        let chunks: Vec<&[mooncake_offload::DiskEntry]> = entries.chunks(REPORT_CHUNK).collect();
        let last = chunks.len().saturating_sub(1);
        let mut stale = Vec::new();
        for i in 0..chunks.len().max(1) {
            let part = chunks.get(i).copied().unwrap_or(&[]);
            let req = MasterRequest::DiskTier {
                client_id: self.client_id.clone(),
                segment_name: self.segment_name.clone(),
                objects: part
                    .iter()
                    .map(|e| DiskObject {
                        key: e.key.clone(),
                        version: e.version,
                        size: e.size,
                    })
                    .collect(),
                done: i == last,
            };
            let r = match conn.as_deref_mut() {
                Some(c) => MasterConn::call_on(c, &req).map_err(|e| e.to_string()),
                None => self.master.call(&req).map_err(|e| e.to_string()),
            };
            match r {
                Ok(MasterResponse::Codes(codes)) if codes.len() == part.len() => {
                    for (e, c) in part.iter().zip(codes) {
                        if c != 1 {
                            stale.push((e.key.clone(), e.version));
                        }
                    }
                }
                other => {
                    tracing::warn!(result = ?other, "the master did not take the disk tier");
                    return false;
                }
            }
        }
        for (k, v) in &stale {
            self.tier.remove(k, *v);
        }
        let adopted = entries.len() - stale.len();
        if !entries.is_empty() {
            tracing::info!(dir = %self.tier.path().display(), adopted, superseded = stale.len(), "disk tier reported to the master");
        }
        true
    }

    /// The start of `len` bytes at `offset` of this client's segment, when
    /// it has one and the range lies inside its mapping.
    fn segment_at(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let seg = self
            .segment
            .as_ref()
            .filter(|s| s.check_range(offset, len))?;
        // SAFETY: `offset` lies inside the mapping (checked).
        Some(unsafe { seg.base().add(offset as usize) })
    }

    /// Apply the disk side of pushed ledger ops (before they are
    /// acknowledged): copy offloaded and written-through replicas from the
    /// segment to disk, read promoted ones back into the segment, delete
    /// forgotten copies. Returns the copies that could not be written, and
    /// each promotion as `(key, version, offset, copied)`.
    pub(crate) fn apply(&self, ops: &[LedgerOp]) -> (Vec<(String, u64)>, Vec<PromoteResult>) {
        let mut failed = Vec::new();
        let mut promoted = Vec::new();
        for op in ops {
            match op {
                LedgerOp::Offload {
                    offset,
                    version,
                    key,
                    size,
                }
                | LedgerOp::Persist {
                    offset,
                    version,
                    key,
                    size,
                } => {
                    let ok = self.segment_at(*offset, *size).is_some_and(|p| {
                        // SAFETY: the range lies inside the segment's
                        // mapping (checked), which lives as long as `self`;
                        // the master frees the range only on the ack of this
                        // op or of a forget queued after it, so nobody
                        // writes it meanwhile.
                        let bytes = unsafe { std::slice::from_raw_parts(p, *size as usize) };
                        self.tier.put(key, *version, bytes).is_ok()
                    });
                    if !ok {
                        failed.push((key.clone(), *version));
                    }
                }
                LedgerOp::Promote {
                    offset,
                    version,
                    key,
                    size,
                } => {
                    let copied = self.segment_at(*offset, *size).is_some_and(|p| {
                        // SAFETY: the range lies inside the segment's
                        // mapping (checked), which lives as long as `self`;
                        // the master allocated it to this promotion and
                        // hands it to nobody else until the result is
                        // reported, so nobody else reads or writes it
                        // meanwhile.
                        let dst = unsafe { std::slice::from_raw_parts_mut(p, *size as usize) };
                        self.tier.read(key, *version, 0, dst).is_ok()
                    });
                    promoted.push((key.clone(), *version, *offset, copied));
                }
                LedgerOp::DiskForget { key, version } => {
                    self.tier.remove(key, *version);
                }
                LedgerOp::Commit(_) | LedgerOp::Forget { .. } | LedgerOp::Fetch { .. } => {}
            }
        }
        self.seal_in_background();
        (failed, promoted)
    }

    /// Tell the master how the promotions of a push went.
    pub(crate) fn report_promoted(&self, done: Vec<PromoteResult>) {
        let r = self.master.call(&MasterRequest::Promoted {
            client_id: self.client_id.clone(),
            segment_name: self.segment_name.clone(),
            done,
        });
        if !matches!(r, Ok(MasterResponse::Ok)) {
            tracing::warn!(result = ?r, "cannot tell the master about promoted disk copies");
        }
    }

    /// Seal the tier's full buckets on a thread of their own, one such
    /// thread at a time: a bucket's data sync takes as long as the device
    /// needs for the whole bucket, and the ledger stream (whose acks give
    /// evicted memory back to waiting writers) must not wait for it.
    fn seal_in_background(&self) {
        if !self.tier.has_full() || self.sealer_busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let tier = Arc::clone(&self.tier);
        let busy = Arc::clone(&self.sealer_busy);
        let spawned = std::thread::Builder::new()
            .name("mc-disk-seal".into())
            .spawn(move || loop {
                tier.seal_full();
                busy.store(false, Ordering::Release);
                // A bucket that filled while this one was sealed.
                if !tier.has_full() || busy.swap(true, Ordering::AcqRel) {
                    break;
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a thread to seal disk buckets; sealing here");
            self.sealer_busy.store(false, Ordering::Release);
            self.tier.seal_full();
        }
    }

    /// Read part of this tier's copy of `loc` into `dst`. A copy the
    /// master already lists may still be on its way to disk (the owner
    /// writes it when the eviction reaches it): a miss is retried for up to
    /// [`IN_FLIGHT_WAIT`].
    pub(crate) fn read_local(
        &self,
        loc: &DiskLoc,
        src: u64,
        dst: &mut [u8],
    ) -> std::result::Result<(), ErrorCode> {
        let deadline = std::time::Instant::now() + IN_FLIGHT_WAIT;
        let r = loop {
            match self.tier.read(&loc.key, loc.version, src, dst) {
                Err(OffloadError::NotFound { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                r => break r,
            }
        };
        r.map_err(|e| match e {
            OffloadError::NotFound { .. } | OffloadError::Corrupt { .. } => {
                ErrorCode::ObjectNotFound
            }
            OffloadError::Setup { .. } => ErrorCode::InvalidParams,
            _ => ErrorCode::InternalError,
        })
    }
}

/// The data server's view of a client's tier.
pub(crate) struct Served(pub(crate) Arc<Disk>);

impl DiskSource for Served {
    fn value_len(&self, key: &str, version: u64) -> Option<u64> {
        // A copy still on its way to disk is waited for, as in `read_local`.
        let deadline = std::time::Instant::now() + IN_FLIGHT_WAIT;
        loop {
            let found = self.0.tier.entries_of(key).filter(|e| e.version == version);
            if found.is_some() || std::time::Instant::now() >= deadline {
                return found.map(|e| e.size);
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    fn read_disk(
        &self,
        key: &str,
        version: u64,
        offset: u64,
        dst: &mut [u8],
    ) -> std::result::Result<(), ErrorCode> {
        self.0.remote_reads.fetch_add(1, Ordering::Relaxed);
        let loc = DiskLoc {
            key: key.to_string(),
            version,
            segment_name: String::new(),
            endpoint: String::new(),
        };
        self.0.read_local(&loc, offset, dst)
    }
}

/// Read part of the disk copy `loc` from its owner (another process).
pub(crate) fn read_remote(
    auth: Option<&AuthKey>,
    loc: &DiskLoc,
    src: u64,
    dst: &mut [u8],
) -> std::result::Result<(), ErrorCode> {
    TcpPool::global()
        .read_disk(&loc.endpoint, auth, &loc.key, loc.version, src, dst)
        .map_err(|e| {
            tracing::warn!(error = %e, "disk copy read failed");
            e.code()
        })
}
